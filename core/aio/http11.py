"""The asyncio twin of :mod:`core.http11`: one origin's kept-alive HTTP/1.1 connections, for
the async Table client (:mod:`core.tablestorage.aio.client`) and the agents' async HTTP
transport (:mod:`core.aio.http_transport`).

Hand-written in both forms (``devstack.unasync`` leaves it alone): this is where the sockets
are. Everything that does no I/O is the sync module's: the answer types, the errors, the
request's fields, the origin, the trust store, and the parsing of one exchange
(:class:`~core.http11.Exchange`), so both read and frame answers alike.

It behaves as the sync pool: at most ``max_connections`` requests at once; an idle connection
is taken last in, first out, unless it has been idle past the server's ``Keep-Alive: timeout``
(less a margin) or the server has closed it or written to it meanwhile; every failure raises
:class:`TransportError` with the sync pool's messages, ``reused`` when a connection that had
served an earlier request failed before any byte of the answer. The deadline differs in one
way: ``read_timeout`` bounds the whole exchange (``asyncio.timeout``), not each socket read.

A connection is an asyncio :class:`~asyncio.Protocol` rather than a stream pair: a
``StreamReader`` cannot say whether an idle connection holds bytes the server sent unasked
(e.g. a ``408`` before it closes), which must rule the connection out. Cancelling a request
closes its connection. The pool belongs to one event loop at a time: used from another loop
(each test has its own), it drops the idle connections of the previous one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Mapping, Sequence

from core.http11 import (
    MAX_HEAD_BYTES,
    READ_BYTES,
    Answer,
    Closed,
    Exchange,
    Failure,
    Headers,
    Sent,
    TransportError,
    connect_failure,
    failure,
    keep_alive_s,
    may_resend,
    parse_origin,
    request_fields,
    tls_context,
)

__all__ = [
    "MAX_HEAD_BYTES", "Answer", "ConnectionPool", "Failure", "Headers", "Sent", "TransportError",
    "may_resend",
]  # fmt: skip


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
