"""No request is resent after it may have reached the server, unless resending it is safe.

A timed-out POST may still be processed by a slow server: sending it again would make the
remote service receive the call twice, and double the load exactly when a service struggles.
What may be resent: a request that never left (the connection was refused), and an idempotent
one (GET, PUT, DELETE) after a read failure. A POST on a kept-alive connection the server closed
before answering is not resent either (the server may have acted on it): the agent's remote
client decides whether to call again, with the same Idempotency-Key, and a Table write fails to
the store's caller. The agents' remote HTTP (adapters.remote_http) and the Table client
(adapters.tables) are each tried against a real server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from azure.core.exceptions import ServiceResponseError

from adapters.remote_http import CallFailed, CallTimedOut, RemoteHttp, RemoteService
from adapters.tables import TableService
from tests.support.scripted_http import Reply, Serve, answer, scripted_servers, slow

pytestmark = pytest.mark.anyio

_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    async with scripted_servers() as start:
        yield start


def agents_http(origin: str) -> RemoteHttp:
    """The agents' remote HTTP, as the Runtime builds it, with a service at ``origin``."""
    return RemoteHttp([RemoteService("payment", f"{origin}/payment")])


KEY = {"Idempotency-Key": "order-1:charge:do:1", "Content-Type": "application/json"}


def tables(origin: str, read_timeout: float) -> TableService:
    conn = f"AccountName=devstoreaccount1;AccountKey={_KEY};TableEndpoint={origin}/devstoreaccount1"
    return TableService.from_connection_string(conn, read_timeout=read_timeout)


async def test_a_post_that_times_out_reaches_a_slow_server_once(serve) -> None:
    server = await serve(slow(1.5, after=1))
    http = agents_http(server.origin)
    await http.post("payment", "health", b"{}", KEY)  # a kept-alive connection
    with pytest.raises(CallTimedOut):
        await http.post("payment", "charge", b'{"amount":1}', KEY, timeout=1.0)
    await asyncio.sleep(0.7)  # the server would have answered a resend by now
    await http.close()
    assert server.methods() == ["POST", "POST"]
    assert server.requests[1].startswith(b"POST /payment/charge ")


async def test_a_post_on_a_fresh_connection_that_times_out_is_sent_once(serve) -> None:
    server = await serve(slow(1.5))
    http = agents_http(server.origin)
    with pytest.raises(CallTimedOut):
        await http.post("payment", "charge", b"{}", KEY, timeout=1.0)
    await asyncio.sleep(0.7)
    await http.close()
    assert server.methods() == ["POST"]


async def test_a_post_on_a_kept_alive_connection_closed_before_answering_is_not_resent(
    serve,
) -> None:
    """The server read the POST and closed: it may have acted on it. The next call (the remote
    client's next attempt) goes on a new connection."""
    server = await serve(lambda request, n: None if n == 2 else (answer(200), False))
    http = agents_http(server.origin)
    await http.post("payment", "health", b"{}", KEY)
    with pytest.raises(CallFailed, match="closed the connection"):
        await http.post("payment", "charge", b"{}", KEY, timeout=2.0)
    assert server.methods() == ["POST", "POST"]
    assert (await http.post("payment", "charge", b"{}", KEY, timeout=2.0)).status == 200
    await http.close()
    assert server.methods() == ["POST", "POST", "POST"]
    assert server.connections == 2


async def test_a_table_batch_to_a_hung_endpoint_is_sent_once(serve) -> None:
    server = await serve(slow(30))
    service = tables(server.origin, read_timeout=0.5)
    entity = {"PartitionKey": "p", "RowKey": "r", "Value": 1}
    with pytest.raises(ServiceResponseError):
        await service.get_table_client("orders").submit_transaction([("create", entity)])
    await service.close()
    assert server.methods() == ["POST"]


async def test_a_table_insert_that_times_out_is_sent_once(serve) -> None:
    server = await serve(slow(30, after=1))
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
