"""adapters.tables against scripted servers on 127.0.0.1 (no Azurite): what the pipeline sends
and how often (the Tables retry semantics: method-aware, ``Retry-After`` and
``x-ms-retry-after-ms`` honoured, never a POST or MERGE again after a read failure, a
``ServerBusy`` storm ridden out, each attempt reported to the request hook), request ids,
User-Agent, Shared Key and Entra tokens (reuse and renewal, 401 and claims challenges), TLS,
the environment's proxy, spans, a pipeline on each event loop it is used on; and the client:
the request each operation sends, its errors, transactions and pages. The wire format without a
server: tests/unit/test_tables_wire.py; the same client against Azurite:
tests/integration/test_tablestorage.py."""

from __future__ import annotations

import asyncio
import base64
import inspect
import itertools
import json
import time
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from azure.core import MatchConditions
from azure.core.credentials import AccessToken
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.transport import AioHttpTransport
from azure.core.settings import settings
from azure.core.tracing.ext.opentelemetry_span import OpenTelemetrySpan
from azure.data.tables import TableTransactionError, UpdateMode
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from adapters.tables import Sent, TableService, client, odata, pipeline
from adapters.tables.auth import SharedKey
from tests.support.certificates import Certificates
from tests.support.scripted_http import (
    Reply,
    Script,
    ScriptedServer,
    Serve,
    answer,
    replies,
)
from tests.support.spans import recording
from tests.support.threaded_http import answering_server

pytestmark = pytest.mark.anyio

KEY = base64.b64encode(b"k" * 32).decode()
JSON = {"Content-Type": "application/json;odata=minimalmetadata;charset=utf-8"}
ROW = b'{"PartitionKey":"p","RowKey":"r","odata.etag":"W/\\"1\\""}'


def tables(server: ScriptedServer, **options: Any) -> TableService:
    conn = f"AccountName=acct;AccountKey={KEY};TableEndpoint={server.origin}/acct"
    return TableService.from_connection_string(conn, **options)


def hangs(request: bytes, n: int) -> Any:
    return asyncio.sleep(60)


def error(status: int, code: str, headers: dict[str, str] | None = None) -> bytes:
    body = {"odata.error": {"code": code, "message": {"value": f"0:{code} happened"}}}
    return answer(status, json.dumps(body).encode(), {**JSON, **(headers or {})})


def entity(etag: str = 'W/"1"') -> bytes:
    return answer(200, ROW, {**JSON, "ETag": etag})


def created() -> bytes:
    return answer(204, b"", {"ETag": 'W/"2"'})


