"""A small HTTP/1.1 connection pool for one origin: what the Table client and the agents'
HTTP transport (core.http_transport) need.

Why not httpx here: measured against Azurite on this machine, a Table request through httpx's
transport costs about 0.5 ms of client CPU, most of it in httpcore's pool, locks and trace
hooks; a kept-alive socket of this pool costs a fraction of that, and an order makes four Table
requests in each host (docs/performance.md). The Table service needs none of what those layers
add (redirects, cookies, HTTP/2, proxies, streaming): one request and one whole answer at a
time. Answers are parsed by httptools (llhttp, Node.js's HTTP parser, in C): h11, which httpx
runs on, took 0.1 ms of pure-Python work per exchange. A request is a head of validated fields
and a body of known length, written here.

What it does: ``http`` and ``https`` (verified with the same trust store as httpx); a pool of
kept-alive connections, at most ``max_connections`` at once. A connection idle longer than the
server's ``Keep-Alive: timeout`` (less a margin), or one the server has closed or written to
while idle, is not reused. Every failure (refused, reset, timed out, closed early, malformed)
raises :class:`TransportError`; ``reused`` on it says the connection had served an earlier
request and the server closed or reset it before any byte of the answer, the signature of a
server that closed a kept-alive connection at the moment it was taken. A timeout is never
``reused``: the server may be processing the request, and it must not be sent again unless it
is idempotent (:func:`may_resend`).

Each connection is an asyncio :class:`~asyncio.Protocol` (:class:`_Socket`): a
``StreamReader`` cannot say whether an idle connection holds bytes the server sent unasked
(e.g. a ``408`` before it closes), which must rule the connection out. ``read_timeout`` bounds
the whole exchange. Cancelling a request closes its connection. The pool belongs to one event
loop at a time: used from another loop (each test has its own), it drops the idle connections
of the previous one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import urlsplit

import httptools

MAX_HEAD_BYTES: Final = 16_384
"""The largest status line plus headers accepted (the Table service sends about 1 KiB)."""
READ_BYTES: Final = 65_536
"""The most bytes given to the parser at once: a head past MAX_HEAD_BYTES is refused as it
arrives."""
_KEEP_ALIVE_MARGIN_S: Final = 1.0


Failure = Literal[
    "connect", "connect_timeout", "pool_timeout", "timeout", "closed", "protocol", "send",
    "too_large", "pool_closed", "io",
]  # fmt: skip
"""What went wrong, for a caller that maps failures to its own errors (core.http_transport):
cannot connect (or not in time), no connection free in time, no whole answer in time, the
server closed the connection early, a malformed answer, a request that cannot be sent, an answer
longer than the caller's limit, the pool closed, another socket error."""


class TransportError(Exception):
    """The exchange failed before a whole answer was read."""

    def __init__(self, message: str, *, reused: bool = False, kind: Failure = "io") -> None:
        super().__init__(message)
        self.reused = reused
        self.kind: Failure = kind


@dataclass(frozen=True)
class Sent:
    """One HTTP attempt, as the Table client's request hook sees it."""

    method: str
    url: str
    batch_urls: tuple[str, ...] = field(default=())
    """The operations' URLs, for a transaction."""


class Headers(dict[str, str]):
    """An answer's headers: names lower-cased, looked up in any case; repeated headers
    joined with ", " (as httpx does)."""

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)


class Answer:
    """One whole HTTP answer."""

    __slots__ = ("content", "headers", "reason_phrase", "status_code")

    def __init__(
        self, status_code: int, reason_phrase: str, headers: Headers, content: bytes
    ) -> None:
        self.status_code = status_code
        self.reason_phrase = reason_phrase
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)

    def __repr__(self) -> str:
        return f"<Answer {self.status_code} {self.reason_phrase}>"


