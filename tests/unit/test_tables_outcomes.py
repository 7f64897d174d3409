"""adapters.tables against scripted servers on 127.0.0.1: which failed writes may have been
applied (:func:`adapters.tables.may_have_applied`, :class:`adapters.tables.OutcomeUnknown`), and
the invocation's deadline (:mod:`adapters.deadline`) cutting a call whole, retries included.

The same against Azurite through the fault proxy: tests/integration/test_state_store.py,
test_supervision_store.py and test_table_deadlines.py."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from azure.core import MatchConditions
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.data.tables import TableTransactionError, UpdateMode

from adapters import deadline
from adapters.tables import OutcomeUnknown, TableService, may_have_applied, pipeline
from tests.support.scripted_http import Reply, ScriptedServer, answer

pytestmark = pytest.mark.anyio

KEY = base64.b64encode(b"k" * 32).decode()
JSON = {"Content-Type": "application/json;odata=minimalmetadata;charset=utf-8"}
ROW = {"PartitionKey": "p", "RowKey": "r"}


@pytest.fixture
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "BACKOFF_FACTOR_S", 0.05)


def tables(origin: str, **options: Any) -> TableService:
    conn = f"AccountName=acct;AccountKey={KEY};TableEndpoint={origin}/acct"
    return TableService.from_connection_string(conn, **options)


def busy() -> bytes:
    body = {"odata.error": {"code": "ServerBusy", "message": {"value": "busy"}}}
    return answer(503, json.dumps(body).encode(), JSON)


_IF_MATCH = MatchConditions.IfNotModified


async def write(service: TableService, operation: str) -> None:
    table = service.get_table_client("t")
    if operation == "insert":
        await table.create_entity(ROW)
    elif operation == "transaction":
        await table.submit_transaction([("create", ROW)])
    elif operation == "merge":
        await table.update_entity(ROW, etag='W/"1"', match_condition=_IF_MATCH)
    elif operation == "replace":
        await table.update_entity(
            ROW, mode=UpdateMode.REPLACE, etag='W/"1"', match_condition=_IF_MATCH
        )
    else:
        await table.delete_entity("p", "r", etag='W/"1"', match_condition=_IF_MATCH)


WRITES = ["insert", "transaction", "merge", "replace", "delete"]


async def refused_origin() -> str:
    """An origin where nothing listens: connecting is refused."""
    server = await ScriptedServer(lambda request, n: None).start()
    origin = server.origin
    await server.close()
    return origin


# --------------------------------------------------------------- which writes may have landed


@pytest.mark.parametrize("operation", WRITES)
async def test_a_write_whose_connection_closed_after_it_was_sent_may_have_been_applied(
    serve, quick_backoff, operation
) -> None:
    """The server read the request, then closed without answering: aiohttp calls that a
    connection error (``ServerDisconnectedError``), azure-core a ``ServiceRequestError``, though
    the request was sent and may have been applied."""
    server = await serve(lambda request, n: None)
    async with tables(server.origin) as service:
        with pytest.raises(OutcomeUnknown) as raised:
            await write(service, operation)
    assert may_have_applied(raised.value)
    assert isinstance(raised.value.inner_exception, ServiceRequestError)
    assert "may have been applied" in str(raised.value)
    assert server.requests, "the request reached the server"


async def test_a_read_whose_connection_closed_is_no_outcome_to_settle(serve, quick_backoff) -> None:
    server = await serve(lambda request, n: None)
    async with tables(server.origin) as service:
        with pytest.raises(ServiceRequestError) as raised:
            await service.get_table_client("t").get_entity("p", "r")
    assert not isinstance(raised.value, OutcomeUnknown)


@pytest.mark.parametrize("operation", ["insert", "transaction", "merge"])
async def test_a_write_refused_a_connection_was_never_sent(operation) -> None:
    async with tables(await refused_origin(), connect_timeout=2) as service:
        with pytest.raises(ServiceRequestError) as raised:
            await write(service, operation)
    assert not isinstance(raised.value, OutcomeUnknown)
    assert not may_have_applied(raised.value)
    assert isinstance(raised.value.inner_exception, aiohttp.ClientConnectorError)


@pytest.mark.parametrize("operation", ["replace", "delete"])
async def test_a_put_or_delete_refused_a_connection_may_follow_an_unseen_send(
    quick_backoff, operation
) -> None:
    """aiohttp sends a PUT or DELETE again by itself when its connection fails, so a refused
    connection may be its resend's, after a first send nobody saw (the next test)."""
    async with tables(await refused_origin(), connect_timeout=2) as service:
        with pytest.raises(OutcomeUnknown) as raised:
            await write(service, operation)
    assert isinstance(raised.value.inner_exception.inner_exception, aiohttp.ClientConnectorError)