@pytest.fixture
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> float:
    """The retry policy's backoff factor, cut so that retries after a failed status or a lost
    answer come within a test's time (the first at once, the next after twice this)."""
    monkeypatch.setattr(pipeline, "BACKOFF_FACTOR_S", 0.05)
    return 0.05


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The backoffs the retry policy waits (through its transport's ``sleep``), in order: what
    it asked for, where the time between attempts is also what a loaded machine adds."""
    waits: list[float] = []
    sleep = AioHttpTransport.sleep

    async def recorded(transport: AioHttpTransport, duration: float) -> None:
        waits.append(duration)
        await sleep(transport, duration)

    monkeypatch.setattr(AioHttpTransport, "sleep", recorded)
    return waits


def test_io_is_awaited_and_building_is_not() -> None:
    for name in (
        "get_entity", "create_entity", "upsert_entity", "update_entity", "delete_entity",
        "submit_transaction", "close", "__aenter__", "__aexit__",
    ):  # fmt: skip
        assert inspect.iscoroutinefunction(getattr(client.Table, name)), name
    for name in ("create_table_if_not_exists", "delete_table", "request", "close"):
        assert inspect.iscoroutinefunction(getattr(client.TableService, name)), name
    for name in ("from_connection_string", "get_table_client", "url"):
        assert not inspect.iscoroutinefunction(getattr(client.TableService, name)), name
    assert not inspect.iscoroutinefunction(client.Table.query_entities)
    assert Sent is pipeline.Sent


# ---------------------------------------------------------------- what each request carries


async def test_a_request_carries_its_id_user_agent_date_version_and_shared_key(serve) -> None:
    server = await serve(replies(error(503, "ServerBusy"), entity()))
    async with tables(server) as service:
        await service.get_table_client("t").get_entity("p", "r")
    first, retry = server.headers(1), server.headers(2)
    assert first["x-ms-client-request-id"] == retry["x-ms-client-request-id"]  # the same on retries
    assert len(first["x-ms-client-request-id"]) == 36
    assert first["user-agent"].startswith(f"azsdk-python-{pipeline.MONIKER} Python/")
    assert first["x-ms-version"] == "2019-02-02" and first["x-ms-date"].endswith(" GMT")
    assert first["authorization"].startswith("SharedKey acct:")
    assert "accept-encoding" not in first  # the service answers uncompressed


async def test_each_attempt_is_reported_once_with_a_transactions_operations(serve) -> None:
    batch_answer = (
        b"--b\r\nContent-Type: multipart/mixed; boundary=c\r\n\r\n"
        + b"--c\r\nContent-Type: application/http\r\n\r\nHTTP/1.1 204 No Content\r\n"
        b'ETag: W/"x"\r\n\r\n\r\n--c--\r\n--b--\r\n'
    )
    server = await serve(
        replies(error(500, "InternalError"), answer(202, batch_answer, {"Content-Type": "x"}))
    )
    seen: list[Sent] = []
    async with tables(server, request_hook=seen.append) as service:
        done = await service.get_table_client("t").submit_transaction(
            [("upsert", {"PartitionKey": "p", "RowKey": "a"})]
        )
    assert done == [{"etag": 'W/"x"'}]
    url = f"{server.origin}/acct/$batch"
    operation = f"{server.origin}/acct/t(PartitionKey='p',RowKey='a')"
    assert seen == [Sent("POST", url, (operation,)), Sent("POST", url, (operation,))]


async def test_shared_key_signs_the_path_as_it_is_sent(serve) -> None:
    """yarl sends ``%27`` as ``'``: the signature is over what the server receives."""
    server = await serve(replies(created()))
    async with tables(server) as service:
        await service.get_table_client("t").upsert_entity({"PartitionKey": "a'b(c)", "RowKey": "r"})
    head = server.requests[0].split(b"\r\n", 1)[0].decode()
    path = head.split(" ")[1]
    assert unquote(path) == "/acct/t(PartitionKey='a''b(c)',RowKey='r')"
    key = SharedKey.of("acct", KEY)
    sent = server.headers(1)
    assert sent["authorization"] == key.authorization("PATCH", path, sent_headers(sent))


def sent_headers(headers: dict[str, str]) -> dict[str, str]:
    return {"Content-Type": headers.get("content-type", ""), "x-ms-date": headers["x-ms-date"]}


# ------------------------------------------------------------------------------- retries


@pytest.mark.parametrize(
    ("operation", "method"),
    [("insert", "POST"), ("transaction", "POST"), ("merge", "PATCH")],
)
async def test_a_write_to_a_hung_endpoint_is_sent_once(serve, operation, method) -> None:
    """A POST or MERGE that timed out may have been applied: azure-core never resends it."""
    server = await serve(hangs)
    table = tables(server, read_timeout=0.3).get_table_client("t", owns_service=True)
    row = {"PartitionKey": "p", "RowKey": "r"}
    with pytest.raises(ServiceResponseError):
        if operation == "insert":
            await table.create_entity(row)
        elif operation == "transaction":
            await table.submit_transaction([("create", row)])
        else:
            await table.update_entity(row)
    await table.close()
    await asyncio.sleep(0.2)
    assert server.methods() == [method]


async def test_a_read_from_a_hung_endpoint_is_tried_as_the_sdk_tries_it(serve, slept) -> None:
    """GET is idempotent: 1 + 3 read retries, after 0, 1.6 and 3.2 s."""
    times: list[float] = []

    async def script(request: bytes, n: int) -> Reply:
        times.append(time.monotonic())
        await asyncio.sleep(60)
        return None

    server = await serve(script)
    table = tables(server, read_timeout=0.2).get_table_client("t", owns_service=True)
    with pytest.raises(ServiceResponseError):
        await table.get_entity("p", "r")
    await table.close()
    assert server.methods() == ["GET"] * (1 + pipeline.READ_RETRIES)
    assert slept == pytest.approx([1.6, 3.2]), "the first retry at once, then 1.6 and 3.2 s"
    gaps = [later - earlier - 0.2 for earlier, later in itertools.pairwise(times)]
    assert gaps[1] > 1.5 and gaps[2] > 3.1  # waited (a loaded machine only adds)


async def test_transient_failures_are_retried_and_each_attempt_is_counted(
    serve, quick_backoff
) -> None:
    times: list[float] = []

    async def script(request: bytes, n: int) -> Reply:
        times.append(time.monotonic())
        if n == 1:
            await asyncio.sleep(5)  # no answer within the read timeout: a GET is tried again
        return (error(503, "ServerBusy") if n == 2 else entity()), False

    server = await serve(script)
    seen: list[Sent] = []
    async with tables(server, request_hook=seen.append, read_timeout=0.2) as service:
        row = await service.get_table_client("t").get_entity("p", "r")
    assert row.metadata["etag"] == 'W/"1"'
    assert [s.method for s in seen] == ["GET", "GET", "GET"]
    assert seen[0].url == f"{server.origin}/acct/t(PartitionKey='p',RowKey='r')"
    assert times[2] - times[1] >= 2 * quick_backoff  # the first retry at once, then a backoff


async def test_a_read_on_a_kept_alive_connection_the_server_closed_is_sent_again_at_once(
    serve, slept
) -> None:
    """aiohttp itself sends an idempotent request again when its connection closes before the
    answer: at once, and unseen by the request hook (it is no attempt of the pipeline's)."""
    server = await serve(replies(entity(), None, entity()))
    seen: list[Sent] = []
    async with tables(server, request_hook=seen.append) as service:
        table = service.get_table_client("t")
        assert (await table.get_entity("p", "r")).metadata["etag"] == 'W/"1"'
        assert (await table.get_entity("p", "r")).metadata["etag"] == 'W/"1"'
    assert server.methods() == ["GET"] * 3 and server.connections == 2
    assert len(seen) == 2 and slept == [], "sent again by aiohttp: no retry of the pipeline's"


async def test_retries_end(serve, quick_backoff) -> None:
    server = await serve(replies(error(503, "ServerBusy")))
    async with tables(server) as service:
        with pytest.raises(HttpResponseError) as raised:
            await service.get_table_client("t").get_entity("p", "r")
    assert raised.value.status_code == 503
    assert server.methods() == ["GET"] * (1 + pipeline.STATUS_RETRIES)
    origin = server.origin
    await server.close()
    conn = f"AccountName=acct;AccountKey={KEY};TableEndpoint={origin}/acct"
    async with TableService.from_connection_string(conn) as service:
        with pytest.raises(ServiceRequestError, match="Cannot connect"):
            await service.get_table_client("t").get_entity("p", "r")


async def test_a_503_with_retry_after_waits_as_long_as_it_says(serve) -> None:
    times: list[float] = []

    def script(request: bytes, n: int) -> Reply:
        times.append(time.monotonic())
        return (error(503, "ServerBusy", {"Retry-After": "2"}) if n == 1 else created()), False

    server = await serve(script)
    async with tables(server) as service:
        await service.get_table_client("t").create_entity({"PartitionKey": "p", "RowKey": "r"})
    assert server.methods() == ["POST", "POST"]
    assert times[1] - times[0] >= 2.0


async def test_x_ms_retry_after_ms_is_honoured_where_the_backoff_would_not_wait(serve) -> None:
    times: list[float] = []

    def script(request: bytes, n: int) -> Reply:
        times.append(time.monotonic())
        busy = error(429, "TooManyRequests", {"x-ms-retry-after-ms": "600"})
        return (busy if n == 1 else entity()), False

    server = await serve(script)
    async with tables(server) as service:
        await service.get_table_client("t").get_entity("p", "r")
    assert times[1] - times[0] >= 0.6  # the first retry's backoff is 0


async def test_a_post_is_not_retried_on_a_status_the_sdk_does_not_retry_it_on(serve) -> None:
    """429 without Retry-After: the SDK retries GET, PUT, DELETE on it, not a POST."""
    server = await serve(replies(error(429, "TooManyRequests")))
    async with tables(server) as service:
        with pytest.raises(HttpResponseError) as raised:
            await service.get_table_client("t").create_entity({"PartitionKey": "p", "RowKey": "r"})
    assert raised.value.status_code == 429 and server.methods() == ["POST"]


@pytest.mark.slow
async def test_a_server_busy_storm_of_ten_seconds_is_ridden_out(serve) -> None:
    """azure-data-tables gives up after 4 attempts and 4.8 s; the app then redelivers."""
    started = time.monotonic()

    def script(request: bytes, n: int) -> Reply:
        if time.monotonic() - started < 10:
            return error(503, "ServerBusy"), False
        return created(), False

    server = await serve(script)
    async with tables(server) as service:
        await service.get_table_client("t").create_entity({"PartitionKey": "p", "RowKey": "r"})
    assert time.monotonic() - started >= 10
    assert server.methods() == ["POST"] * 5  # at 0, 0, 1.6 and 4.8 s busy; at 11.2 s done


async def test_a_refused_connection_is_retried_for_a_read_only(serve, slept) -> None:
    server = await serve(replies(entity()))
    origin = server.origin
    await server.close()
    conn = f"AccountName=acct;AccountKey={KEY};TableEndpoint={origin}/acct"
    seen: list[Sent] = []
    async with TableService.from_connection_string(
        conn, connect_timeout=0.5, request_hook=seen.append
    ) as service:
        table = service.get_table_client("t")
        with pytest.raises(ServiceRequestError):
            await table.create_entity({"PartitionKey": "p", "RowKey": "r"})
        assert [s.method for s in seen] == ["POST"] and slept == []  # a POST: not again
        started = time.monotonic()
        with pytest.raises(ServiceRequestError):
            await table.get_entity("p", "r")
        assert time.monotonic() - started > 4.7  # waited (a loaded machine only adds)
    # 1 + 3 connect retries, after 0, 1.6 and 3.2 s.
    assert [s.method for s in seen] == ["POST"] + ["GET"] * (1 + pipeline.CONNECT_RETRIES)
    assert slept == pytest.approx([1.6, 3.2])


# ---------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (401, "AuthenticationFailed", ClientAuthenticationError),
        (404, "ResourceNotFound", ResourceNotFoundError),
        (409, "EntityAlreadyExists", ResourceExistsError),
        (412, "UpdateConditionNotSatisfied", ResourceModifiedError),
        (400, "InvalidInput", HttpResponseError),
    ],
)
async def test_errors_have_the_sdks_types_and_codes(serve, status, code, kind) -> None:
    server = await serve(replies(error(status, code, {"x-ms-request-id": "service-id"})))
    async with tables(server) as service:
        with pytest.raises(kind) as raised:
            await service.get_table_client("t").create_entity({"PartitionKey": "p", "RowKey": "r"})
    assert type(raised.value) is kind
    assert raised.value.status_code == status and raised.value.error_code == code
    assert code in str(raised.value)
    assert raised.value.response.headers["x-ms-request-id"] == "service-id"