class Exchange:
    """One request and its answer, without I/O: :meth:`start` gives the bytes to send, then
    :meth:`advance` says whether the answer is whole, each time after the bytes received are
    given to :meth:`feed` (``b""``: the server closed its end), and :meth:`finish` gives the
    answer. Shared by the socket and the asyncio connections.

    The answer is read by httptools (llhttp, the parser Node.js runs): chunked and
    length-delimited bodies, informational (1xx) answers skipped, and whether the server keeps
    the connection. What llhttp leaves to its caller is here: the head's size limit, a body
    delimited by the connection's end, the answer to a HEAD (never reused: llhttp cannot be told
    that it has no body), and bytes after the answer (the connection is not reused then)."""

    __slots__ = (
        "answering", "content", "ended", "extra", "failure", "head_bytes", "head_done",
        "head_request", "headers", "informational", "keep_alive", "max_body_bytes", "parser",
        "reason", "size", "status", "until_close", "whole",
    )  # fmt: skip

    def __init__(self, max_body_bytes: int | None = None) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.max_body_bytes = max_body_bytes  # a longer body fails the exchange
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.content: list[bytes] = []
        self.size = 0  # bytes of the answer's body so far
        self.head_bytes = 0  # bytes received before the head was whole
        self.head_done = False  # the final (not 1xx) answer's head has been read
        self.informational = False  # the message being read is a 1xx answer
        self.head_request = False
        self.until_close = False  # the body ends where the connection does
        self.keep_alive = False
        self.whole = False  # the answer is whole
        self.extra = False  # bytes came after the answer
        self.ended = False  # the server closed its end
        self.answering = False  # a byte of the answer has arrived
        self.failure: TransportError | None = None

    def start(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes | None
    ) -> bytes:
        if not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target):
            raise TransportError(
                f"cannot send this request: bad method {method!r} or target {target!r}",
                kind="send",
            )
        self.head_request = method == "HEAD"
        lines = [f"{method} {target} HTTP/1.1"]
        for name, value in headers:
            value = str(value).strip(" \t")
            if not _TOKEN.fullmatch(name) or not _FIELD_VALUE.fullmatch(value):
                raise TransportError(
                    f"cannot send this request: bad header field {name!r}: {value!r}",
                    kind="send",
                )
            lines.append(f"{name}: {value}")
        lines.append("\r\n")
        try:
            head = "\r\n".join(lines).encode("ascii")
        except UnicodeEncodeError as error:
            raise TransportError(f"cannot send this request: {error}", kind="send") from None
        return head + body if body else head

    def feed(self, received: bytes) -> None:
        self.ended = not received
        self.answering = self.answering or not self.ended
        if self.ended:
            if self.head_done and self.until_close and not self.whole:
                self.whole = True  # a body delimited by the connection's end is over
            return
        if not self.head_done:
            self.head_bytes += len(received)
        try:
            self.parser.feed_data(received)
        except httptools.HttpParserError as error:
            if self.whole:
                self.extra = True
            elif self.failure is None:
                self.failure = TransportError(f"malformed answer: {error}", kind="protocol")

    def advance(self) -> bool:
        """Whether the answer is whole (False: more bytes are needed), after what was fed.
        Raises :class:`Closed` or :class:`TransportError`."""
        if self.failure is not None and not (self.ended and self.failure.kind == "protocol"):
            raise self.failure
        if self.whole:
            return True
        if self.ended:
            raise Closed  # before the answer was whole
        if not self.head_done and self.head_bytes > MAX_HEAD_BYTES:
            raise TransportError(
                f"malformed answer: its head is longer than {MAX_HEAD_BYTES} bytes",
                kind="protocol",
            )
        return False

    def finish(self) -> tuple[Answer, bool]:
        """The whole answer, and whether the connection may serve another request."""
        answer_headers = Headers()
        for name, value in self.headers:
            key, text = name.decode("latin-1").lower(), value.decode("latin-1").strip(" \t")
            previous = dict.get(answer_headers, key)
            dict.__setitem__(
                answer_headers, key, text if previous is None else f"{previous}, {text}"
            )
        answer = Answer(
            self.status, self.reason.decode("latin-1"), answer_headers, b"".join(self.content)
        )
        reusable = (
            self.keep_alive and not self.until_close and not self.head_request and not self.extra
        )
        return answer, reusable

    # httptools' callbacks

    def on_message_begin(self) -> None:
        if self.whole:
            self.extra = True

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.whole:
            return
        status = self.parser.get_status_code()
        if status < 200:  # 100 Continue and the like: the answer proper follows
            self.informational = True
            self.headers.clear()
            self.reason = b""
            return
        self.head_done = True
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()
        names = {name.lower() for name, _ in self.headers}
        self.until_close = (
            status not in (204, 304)
            and b"content-length" not in names
            and b"transfer-encoding" not in names
        )
        if self.head_request:
            self.whole = True  # an answer to HEAD has no body, whatever its head says

    def on_body(self, body: bytes) -> None:
        if self.whole or self.failure is not None:
            return
        self.size += len(body)
        if self.max_body_bytes is not None and self.size > self.max_body_bytes:
            self.failure = TransportError(
                f"answer exceeds {self.max_body_bytes} bytes", kind="too_large"
            )
            return
        self.content.append(body)

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
        elif not self.whole:
            self.whole = True
            self.keep_alive = self.keep_alive and self.parser.should_keep_alive()


