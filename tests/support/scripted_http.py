"""A real HTTP/1.1 server on 127.0.0.1, started in a test, that answers from a script and
records every request it receives: for tests of what the app's HTTP clients send, how often,
and with which headers (a resend, a retry, a ``traceparent``).

The script gets the raw request and its number (1-based, across connections) and returns the
bytes to write back (or an async iterator of them, written as each comes: an answer that
trickles) and whether to close afterwards, or None to close without answering; it may be a
coroutine (a slow or hung server sleeps in it). :func:`scripted_servers` starts them for one
test and closes them at its end (a test's ``serve`` fixture); :func:`replies` and :func:`slow` are
the scripts several files use.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

Reply = tuple[bytes | AsyncIterator[bytes], bool] | None
Script = Callable[[bytes, int], Reply | Awaitable[Reply]]


def answer(status: int = 200, body: bytes = b"{}", headers: dict[str, str] | None = None) -> bytes:
    """An HTTP/1.1 answer with a Content-Length."""
    head = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@dataclass
class ScriptedServer:
    script: Script
    tls: ssl.SSLContext | None = None
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def start(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def origin(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def methods(self) -> list[str]:
        return [request.split(b" ", 1)[0].decode() for request in self.requests]

    def headers(self, n: int) -> dict[str, str]:
        """The headers of request ``n`` (1-based), names lower-cased."""
        head = self.requests[n - 1].split(b"\r\n\r\n", 1)[0].decode("latin-1")
        found: dict[str, str] = {}
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            found[name.strip().lower()] = value.strip()
        return found

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                reply = self.script(request, len(self.requests))
                if inspect.isawaitable(reply):
                    reply = await reply
                if reply is None:
                    return
                data, close = reply
                if isinstance(data, bytes):
                    writer.write(data)
                    await writer.drain()
                else:
                    async for part in data:
                        writer.write(part)
                        await writer.drain()
                if close:
                    return
        except (asyncio.IncompleteReadError, asyncio.CancelledError, ConnectionError, ssl.SSLError):
            return
        finally:
            writer.close()

    async def close(self) -> None:
        for writer in self._writers:
            writer.close()
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1)


class Serve(Protocol):
    async def __call__(
        self, script: Script, tls: ssl.SSLContext | None = None
    ) -> ScriptedServer: ...


@contextlib.asynccontextmanager
async def scripted_servers() -> AsyncIterator[Serve]:
    """Starts a server for each ``script`` it is given (over TLS with ``tls``) and closes them
    all on leaving."""
    servers: list[ScriptedServer] = []

    async def serve(script: Script, tls: ssl.SSLContext | None = None) -> ScriptedServer:
        server = await ScriptedServer(script, tls=tls).start()
        servers.append(server)
        return server

    try:
        yield serve
    finally:
        for server in servers:
            await server.close()


def replies(*answers: bytes | None) -> Script:
    """Answers in turn; the last one again for every later request (None: close unanswered)."""

    def script(request: bytes, n: int) -> Reply:
        reply = answers[min(n, len(answers)) - 1]
        return None if reply is None else (reply, False)

    return script


def slow(delay: float, after: int = 0) -> Script:
    """Answers the first ``after`` requests at once (a kept-alive connection), every later one
    after ``delay`` seconds."""

    async def script(request: bytes, n: int) -> Reply:
        if n > after:
            await asyncio.sleep(delay)
        return answer(200), False

    return script