async def test_a_failed_transaction_names_its_operation(serve) -> None:
    failed = (
        b"--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_1\r\n\r\n"
        b"--changesetresponse_1\r\nContent-Type: application/http\r\n\r\n"
        b"HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\n\r\n"
        b'{"odata.error":{"code":"EntityAlreadyExists","message":{"value":"1:exists"}}}\r\n'
        b"--changesetresponse_1--\r\n--batchresponse_1--\r\n"
    )
    server = await serve(replies(answer(202, failed, {"Content-Type": "multipart/mixed"})))
    async with tables(server) as service:
        with pytest.raises(TableTransactionError) as raised:
            await service.get_table_client("t").submit_transaction(
                [
                    ("create", {"PartitionKey": "p", "RowKey": "a"}),
                    ("create", {"PartitionKey": "p", "RowKey": "b"}),
                ]
            )
    assert (raised.value.status_code, raised.value.error_code, raised.value.index) == (
        409,
        "EntityAlreadyExists",
        1,
    )


async def test_a_transaction_the_service_would_refuse_is_refused_before_any_request(
    serve,
) -> None:
    server = await serve(replies(created()))
    async with tables(server) as service:
        table = service.get_table_client("t")
        with pytest.raises(ValueError, match="share a PartitionKey"):
            await table.submit_transaction(
                [
                    ("create", {"PartitionKey": "a", "RowKey": "r"}),
                    ("create", {"PartitionKey": "b", "RowKey": "r"}),
                ]
            )
        with pytest.raises(ValueError, match="at most 100"):
            await table.submit_transaction(
                [("create", {"PartitionKey": "a", "RowKey": str(i)}) for i in range(101)]
            )
        with pytest.raises(ValueError, match="unknown transaction operation 'merge'"):
            await table.submit_transaction([("merge", {"PartitionKey": "a", "RowKey": "r"})])
        assert await table.submit_transaction([]) == []
    assert server.requests == []