async def test_a_write_sent_then_refused_on_its_resend_may_have_been_applied(
    serve, quick_backoff
) -> None:
    """A PUT that lost its connection after it was sent is sent again (by aiohttp, then by
    azure-core); the server is gone by then, so the last error is a refused connection. The
    call's outcome is still unknown: its first attempt may have landed."""
    holder: dict[str, ScriptedServer] = {}

    def script(request: bytes, n: int) -> Reply:
        holder["server"]._server.close()  # no new connection from now on
        return None

    holder["server"] = server = await serve(script)
    async with tables(server.origin) as service:
        with pytest.raises(OutcomeUnknown) as raised:
            await write(service, "replace")
    assert server.methods() == ["PUT"]
    cause = raised.value.inner_exception
    assert isinstance(cause, ServiceRequestError)
    assert isinstance(cause.inner_exception, aiohttp.ClientConnectorError)


async def test_a_server_error_then_a_refusal_of_the_resend_is_an_unknown_outcome(
    serve, quick_backoff
) -> None:
    """A POST answered 503 is sent again (azure-core does, for a POST, on 500, 503 and 504);
    the first may have been applied, so a connection the resend cannot make leaves it unknown."""
    holder: dict[str, ScriptedServer] = {}

    def script(request: bytes, n: int) -> Reply:
        holder["server"]._server.close()
        return busy(), True

    holder["server"] = server = await serve(script)
    async with tables(server.origin) as service:
        with pytest.raises(OutcomeUnknown):
            await write(service, "insert")
    assert server.methods() == ["POST"]


async def test_a_refusal_answered_to_a_write_is_the_services_word(serve) -> None:
    body = {"odata.error": {"code": "EntityAlreadyExists", "message": {"value": "exists"}}}
    server = await serve(lambda request, n: (answer(409, json.dumps(body).encode(), JSON), False))
    async with tables(server.origin) as service:
        with pytest.raises(ResourceExistsError) as raised:
            await write(service, "insert")
    assert not may_have_applied(raised.value)


async def test_a_transaction_accepted_whose_answer_cannot_be_read_may_have_been_applied(
    serve,
) -> None:
    """202: the service took the change set; an answer without its operations' answers says
    nothing of whether it was applied."""
    accepted = answer(202, b"--batchresponse_1--\r\n", {"Content-Type": "multipart/mixed"})
    server = await serve(lambda request, n: (accepted, False))
    async with tables(server.origin) as service:
        with pytest.raises(OutcomeUnknown, match="holds 0 of 1 operations"):
            await write(service, "transaction")


def _status(status: int | None, kind: type[HttpResponseError] = HttpResponseError) -> Exception:
    error = kind(message=f"{status}")
    error.status_code = status
    return error


