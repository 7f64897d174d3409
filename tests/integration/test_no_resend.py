"""No request is resent after it may have reached the server, unless resending it is safe.

A timed-out POST may still be processed by a slow server: sending it again would make the
remote service receive the call twice, and double the load exactly when a service struggles.
What may be resent: a request that never left (the connection was refused), an idempotent one
(GET, PUT, DELETE) after a read failure, and, for the agents' shared HTTP client, once, a
request on a kept-alive connection the server closed before answering (it closed that connection
as it was taken). The agents' shared HTTP client and the Table client (adapters.tables) are each
tried against a real server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from azure.core.exceptions import ServiceResponseError

from adapters.tables import TableService
from core.http_transport import PooledAsyncTransport
from tests.support.scripted_http import Reply, Script, ScriptedServer, answer

pytestmark = pytest.mark.anyio

_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], Any]]:
    servers: list[ScriptedServer] = []

    async def start(script: Script) -> ScriptedServer:
        server = await ScriptedServer(script).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


def agents_http() -> httpx.AsyncClient:
    """The agents' shared client, as the Runtime builds it."""
    return httpx.AsyncClient(http2=False, transport=PooledAsyncTransport())


def tables(origin: str, read_timeout: float) -> TableService:
    conn = f"AccountName=devstoreaccount1;AccountKey={_KEY};TableEndpoint={origin}/devstoreaccount1"
    return TableService.from_connection_string(conn, read_timeout=read_timeout)


def slow_after_first(delay: float) -> Script:
    """Answers the first request at once (a kept-alive connection), every later one after
    ``delay`` seconds."""

    async def script(request: bytes, n: int) -> Reply:
        if n > 1:
            await asyncio.sleep(delay)
        return answer(200), False

    return script


async def test_a_post_that_times_out_reaches_a_slow_server_once(serve) -> None:
    server = await serve(slow_after_first(1.5))
    async with agents_http() as http:
        await http.get(f"{server.origin}/health")
        with pytest.raises(httpx.ReadTimeout):
            await http.post(
                f"{server.origin}/charge",
                json={"amount": 1},
                headers={"Idempotency-Key": "order-1:charge:do:1"},
                timeout=1.0,
            )
        await asyncio.sleep(0.7)  # the server would have answered a resend by now
    assert server.methods() == ["GET", "POST"]


async def test_a_post_on_a_fresh_connection_that_times_out_is_sent_once(serve) -> None:
    server = await serve(_always_slow(1.5))
    async with agents_http() as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(f"{server.origin}/charge", json={}, timeout=1.0)
        await asyncio.sleep(0.7)
    assert server.methods() == ["POST"]


def _always_slow(delay: float) -> Script:
    async def script(request: bytes, n: int) -> Reply:
        await asyncio.sleep(delay)
        return answer(200), False

    return script


async def test_a_kept_alive_connection_closed_before_answering_is_retried_once(serve) -> None:
    server = await serve(lambda request, n: None if n == 2 else (answer(200), False))
    async with agents_http() as http:
        await http.get(f"{server.origin}/health")
        sent = await http.post(
            f"{server.origin}/charge",
            json={},
            headers={"Idempotency-Key": "order-1:charge:do:1"},
            timeout=2.0,
        )
    assert sent.status_code == 200
    assert server.methods() == ["GET", "POST", "POST"]
    assert server.connections == 2


async def test_a_table_batch_to_a_hung_endpoint_is_sent_once(serve) -> None:
    server = await serve(_always_slow(30))
    service = tables(server.origin, read_timeout=0.5)
    entity = {"PartitionKey": "p", "RowKey": "r", "Value": 1}
    with pytest.raises(ServiceResponseError):
        await service.get_table_client("orders").submit_transaction([("create", entity)])
    await service.close()
    assert server.methods() == ["POST"]


async def test_a_table_insert_that_times_out_is_sent_once(serve) -> None:
    server = await serve(slow_after_first(30))
    service = tables(server.origin, read_timeout=0.5)
    table = service.get_table_client("orders")
    await service.request("GET", "Tables")  # a kept-alive connection
    with pytest.raises(ServiceResponseError):
        await table.create_entity({"PartitionKey": "p", "RowKey": "r"})
    await service.close()
    assert server.methods() == ["GET", "POST"]


async def test_a_table_read_that_times_out_is_retried(serve) -> None:
    async def script(request: bytes, n: int) -> Reply:
        if n == 1:
            await asyncio.sleep(5)
        body = b'{"PartitionKey":"p","RowKey":"r"}'
        return answer(200, body, {"Content-Type": "application/json", "ETag": 'W/"1"'}), False

    server = await serve(script)
    service = tables(server.origin, read_timeout=0.3)
    entity = await service.get_table_client("orders").get_entity("p", "r")
    await service.close()
    assert entity["RowKey"] == "r"
    assert server.methods() == ["GET", "GET"]