async def test_deleting_a_row_or_table_already_gone_is_not_an_error(serve) -> None:
    server = await serve(replies(error(404, "ResourceNotFound"), error(404, "TableNotFound")))
    async with tables(server) as service:
        await service.get_table_client("t").delete_entity("p", "r")
        await service.delete_table("t")
    assert server.methods() == ["DELETE", "DELETE"]


# ---------------------------------------------------------- what each operation sends


def as_the_service_answers(request: bytes, n: int) -> Reply:
    method, target, _ = request.split(b"\r\n", 1)[0].decode().split(" ")
    path = urlsplit(target).path
    if method == "GET" and path.endswith("()"):
        rows = {"value": [{"PartitionKey": "p", "RowKey": "r"}]}
        return answer(200, json.dumps(rows).encode(), JSON), False
    if method == "GET":
        return entity(), False
    if path.endswith("$batch"):
        part = (
            "--c\r\nContent-Type: application/http\r\n\r\n"
            'HTTP/1.1 204 No Content\r\nETag: W/"x"\r\n\r\n\r\n'
        )
        batch = (
            f"--b\r\nContent-Type: multipart/mixed; boundary=c\r\n\r\n{part * 2}--c--\r\n--b--\r\n"
        )
        return answer(202, batch.encode(), {"Content-Type": "multipart/mixed; boundary=b"}), False
    if path.endswith("/Tables"):
        return error(409, "TableAlreadyExists"), False
    return answer(204, b"", {"ETag": 'W/"x"'}), False


