"""core.http_transport.PooledAsyncTransport under httpx's client, against a real local HTTP/1.1
server (a thread per connection): a JSON answer, the headers sent once each, the
Idempotency-Key, kept-alive reuse, Retry-After, gzip decoded by the client, timeouts, a refused
connection, an oversized answer, a kept-alive connection closed as it was taken, and which
transport the Runtime's ``http`` client gets."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from core import httpx_exchange, runtime
from core.http_transport import PooledAsyncTransport
from core.settings import Settings
from tests.unit.test_runtime import app_env

pytestmark = pytest.mark.anyio


@dataclass
class Seen:
    """What the server received."""

    connections: int = 0
    requests: list[tuple[str, str, list[tuple[str, str]], bytes]] = field(default_factory=list)


def make_handler(seen: Seen) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive

        def setup(self) -> None:
            super().setup()
            seen.connections += 1
            self.served = 0

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            self.served += 1
            seen.requests.append((self.command, self.path, list(self.headers.items()), body))
            path = self.path.split("?", 1)[0]
            if path == "/drop-second" and self.served == 2:
                self.close_connection = True  # read the request, close without answering
                return
            if path == "/slow":
                time.sleep(1.0)
            if path == "/big":
                self._answer(200, b"x" * 5000)
            elif path == "/busy":
                self._answer(503, b'{"error": "busy"}', {"Retry-After": "7"})
            elif path == "/gzip":
                self._answer(200, gzip.compress(b'{"zipped": true}'), {"Content-Encoding": "gzip"})
            else:
                answer = {"path": self.path, "method": self.command, "body": body.decode()}
                self._answer(200, json.dumps(answer).encode())

        do_GET = do_POST = do_PUT = _handle

    return Handler


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (timed out, refused a long answer): nothing to report


@pytest.fixture
def server() -> Iterator[tuple[str, Seen]]:
    seen = Seen()
    httpd = QuietServer(("127.0.0.1", 0), make_handler(seen))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def refused_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def names(headers: list[tuple[str, str]]) -> list[str]:
    return [name.lower() for name, _ in headers]


KEY = {"Idempotency-Key": "k-1"}


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        transport=PooledAsyncTransport(max_body_bytes=1000), timeout=2.0
    ) as c:
        yield c


async def test_a_json_post_is_answered_and_its_headers_are_sent_once(
    client: httpx.AsyncClient, server: tuple[str, Seen]
) -> None:
    url, seen = server
    answer = await client.post(f"{url}/op?x=1%202", json={"a": 1}, headers=KEY)
    assert answer.status_code == 200 and answer.reason_phrase == "OK"
    assert answer.http_version == "HTTP/1.1"
    assert answer.json() == {"path": "/op?x=1%202", "method": "POST", "body": '{"a":1}'}
    assert answer.headers["content-type"] == "application/json"
    [(_, _, headers, body)] = seen.requests
    sent = names(headers)
    for name in ("host", "content-length", "content-type", "idempotency-key", "user-agent"):
        assert sent.count(name) == 1, name
    assert "transfer-encoding" not in sent
    assert dict(headers)["Idempotency-Key"] == "k-1"
    assert dict(headers)["Host"] == url.removeprefix("http://")
    assert dict(headers)["Content-Length"] == str(len(body))


async def test_connections_are_kept_alive_and_reused(
    client: httpx.AsyncClient, server: tuple[str, Seen]
) -> None:
    url, seen = server
    for i in range(5):
        assert (await client.post(f"{url}/op", content=b"", headers=KEY)).status_code == 200, i
    assert (await client.get(f"{url}/get")).json()["method"] == "GET"
    assert seen.connections == 1 and len(seen.requests) == 6
    assert dict(seen.requests[0][2])["Content-Length"] == "0"  # a POST without a body says 0


async def test_retry_after_is_visible_and_gzip_is_decoded(
    client: httpx.AsyncClient, server: tuple[str, Seen]
) -> None:
    url, _ = server
    busy = await client.post(f"{url}/busy", json={}, headers=KEY)
    assert busy.status_code == 503 and busy.headers["Retry-After"] == "7"
    assert busy.json() == {"error": "busy"}
    assert (await client.get(f"{url}/gzip")).json() == {"zipped": True}
    async with client.stream("POST", f"{url}/op", json={"s": 1}) as streamed:
        assert b"".join([chunk async for chunk in streamed.aiter_bytes()])  # as the agent reads


async def test_no_answer_in_time_is_a_read_timeout(
    client: httpx.AsyncClient, server: tuple[str, Seen]
) -> None:
    url, _ = server
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout, match="read timeout"):
        await client.post(f"{url}/slow", json={}, headers=KEY, timeout=0.2)
    assert time.monotonic() - started < 0.9
    assert (await client.post(f"{url}/op", json={})).status_code == 200  # a new connection


async def test_a_refused_connection_is_a_connect_error(
    client: httpx.AsyncClient, refused_url: str
) -> None:
    with pytest.raises(httpx.ConnectError, match="cannot connect"):
        await client.post(f"{refused_url}/op", json={})


async def test_an_oversized_answer_is_refused_and_its_connection_dropped(
    client: httpx.AsyncClient, server: tuple[str, Seen]
) -> None:
    url, seen = server
    with pytest.raises(httpx.ReadError, match="exceeds 1000 bytes"):
        await client.get(f"{url}/big")
    assert (await client.get(f"{url}/get")).status_code == 200
    assert seen.connections == 2


async def test_a_kept_alive_connection_closed_as_taken_is_retried_when_replayable(
    client: httpx.AsyncClient, server: tuple[str, Seen]
) -> None:
    url, seen = server
    assert (await client.post(f"{url}/drop-second", json={}, headers=KEY)).status_code == 200
    assert (await client.post(f"{url}/drop-second", json={}, headers=KEY)).status_code == 200
    assert seen.connections == 2 and len(seen.requests) == 3
    with pytest.raises(httpx.RemoteProtocolError, match="closed the connection"):
        await client.post(f"{url}/drop-second", json={})  # no Idempotency-Key: not replayed
    assert seen.connections == 2 and len(seen.requests) == 4


async def test_one_pool_per_origin_the_oldest_closed_past_the_bound(
    server: tuple[str, Seen],
) -> None:
    url, _ = server
    transport = PooledAsyncTransport(max_origins=1)
    async with httpx.AsyncClient(transport=transport) as c:
        first = (await c.get(f"{url}/a")).request
        other = url.replace("127.0.0.1", "localhost")
        assert (await c.get(f"{other}/b")).status_code == 200
        assert list(transport._pools) == [httpx_exchange.origin_key(httpx.URL(other))]
        assert (await c.get(f"{url}/c")).status_code == 200  # a new pool for the first origin
        assert httpx_exchange.origin_text(first.url) == url
    assert transport._pools == {}
    with pytest.raises(httpx.UnsupportedProtocol):
        httpx_exchange.origin_key(httpx.URL("ftp://example.com/x"))


def test_errors_map_every_kind() -> None:
    from typing import get_args

    from core.http11 import Failure

    assert set(httpx_exchange.ERRORS) == set(get_args(Failure))


# --- several exchanges on one client -----------------------------------------------------------


@contextlib.asynccontextmanager
async def pooled_client(**options: Any) -> Any:
    transport = PooledAsyncTransport(max_body_bytes=1000, **options)
    async with httpx.AsyncClient(transport=transport, timeout=2.0) as c:
        yield c


async def test_posts_streams_and_gets_share_one_connection(server: tuple[str, Seen]) -> None:
    url, seen = server
    async with pooled_client() as c:
        answer = await c.post(f"{url}/op", json={"a": 1}, headers=KEY)
        assert answer.json() == {"path": "/op", "method": "POST", "body": '{"a":1}'}
        for _ in range(3):
            async with c.stream("POST", f"{url}/op", json={}, headers=KEY) as streamed:
                assert b"".join([chunk async for chunk in streamed.aiter_bytes()])
        busy = await c.post(f"{url}/busy", json={}, headers=KEY)
        assert busy.status_code == 503 and busy.headers["Retry-After"] == "7"
        gzipped = await c.get(f"{url}/gzip")
        assert gzipped.json() == {"zipped": True}
    assert seen.connections == 1 and len(seen.requests) == 6
    headers = seen.requests[0][2]
    for name in ("host", "content-length", "content-type", "idempotency-key"):
        assert names(headers).count(name) == 1, name
    assert dict(headers)["Idempotency-Key"] == "k-1"


async def test_a_timeout_a_refusal_and_an_oversized_answer_on_one_client(
    server: tuple[str, Seen], refused_url: str
) -> None:
    url, seen = server
    async with pooled_client() as c:
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout, match="read timeout"):
            await c.post(f"{url}/slow", json={}, headers=KEY, timeout=0.2)
        assert time.monotonic() - started < 0.9
        with pytest.raises(httpx.ConnectError, match="cannot connect"):
            await c.post(f"{refused_url}/op", json={})
        with pytest.raises(httpx.ReadError, match="exceeds 1000 bytes"):
            await c.get(f"{url}/big")
        assert (await c.get(f"{url}/get")).status_code == 200
    assert seen.connections == 3  # timed out, oversized: both connections dropped


async def test_connect_timeout_is_the_requests(
    server: tuple[str, Seen], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = server
    loop = asyncio.get_running_loop()

    async def unanswered(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(5)  # a SYN nobody answers

    monkeypatch.setattr(loop, "create_connection", unanswered)
    async with pooled_client() as c:
        started = time.monotonic()
        with pytest.raises(httpx.ConnectTimeout, match=r"cannot connect .* timed out"):
            await c.get(f"{url}/x", timeout=httpx.Timeout(2.0, connect=0.1))
        assert time.monotonic() - started < 1.0


async def test_a_reused_connection_closed_as_taken_is_replayed_for_a_put(
    server: tuple[str, Seen],
) -> None:
    url, seen = server
    async with pooled_client() as c:
        assert (await c.put(f"{url}/drop-second", json={})).status_code == 200
        assert (await c.put(f"{url}/drop-second", json={})).status_code == 200  # PUT: replayed
        assert seen.connections == 2 and len(seen.requests) == 3
        with pytest.raises(httpx.RemoteProtocolError, match="closed the connection"):
            await c.post(f"{url}/drop-second", json={})  # no Idempotency-Key: not replayed
    assert seen.connections == 2 and len(seen.requests) == 4


async def test_close_closes_the_pools(server: tuple[str, Seen]) -> None:
    url, _ = server
    transport = PooledAsyncTransport()
    async with httpx.AsyncClient(transport=transport) as c:
        await c.get(f"{url}/a")
        [pool] = transport._pools.values()
    assert transport._pools == {} and pool._closed


# --- the Runtime's client ---------------------------------------------------------------------


async def test_the_runtime_client_runs_on_the_pools_unless_a_proxy_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("all_proxy", raising=False)
    settings = Settings.from_env(app_env())
    rt = runtime.Runtime.from_settings(settings)
    assert isinstance(rt.http._transport, PooledAsyncTransport)
    await rt.close()

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert httpx_exchange.proxied_by_env()
    proxied = runtime.Runtime.from_settings(settings)
    assert isinstance(proxied.http._transport, httpx.AsyncHTTPTransport)
    assert any(t is not None for t in proxied.http._mounts.values())  # httpx mounted the proxy
    await proxied.close()
