"""A small HTTP/1.1 connection pool for one origin: what the Table client needs.

Why not httpx here: measured against Azurite on this machine, a Table request through httpx's
transport costs about 0.5 ms of client CPU, most of it in httpcore's pool, locks and trace
hooks; h11 on a kept-alive socket costs about 0.17 ms, and an order makes four Table requests in
each host (docs/performance.md). The Table service needs none of what those layers add
(redirects, cookies, HTTP/2, proxies, streaming): one request and one whole answer at a time.
The protocol itself (framing, chunked bodies, 1xx answers, when a connection may be reused) is
h11's, the sans-I/O HTTP/1.1 implementation httpx runs on; this module owns only the sockets.

What it does: ``http`` and ``https`` (verified with the same trust store as httpx); a pool of
kept-alive connections, at most ``max_connections`` at once. A connection idle longer than the
server's ``Keep-Alive: timeout`` (less a margin), or one the server has closed or written to
while idle, is not reused. Every failure (refused, reset, timed out, closed early, malformed)
raises :class:`TransportError`; ``reused`` on it says the connection had served an earlier
request and the failure came before any byte of the answer, the signature of a server that
closed a kept-alive connection at the moment it was taken.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

import h11

MAX_HEAD_BYTES: Final = 16_384
"""The largest status line plus headers accepted (the Table service sends about 1 KiB)."""
_READ: Final = 65_536
_KEEP_ALIVE_MARGIN_S: Final = 1.0


class TransportError(Exception):
    """The exchange failed before a whole answer was read."""

    def __init__(self, message: str, *, reused: bool = False) -> None:
        super().__init__(message)
        self.reused = reused


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


class _Connection:
    """One socket and its HTTP/1.1 state (h11)."""

    __slots__ = ("answering", "idle_since", "keep_alive_s", "protocol", "served", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.protocol = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.served = 0  # answers read whole from this connection
        self.answering = False  # a byte of the current answer has arrived
        self.idle_since = 0.0
        self.keep_alive_s: float | None = None

    def usable(self, now: float) -> bool:
        """Still worth reusing: within the server's keep-alive time, and quiet (a readable
        idle socket means the server closed it or sent something unasked)."""
        if self.keep_alive_s is not None and now - self.idle_since > self.keep_alive_s:
            return False
        try:
            return not _readable(self.sock)
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def exchange(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes | None
    ) -> tuple[Answer, bool]:
        """Send one request and read its whole answer: (the answer, reusable afterwards)."""
        self.answering = False
        protocol = self.protocol
        try:
            data = protocol.send(h11.Request(method=method, target=target, headers=headers))
            if body:
                data += protocol.send(h11.Data(data=body))
            data += protocol.send(h11.EndOfMessage())
        except h11.LocalProtocolError as error:
            raise TransportError(f"cannot send this request: {error}") from None
        self.sock.sendall(data)
        response: h11.Response | None = None
        content: list[bytes] = []
        ended = False  # the server closed its end
        while True:
            try:
                event = protocol.next_event()
            except h11.RemoteProtocolError as error:
                if ended:
                    raise _Closed from None  # before the answer was whole
                raise TransportError(f"malformed answer: {error}") from None
            if event is h11.NEED_DATA:
                received = self.sock.recv(_READ)
                ended = not received
                self.answering = self.answering or not ended
                protocol.receive_data(received)
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                content.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise _Closed
        assert response is not None  # h11 ends a message only after its head
        reusable = protocol.our_state is h11.DONE and protocol.their_state is h11.DONE
        if reusable:
            protocol.start_next_cycle()
        answer_headers = Headers()
        for name, value in response.headers:
            key, text = name.decode("latin-1"), value.decode("latin-1")
            previous = dict.get(answer_headers, key)
            dict.__setitem__(
                answer_headers, key, text if previous is None else f"{previous}, {text}"
            )
        self.keep_alive_s = _keep_alive_s(answer_headers.get("keep-alive"))
        answer = Answer(
            response.status_code,
            response.reason.decode("latin-1"),
            answer_headers,
            b"".join(content),
        )
        return answer, reusable


class _Closed(Exception):
    """The server closed the connection."""


def _readable(sock: socket.socket) -> bool:
    """Whether ``sock`` has something to read (or its end) right now. ``poll`` where there is
    one: ``select`` refuses descriptors above 1023, which a busy process may hold."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def _keep_alive_s(text: str | None) -> float | None:
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


class ConnectionPool:
    """Kept-alive connections to one origin (``http[s]://host[:port]``). Thread-safe."""

    def __init__(
        self,
        origin: str,
        *,
        max_connections: int = 64,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) origin: {origin!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if self.scheme == "https" else 80)
        default_port = self.port == (443 if self.scheme == "https" else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._host_header = host if default_port else f"{host}:{self.port}"
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._ssl = ssl_context
        if self.scheme == "https" and self._ssl is None:
            import httpx  # the same trust store as the rest of the app's HTTPS calls

            self._ssl = httpx.create_ssl_context()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self._idle: list[_Connection] = []
        self._closed = False

    def request(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> Answer:
        """Send ``method target`` (the path and query, encoded) and read the whole answer."""
        fields = [("Host", self._host_header), *headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            fields.append(("Content-Length", str(len(body or b""))))
        if not self._slots.acquire(timeout=self._read_timeout):
            raise TransportError(f"no connection to {self.host} free within {self._read_timeout} s")
        try:
            connection = self._take()
            reused = connection.served > 0
            try:
                answer, reusable = connection.exchange(method, target, fields, body)
            except (OSError, _Closed, TransportError) as error:
                connection.close()
                raise _failure(error, method, target, reused and not connection.answering) from None
            connection.served += 1
            if reusable:
                self._give_back(connection)
            else:
                connection.close()
            return answer
        finally:
            self._slots.release()

    def _take(self) -> _Connection:
        now = time.monotonic()
        with self._lock:
            if self._closed:
                raise TransportError("the connection pool is closed")
            while self._idle:
                connection = self._idle.pop()
                if connection.usable(now):
                    return connection
                connection.close()
        return self._connect()

    def _connect(self) -> _Connection:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self._connect_timeout)
        except OSError as error:
            raise TransportError(f"cannot connect to {self.host}:{self.port}: {error}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(self._read_timeout)
        except OSError as error:
            sock.close()
            raise TransportError(f"cannot connect to {self.host}:{self.port}: {error}") from None
        return _Connection(sock)

    def _give_back(self, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
        with self._lock:
            if not self._closed:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        """Close the idle connections; those in use close when their answer is read."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


def _failure(error: BaseException, method: str, target: str, reused: bool) -> TransportError:
    if isinstance(error, _Closed):
        what = "the server closed the connection before answering in full"
    elif isinstance(error, TimeoutError | socket.timeout):
        what = "no answer within the read timeout"
    else:
        what = str(error) or type(error).__name__
    return TransportError(f"{method} {target.split('?', 1)[0]}: {what}", reused=reused)