OPS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("create_entity", ({"PartitionKey": "p", "RowKey": "r", "N": 1},), {}),
    ("get_entity", ("p", "r"), {"select": ["N"]}),
    ("upsert_entity", ({"PartitionKey": "p", "RowKey": "r"}, UpdateMode.REPLACE), {}),
    (
        "update_entity",
        ({"PartitionKey": "p", "RowKey": "r"},),
        {"etag": "e", "match_condition": MatchConditions.IfNotModified},
    ),
    ("delete_entity", ("p", "r"), {}),
    (
        "submit_transaction",
        (
            [
                ("upsert", {"PartitionKey": "p", "RowKey": "a"}),
                ("delete", {"PartitionKey": "p", "RowKey": "b"}),
            ],
        ),
        {},
    ),
]
ETAG = {"etag": 'W/"x"'}
RESULTS = [ETAG, {"PartitionKey": "p", "RowKey": "r"}, ETAG, ETAG, None, [ETAG, ETAG]]


def expected_requests(origin: str) -> list[tuple[str, str, bytes]]:
    """What OPS send after creating the table, then the query: one request each."""
    row = f"{origin}/acct/t(PartitionKey='p',RowKey='r')"
    batch_urls = [f"{origin}/acct/t(PartitionKey='p',RowKey='{key}')" for key in "ab"]
    part = "Content-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n"
    headers = "Accept: application/json;odata=minimalmetadata\r\nDataServiceVersion: 3.0\r\n"
    transaction = (
        f"\r\n\r\n\r\n\r\n{part}PATCH {batch_urls[0]} HTTP/1.1\r\n{headers}"
        "Content-Type: application/json\r\nPrefer: return-no-content\r\n\r\n"
        '{"PartitionKey":"p","RowKey":"a"}\r\n\r\n'
        f"{part}DELETE {batch_urls[1]} HTTP/1.1\r\n{headers}If-Match: *\r\n\r\n\r\n--\r\n--\r\n"
    )
    return [
        ("POST", f"{origin}/acct/Tables", b'{"TableName":"t"}'),
        ("POST", f"{origin}/acct/t", b'{"PartitionKey":"p","RowKey":"r","N":1}'),
        ("GET", f"{row}?$select=N", b""),
        ("PUT", row, b'{"PartitionKey":"p","RowKey":"r"}'),
        ("PATCH", row, b'{"PartitionKey":"p","RowKey":"r"}'),
        ("DELETE", row, b""),
        ("POST", f"{origin}/acct/$batch", transaction.encode()),
        ("GET", f"{origin}/acct/t()?$filter=N%20eq%201", b""),
    ]


def received(server: ScriptedServer) -> list[tuple[str, str, bytes]]:
    """The requests as the server read them, without what differs each time (a transaction's
    boundaries); URLs decoded, as yarl sends some characters the client encoded."""
    out = []
    for request in server.requests:
        head, body = request.split(b"\r\n\r\n", 1)
        method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ")
        text = body.decode()
        for line in text.splitlines():
            if line.startswith(("--batch_", "--changeset_")) or "boundary=" in line:
                text = text.replace(line, "")
        out.append((method, unquote(server.origin + target), text.encode()))
    return out


async def test_each_operation_sends_its_request_and_reports_it_once(serve) -> None:
    server = await serve(as_the_service_answers)
    seen: list[Sent] = []
    async with tables(server, request_hook=seen.append) as service:
        await service.create_table_if_not_exists("t")
        table = service.get_table_client("t")
        for (name, args, kwargs), expected in zip(OPS, RESULTS, strict=True):
            assert await getattr(table, name)(*args, **kwargs) == expected, name
        rows = [dict(r) async for r in table.query_entities("N eq @n", parameters={"n": 1})]
    assert rows == [{"PartitionKey": "p", "RowKey": "r"}]
    requests = expected_requests(server.origin)
    assert received(server) == [(m, unquote(u), body) for m, u, body in requests]
    assert [(s.method, s.url) for s in seen] == [(m, u) for m, u, _ in requests]
    assert len(seen) == len(OPS) + 2
    assert seen[-2].batch_urls == tuple(
        f"{server.origin}/acct/t(PartitionKey='p',RowKey='{key}')" for key in "ab"
    )