@pytest.mark.parametrize(
    ("error", "applied"),
    [
        (_status(500), True),
        (_status(503), True),
        (_status(408), True),
        (_status(None), True),
        (_status(400), False),
        (_status(409), False),
        (_status(412), False),
        (_status(401, ClientAuthenticationError), False),
        (_status(500, TableTransactionError), False),
        (ClientAuthenticationError("no token from the credential"), False),
        (ServiceResponseError("the read timed out"), True),
        (ServiceResponseTimeoutError("the read timed out"), True),
        (ServiceRequestError("x", error=aiohttp.ServerDisconnectedError()), True),
        (ServiceRequestError("x", error=aiohttp.ClientOSError(104, "reset by peer")), True),
        (ServiceRequestError("x", error=aiohttp.ClientConnectionResetError("closing")), True),
        (ServiceRequestError("x", error=aiohttp.ClientPayloadError("cut")), True),
        (ServiceRequestTimeoutError("x", error=aiohttp.ConnectionTimeoutError()), False),
        (ServiceRequestTimeoutError("not sent: no time left"), False),
        (OutcomeUnknown("x"), True),
        (TimeoutError(), True),
        (asyncio.CancelledError(), True),
        (ValueError("an argument refused before any request"), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_what_may_have_been_applied(error: BaseException, applied: bool) -> None:
    assert may_have_applied(error) is applied


async def test_a_connection_refused_is_known_never_sent() -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorError) as refused:
            await session.get(await refused_origin())
    assert not may_have_applied(ServiceRequestError("x", error=refused.value))


# ------------------------------------------------------------------ the invocation's deadline


async def test_an_answer_trickled_past_the_deadline_is_cut_there(serve) -> None:
    """A byte every 0.4 s never lets a 1 s read timeout fire: only the deadline ends the call,
    while the answer is still coming."""
    total = 200
    trickled = [0]

    async def trickle() -> AsyncIterator[bytes]:
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {total}\r\n"
        yield (head + "Content-Type: application/json\r\n\r\n").encode()
        for _ in range(total):
            yield b" "
            trickled[0] += 1
            await asyncio.sleep(0.4)

    server = await serve(lambda request, n: (trickle(), False))
    async with tables(server.origin, read_timeout=1) as service:
        with (
            deadline.within(1.5),
            pytest.raises(ServiceResponseTimeoutError, match="deadline") as raised,
        ):
            await service.get_table_client("t").get_entity("p", "r")
        assert trickled[0] < total, "the call ended before its answer did"
    assert not isinstance(raised.value, OutcomeUnknown), "a read: no outcome to settle"
    assert server.methods() == ["GET"], "not sent again after the deadline"


async def test_a_write_cut_at_the_deadline_may_have_been_applied(serve) -> None:
    server = await serve(lambda request, n: asyncio.sleep(60))
    async with tables(server.origin) as service:
        with deadline.within(0.5), pytest.raises(OutcomeUnknown, match="deadline") as raised:
            await write(service, "transaction")
    assert isinstance(raised.value.inner_exception, ServiceResponseTimeoutError)
    assert server.methods() == ["POST"]


async def test_retries_end_at_the_deadline(serve) -> None:
    """Six retries of a 503 wait 49.6 s between them; a deadline ends them sooner."""
    server = await serve(lambda request, n: (busy(), False))
    async with tables(server.origin) as service:
        with deadline.within(2), pytest.raises(ServiceResponseTimeoutError, match="deadline"):
            await service.get_table_client("t").get_entity("p", "r")
    assert 1 <= len(server.requests) < 1 + pipeline.STATUS_RETRIES


async def test_nothing_is_sent_once_the_deadline_has_passed(serve) -> None:
    server = await serve(lambda request, n: (answer(204, b""), False))
    async with tables(server.origin) as service:
        with deadline.within(0), pytest.raises(ServiceRequestTimeoutError) as raised:
            await write(service, "insert")
    assert "not sent" in str(raised.value) and not may_have_applied(raised.value)
    assert server.requests == []


async def test_outside_any_bound_a_call_is_bounded_by_the_pipeline_only(serve) -> None:
    server = await serve(lambda request, n: (answer(204, b""), False))
    assert deadline.remaining() is None
    async with tables(server.origin) as service:
        await write(service, "insert")
    assert server.methods() == ["POST"]