_TOKEN: Final = re.compile(r"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_TARGET: Final = re.compile(r"[\x21-\x7e]+")
_FIELD_VALUE: Final = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*")
"""A field value: no control character but horizontal tab (so no CR or LF)."""


class Closed(Exception):
    """The server closed the connection."""


def keep_alive_s(text: str | None) -> float | None:
    """How long the server keeps an idle connection (``Keep-Alive: timeout=5``), less a margin
    so that it is not taken just as the server closes it; None when the server does not say."""
    if not text:
        return None
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip().lower() == "timeout":
            try:
                seconds = float(value.strip())
            except ValueError:
                return None
            return max(0.0, seconds - min(_KEEP_ALIVE_MARGIN_S, seconds / 4))
    return None


def parse_origin(origin: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, Host header) of ``http[s]://host[:port]``; ValueError otherwise."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) origin: {origin!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    default_port = port == (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return parts.scheme, parts.hostname, port, host if default_port else f"{host}:{port}"


def tls_context(scheme: str, given: ssl.SSLContext | None) -> ssl.SSLContext | None:
    """The context an https origin is verified with: ``given``, or httpx's default."""
    if scheme != "https" or given is not None:
        return given
    import httpx  # the same trust store as the rest of the app's HTTPS calls

    return httpx.create_ssl_context()


def request_fields(
    host_header: str,
    method: str,
    headers: Mapping[str, str] | Sequence[tuple[str, str]],
    body: bytes | None,
) -> list[tuple[str, str]]:
    """The request's header fields: Host, ``headers`` (a mapping, or pairs in order, which may
    repeat a name), and the body's length when it has one (or when the method expects one: a
    POST without a body says 0)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    fields = [("Host", host_header), *pairs]
    if body is not None or method in ("POST", "PUT", "PATCH"):
        fields.append(("Content-Length", str(len(body or b""))))
    return fields


def failure(error: BaseException, method: str, target: str, reused: bool) -> TransportError:
    """The error for an exchange that failed. ``reused``: the connection had served an earlier
    request and no byte of this answer had arrived. It stays set on the error only when the
    server closed or reset the connection, the signature of a kept-alive connection closed as
    it was taken; never after a timeout, when the server may be processing the request."""
    stale = reused and isinstance(error, Closed | ConnectionResetError | BrokenPipeError)
    kind: Failure = "io"
    if isinstance(error, Closed):
        what, kind = "the server closed the connection before answering in full", "closed"
    elif isinstance(error, TimeoutError | socket.timeout):
        what, kind = "no answer within the read timeout", "timeout"
    else:
        what = str(error) or type(error).__name__
        if isinstance(error, TransportError):
            kind = error.kind
    return TransportError(f"{method} {target.split('?', 1)[0]}: {what}", reused=stale, kind=kind)


NOT_SENT: Final[frozenset[Failure]] = frozenset({"connect", "connect_timeout", "pool_timeout"})
"""Failures before any byte of the request left: resending it is always safe."""
IDEMPOTENT: Final = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
"""Methods whose repetition has the effect of one request (RFC 9110 9.2.2; azure-core's retry
policy resends only these after a read failure)."""


def may_resend(method: str, error: TransportError) -> bool:
    """Whether a request that failed with ``error`` may be sent again: it never left, its
    kept-alive connection was closed as it was taken, or its method is idempotent. A POST or
    MERGE that timed out or lost its connection after it was sent may have been applied."""
    return error.kind in NOT_SENT or error.reused or method.upper() in IDEMPOTENT


def connect_failure(host: str, port: int, error: OSError) -> TransportError:
    """The error for a connection not made: refused, unreachable, TLS refused, timed out."""
    timed_out = isinstance(error, TimeoutError | socket.timeout)
    reason = str(error) or "timed out"
    return TransportError(
        f"cannot connect to {host}:{port}: {reason}",
        kind="connect_timeout" if timed_out else "connect",
    )


class _Socket(asyncio.Protocol):
    """What a connection has received and whether it has ended, for :meth:`read`."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.ended = False  # the server closed its end, or the connection was lost
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False  # nothing more to send either: close

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    @property
    def quiet(self) -> bool:
        """Nothing received and not ended: an idle connection worth reusing."""
        return not self.buffer and not self.ended

    async def read(self) -> bytes:
        """What has arrived (waiting for something), or ``b""`` once the server has closed its
        end; the error that broke the connection, if one did."""
        while not self.buffer and not self.ended:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self.buffer:  # at most READ_BYTES, as the sync pool's recv
            data = bytes(self.buffer[:READ_BYTES])
            del self.buffer[:READ_BYTES]
            return data
        if self.error is not None:
            raise self.error
        return b""


class _Connection:
    """One transport, kept alive."""

    __slots__ = (
        "current", "idle_since", "keep_alive_s", "loop", "served", "socket", "transport",
    )  # fmt: skip

    def __init__(
        self, transport: asyncio.Transport, socket: _Socket, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.transport = transport
        self.socket = socket
        self.loop = loop
        self.served = 0  # answers read whole from this connection
        self.current: Exchange | None = None
        self.idle_since = 0.0
        self.keep_alive_s: float | None = None

    @property
    def answering(self) -> bool:
        """A byte of the current answer has arrived."""
        return self.current is not None and self.current.answering

    def usable(self, now: float) -> bool:
        """Still worth reusing: within the server's keep-alive time, and quiet (the server has
        neither closed it nor sent something unasked)."""
        if self.keep_alive_s is not None and now - self.idle_since > self.keep_alive_s:
            return False
        return self.socket.quiet and not self.transport.is_closing()

    def close(self) -> None:
        """Close at once (``abort``): nothing is owed to a server we stop talking to."""
        with contextlib.suppress(RuntimeError):  # its event loop is closed: nothing to do
            self.transport.abort()

    async def exchange(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes | None,
        max_body_bytes: int | None = None,
    ) -> tuple[Answer, bool]:
        """Send one request and read its whole answer: (the answer, reusable afterwards)."""
        exchange = self.current = Exchange(max_body_bytes)
        self.transport.write(exchange.start(method, target, headers, body))
        while not exchange.advance():
            exchange.feed(await self.socket.read())
        answer, reusable = exchange.finish()
        self.keep_alive_s = keep_alive_s(answer.headers.get("keep-alive"))
        return answer, reusable


class ConnectionPool:
    """Kept-alive connections to one origin (``http[s]://host[:port]``), on one event loop."""

    def __init__(
        self,
        origin: str,
        *,
        max_connections: int = 64,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.scheme, self.host, self.port, self._host_header = parse_origin(origin)
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._ssl = tls_context(self.scheme, ssl_context)
        self._max_connections = max_connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._closed = False

    async def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str] | Sequence[tuple[str, str]],
        body: bytes | None = None,
        *,
        connect_timeout: float | None = None,
        read_timeout: float | None = None,
        max_body_bytes: int | None = None,
    ) -> Answer:
        """Send ``method target`` (the path and query, encoded) and read the whole answer.

        ``connect_timeout``, ``read_timeout``: this request's, instead of the pool's;
        ``max_body_bytes``: a longer answer fails (``kind="too_large"``) rather than being
        buffered whole. ``headers`` must not include Host or Content-Length: the pool sets them.
        """
        fields = request_fields(self._host_header, method, headers, body)
        read_s = self._read_timeout if read_timeout is None else read_timeout
        slots = self._bind()
        try:
            async with asyncio.timeout(read_s):
                await slots.acquire()
        except TimeoutError:
            raise TransportError(
                f"no connection to {self.host} free within {read_s} s", kind="pool_timeout"
            ) from None
        try:
            connection = await self._take(connect_timeout)
            reused = connection.served > 0
            try:
                async with asyncio.timeout(read_s):
                    answer, reusable = await connection.exchange(
                        method, target, fields, body, max_body_bytes
                    )
            except (OSError, Closed, TransportError) as error:  # TimeoutError is an OSError
                connection.close()
                raise failure(error, method, target, reused and not connection.answering) from None
            except BaseException:  # cancelled: the rest of the answer would confuse the next
                connection.close()
                raise
            connection.served += 1
            if reusable:
                self._give_back(connection)
            else:
                connection.close()
            return answer
        finally:
            slots.release()

    def _bind(self) -> asyncio.Semaphore:
        """The slots of the running loop; a new loop drops the previous one's connections."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._loop is not None:
                idle, self._idle = self._idle, []
                for connection in idle:
                    connection.close()
                self._slots = asyncio.Semaphore(self._max_connections)
            self._loop = loop
        return self._slots

    async def _take(self, connect_timeout: float | None = None) -> _Connection:
        if self._closed:
            raise TransportError("the connection pool is closed", kind="pool_closed")
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if connection.usable(now):
                return connection
            connection.close()
        return await self._connect(connect_timeout)

    async def _connect(self, connect_timeout: float | None = None) -> _Connection:
        loop = asyncio.get_running_loop()
        timeout = self._connect_timeout if connect_timeout is None else connect_timeout
        try:
            async with asyncio.timeout(timeout):
                transport, socket = await loop.create_connection(
                    _Socket,
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                )
        except OSError as error:  # refused, unreachable, TLS refused, timed out
            raise connect_failure(self.host, self.port, error) from None
        assert isinstance(transport, asyncio.Transport)
        return _Connection(transport, socket, loop)

    def _give_back(self, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
        if not self._closed and connection.loop is self._loop:
            self._idle.append(connection)
            return
        connection.close()

    async def close(self) -> None:
        """Close the idle connections; those in use close when their answer is read."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