# ---------------------------------------------------------------------------------- pages


def paging(fail_at: int | None = None) -> Script:
    """Three pages of two rows, the service's continuation headers between them."""

    def script(request: bytes, n: int) -> Reply:
        target = request.split(b" ", 2)[1].decode()
        query = parse_qs(urlsplit(target).query)
        start = int(query.get("NextRowKey", ["0"])[0])
        if fail_at is not None and start == fail_at:
            return error(500, "InternalError"), False
        rows = [{"PartitionKey": "p", "RowKey": str(i), "I": i} for i in (start, start + 1)]
        headers = dict(JSON)
        if start + 2 < 6:
            headers["x-ms-continuation-NextPartitionKey"] = "p"
            headers["x-ms-continuation-NextRowKey"] = str(start + 2)
        return answer(200, json.dumps({"value": rows}).encode(), headers), False

    return script


def queries(server: ScriptedServer) -> list[dict[str, list[str]]]:
    return [
        parse_qs(urlsplit(request.split(b" ", 2)[1].decode()).query) for request in server.requests
    ]


async def test_rows_are_read_a_page_at_a_time_and_pages_resume(serve) -> None:
    server = await serve(paging())
    async with tables(server) as service:
        table = service.get_table_client("t")
        rows = table.query_entities("I ge @low", parameters={"low": 0}, results_per_page=2)
        assert server.requests == []  # no request until walked
        seen = []
        async for row in rows:
            seen.append(row["I"])
            if row["I"] == 2:
                assert len(server.requests) == 2  # a page at a time, as the rows are walked
        assert seen == [0, 1, 2, 3, 4, 5] and len(server.requests) == 3
        assert queries(server)[0] == {"$filter": ["I ge 0"], "$top": ["2"]}
        assert queries(server)[1]["NextPartitionKey"] == ["p"]
        assert queries(server)[1]["NextRowKey"] == ["2"]
        pages = table.list_entities(results_per_page=2).by_page()
        first = await pages.__anext__()
        assert isinstance(first, odata.Page) and [r["I"] for r in first] == [0, 1]
        assert [r["I"] async for r in first] == [0, 1]  # as azure-core's async pages walk
        assert pages.continuation_token == {"PartitionKey": "p", "RowKey": "2"}
        resumed = table.list_entities(results_per_page=2).by_page(pages.continuation_token)
        assert [[r["I"] for r in page] async for page in resumed] == [[2, 3], [4, 5]]
        assert resumed.continuation_token is None
        assert [r["I"] async for r in table.list_entities(select=["I"])] == seen
        assert queries(server)[-1]["$select"] == ["I"]
    assert len(server.requests) == 3 + 1 + 2 + 3


async def test_a_failed_page_says_where_it_started(serve, quick_backoff) -> None:
    server = await serve(paging(fail_at=4))
    async with tables(server) as service:
        pages = service.get_table_client("t").list_entities().by_page()
        await pages.__anext__()
        await pages.__anext__()
        with pytest.raises(HttpResponseError) as raised:
            await pages.__anext__()
    assert raised.value.continuation_token == {"PartitionKey": "p", "RowKey": "4"}


async def test_a_table_that_owns_its_service_closes_it(serve) -> None:
    server = await serve(replies(entity()))
    service = tables(server)
    async with service.get_table_client("t") as table:  # not its owner: the service stays open
        await table.get_entity("p", "r")
    assert not service._sender._pipeline._transport.session.closed
    async with service.get_table_client("t", owns_service=True) as table:
        await table.get_entity("p", "r")
    assert service._sender._pipeline is None


# ------------------------------------------------------------------------- Entra tokens


class AsyncCredential:
    """Hands out t0, t1, ... (each ``lifetime`` seconds long); records what each was asked
    with."""

    def __init__(self, lifetime: int = 3600) -> None:
        self.lifetime = lifetime
        self.asked: list[dict[str, Any]] = []

    async def get_token(self, *scopes: str, **options: Any) -> AccessToken:
        await asyncio.sleep(0)
        self.asked.append({"scopes": scopes, **options})
        return AccessToken(f"t{len(self.asked) - 1}", int(time.time()) + self.lifetime)


def https_tables(server: ScriptedServer, certificates: Certificates, credential: Any):
    return TableService(f"{server.origin}/acct", credential, ssl_context=certificates.trusting_ca())


async def test_requests_carry_a_bearer_token_from_an_async_credential(serve, certificates) -> None:
    server = await serve(replies(entity()), Certificates.server(certificates.localhost))
    credential = AsyncCredential()
    async with https_tables(server, certificates, credential) as service:
        await service.get_table_client("t").get_entity("p", "r")
        await service.get_table_client("t").get_entity("p", "r")
    assert [server.headers(n)["authorization"] for n in (1, 2)] == ["Bearer t0"] * 2
    assert credential.asked == [{"scopes": ("https://storage.azure.com/.default",)}]


@pytest.mark.parametrize(("lifetime", "tokens"), [(310, ["t0", "t0"]), (230, ["t0", "t1"])])
async def test_a_token_is_reused_until_about_five_minutes_before_it_expires(
    serve, certificates, lifetime: int, tokens: list[str]
) -> None:
    """azure-core renews a token 4 to 5 minutes before it expires (a jittered window)."""
    server = await serve(replies(entity()), Certificates.server(certificates.localhost))
    async with https_tables(server, certificates, AsyncCredential(lifetime)) as service:
        await service.get_table_client("t").get_entity("p", "r")
        await service.get_table_client("t").get_entity("p", "r")
    assert [server.headers(n)["authorization"] for n in (1, 2)] == [f"Bearer {t}" for t in tokens]


async def read_after_challenge(
    serve: Serve, certificates: Certificates, challenge: str
) -> tuple[ScriptedServer, AsyncCredential]:
    """One read over HTTPS, its first answer a 401 with ``challenge`` and the next the row."""
    unauthorized = error(401, "InvalidAuthenticationInfo", {"WWW-Authenticate": challenge})
    server = await serve(
        replies(unauthorized, entity()), Certificates.server(certificates.localhost)
    )
    credential = AsyncCredential()
    async with https_tables(server, certificates, credential) as service:
        await service.get_table_client("t").get_entity("p", "r")
    return server, credential


async def test_a_claims_challenge_gets_a_token_with_those_claims(serve, certificates) -> None:
    claims = '{"access_token":{"nbf":{"essential":true,"value":"1700000000"}}}'
    encoded = base64.urlsafe_b64encode(claims.encode()).decode().rstrip("=")
    challenge = (
        'Bearer realm="", authorization_uri="https://login.microsoftonline.com/common/oauth2/'
        f'authorize", error="insufficient_claims", claims="{encoded}"'
    )
    server, credential = await read_after_challenge(serve, certificates, challenge)
    assert [server.headers(n)["authorization"] for n in (1, 2)] == ["Bearer t0", "Bearer t1"]
    assert credential.asked[1]["claims"] == claims


async def test_a_tenant_challenge_gets_a_token_from_that_tenant(serve, certificates) -> None:
    challenge = (
        'Bearer authorization_uri="https://login.microsoftonline.com/tenant-2/oauth2/authorize",'
        ' resource_id="https://storage.azure.com"'
    )
    server, credential = await read_after_challenge(serve, certificates, challenge)
    assert credential.asked[1]["tenant_id"] == "tenant-2"
    assert server.headers(2)["authorization"] == "Bearer t1"


async def test_a_401_without_a_challenge_is_an_authentication_error(serve, certificates) -> None:
    server = await serve(
        replies(error(401, "AuthenticationFailed")), Certificates.server(certificates.localhost)
    )
    async with https_tables(server, certificates, AsyncCredential()) as service:
        with pytest.raises(ClientAuthenticationError):
            await service.get_table_client("t").get_entity("p", "r")
    assert server.methods() == ["GET"]


def test_a_sync_credential_is_refused_by_name() -> None:
    class SyncCredential:
        def get_token(self, *scopes: str, **options: Any) -> AccessToken:
            raise AssertionError("never called")

    with pytest.raises(TypeError, match="async credential"):
        TableService("https://a.table.core.windows.net", SyncCredential())


@pytest.mark.parametrize(
    ("challenge", "tenant"),
    [
        (
            'Bearer authorization_uri="https://login.microsoftonline.com/t-1/oauth2/authorize"',
            "t-1",
        ),
        ("Bearer authorization=https://login.windows.net/t-2, resource=x", "t-2"),
        ('Basic realm="x"', None),
        ("Bearer error=invalid_token", None),
        (None, None),
    ],
)
def test_the_tenant_a_challenge_names(challenge: str | None, tenant: str | None) -> None:
    assert pipeline.challenge_tenant(challenge) == tenant


# ---------------------------------------------------------------------------------- TLS


@pytest.mark.parametrize(
    ("pair", "refusal"),
    [
        ("self_signed", "self-signed certificate"),
        ("wrong_host", "IP address mismatch|doesn't match"),
    ],
)
async def test_a_certificate_not_for_this_host_or_not_trusted_is_refused(
    serve, certificates, pair, refusal
) -> None:
    server = await serve(replies(entity()), Certificates.server(getattr(certificates, pair)))
    conn = f"AccountName=acct;AccountKey={KEY};TableEndpoint={server.origin}/acct"
    options = {"ssl_context": certificates.trusting_ca()} if pair == "wrong_host" else {}
    async with TableService.from_connection_string(conn, **options) as service:
        with pytest.raises(ServiceRequestError, match=refusal):
            await service.get_table_client("t").get_entity("p", "r")
    assert server.requests == []


async def test_a_certificate_from_a_trusted_authority_is_accepted(serve, certificates) -> None:
    server = await serve(replies(entity()), Certificates.server(certificates.localhost))
    conn = f"AccountName=acct;AccountKey={KEY};TableEndpoint={server.origin}/acct"
    async with TableService.from_connection_string(
        conn, ssl_context=certificates.trusting_ca()
    ) as service:
        row = await service.get_table_client("t").get_entity("p", "r")
    assert row["RowKey"] == "r"


# ------------------------------------------------------------------------- proxy, spans


async def test_the_proxy_the_environment_names_is_used(serve, monkeypatch) -> None:
    proxy = await serve(replies(entity()))
    monkeypatch.setenv("HTTP_PROXY", proxy.origin)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    conn = f"AccountName=acct;AccountKey={KEY};TableEndpoint=http://storage.invalid:10002/acct"
    async with TableService.from_connection_string(conn) as service:
        await service.get_table_client("t").get_entity("p", "r")
    line = proxy.requests[0].split(b"\r\n", 1)[0].decode()
    assert line.startswith("GET http://storage.invalid:10002/acct/t(PartitionKey=")


async def test_no_proxy_exempts_the_endpoint(serve, monkeypatch) -> None:
    server = await serve(replies(entity()))
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    async with tables(server) as service:
        await service.get_table_client("t").get_entity("p", "r")
    assert server.methods() == ["GET"]


@pytest.fixture
def sdk_tracing() -> Any:
    settings.tracing_implementation = OpenTelemetrySpan
    yield
    settings.tracing_implementation.unset_value()


async def test_each_attempt_is_a_client_span_and_sends_its_traceparent(serve, sdk_tracing) -> None:
    server = await serve(replies(error(503, "ServerBusy"), entity()))
    exporter = InMemorySpanExporter()
    with recording(exporter):
        async with tables(server) as service:
            await service.get_table_client("t").get_entity("p", "r")
    spans = [span for span in exporter.get_finished_spans() if span.kind is SpanKind.CLIENT]
    assert len(spans) == 2
    for n, span in enumerate(spans, start=1):
        sent, context = server.headers(n), span.context
        assert sent["traceparent"].startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")
        assert span.attributes["az.client_request_id"] == sent["x-ms-client-request-id"]
    assert [span.attributes["http.response.status_code"] for span in spans] == [503, 200]


def test_each_event_loop_gets_a_pipeline_of_its_own() -> None:
    """Each asyncio.run is a new loop (orderctl's commands, each test): the same service opens
    a session on it rather than use the earlier loop's."""
    with answering_server(ROW, JSON) as origin:
        conn = f"AccountName=acct;AccountKey={KEY};TableEndpoint={origin}/acct"
        service = TableService.from_connection_string(conn)
        sessions: list[Any] = []

        async def read(*, close: bool = False) -> str:
            row = await service.get_table_client("t").get_entity("p", "r")
            sessions.append(service._sender._pipeline._transport.session)
            if close:
                await service.close()
            return row["RowKey"]

        assert asyncio.run(read()) == "r"
        assert asyncio.run(read(close=True)) == "r"
    assert sessions[0] is not sessions[1] and sessions[1].closed


async def test_the_apps_credential_is_async_and_the_table_client_takes_it() -> None:
    from azure.identity.aio import DefaultAzureCredential, ManagedIdentityCredential

    from adapters.credentials import credential
    from adapters.settings import Connection

    endpoint = "https://acct.table.core.windows.net"
    chosen = credential(Connection("st", endpoint=endpoint, client_id="app-id"))
    assert isinstance(chosen, ManagedIdentityCredential)
    async with TableService(endpoint, chosen):
        pass
    await chosen.close()
    fallback = credential(Connection("st", endpoint=endpoint))
    assert isinstance(fallback, DefaultAzureCredential)
    await fallback.close()
