"""core.tablestorage without a server: the OData codec, filters, keys, transactions' text,
Shared Key, the client's retries, errors, transactions and pages, the requests each operation
sends (each reported once to the request hook), and the Entra token renewed off the request
path (httpx.MockTransport stands in for the service)."""

from __future__ import annotations

import base64
import inspect
import json
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from azure.core import MatchConditions
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
)
from azure.data.tables import EdmType, EntityProperty, TableTransactionError, UpdateMode
from hypothesis import given
from hypothesis import strategies as st

from core import tablestorage
from core.tablestorage import Sent, TableService, auth, batch, client, odata
from core.tablestorage.auth import BearerToken, SharedKey, parse_connection_string

pytestmark = pytest.mark.anyio

KEY = base64.b64encode(b"k" * 32).decode()
CS = f"AccountName=acct;AccountKey={KEY};TableEndpoint=http://h:1/acct"
T = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)

Handler = Callable[[httpx.Request], httpx.Response]


# ------------------------------------------------------------------------------ codec


def test_types_are_written_as_the_sdk_writes_them() -> None:
    body = odata.encode(
        {
            "PartitionKey": "p",
            "S": "text",
            "I": 7,
            "Big": 2**40,
            "I64": EntityProperty(3, EdmType.INT64),
            "F": 1.0,
            "B": True,
            "D": T,
            "G": uuid.UUID(int=1),
            "Bin": b"\x00\xff",
            "Gone": None,
        }
    )
    assert body == {
        "PartitionKey": "p",
        "S": "text",
        "I": 7,
        "Big": str(2**40),
        "Big@odata.type": "Edm.Int64",
        "I64": "3",
        "I64@odata.type": "Edm.Int64",
        "F": 1.0,
        "F@odata.type": "Edm.Double",
        "B": True,
        "D": "2026-03-01T12:00:00.123456Z",
        "D@odata.type": "Edm.DateTime",
        "G": "00000000-0000-0000-0000-000000000001",
        "G@odata.type": "Edm.Guid",
        "Bin": "AP8=",
        "Bin@odata.type": "Edm.Binary",
    }


def test_an_unsupported_type_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="cannot hold a list"):
        odata.encode({"L": [1]})


values = st.one_of(
    st.text(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.datetimes(min_value=datetime(1601, 1, 1), timezones=st.just(UTC)),
    st.binary(max_size=64),
    st.uuids(),
)


@given(values)
def test_what_is_written_reads_back_the_same(value: Any) -> None:
    wire = json.loads(json.dumps(odata.encode({"V": value})))
    read = odata.decode(wire)["V"]
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value not in range(-(2**31), 2**31)
    ):
        assert read == EntityProperty(value, EdmType.INT64)
    else:
        assert read == value


def test_metadata_holds_the_etag_and_timestamp() -> None:
    row = odata.decode(
        {
            "odata.etag": 'W/"x"',
            "PartitionKey": "p",
            "RowKey": "r",
            "Timestamp": "2026-03-01T12:00:00.1234567Z",
            "Timestamp@odata.type": "Edm.DateTime",
        }
    )
    assert dict(row) == {"PartitionKey": "p", "RowKey": "r"}
    assert row.metadata == {"etag": 'W/"x"', "timestamp": T}


def test_seven_fractional_digits_keep_six() -> None:
    assert odata.parse_datetime("2026-03-01T12:00:00.1234567Z") == T
    assert odata.parse_datetime("2026-03-01T12:00:00Z") == T.replace(microsecond=0)


def test_timestamps_round_trip_through_filters_and_rows() -> None:
    later = T + timedelta(days=1)
    assert odata.decode(json.loads(json.dumps(odata.encode({"D": later}))))["D"] == later


# ----------------------------------------------------------------------- keys, filters


def test_keys_are_quoted_and_encoded() -> None:
    path = odata.entity_path("orders", "o'1 %", "r/x")
    assert path == "orders(PartitionKey='o%27%271%20%25',RowKey='r%2Fx')"


def test_filter_parameters_become_literals() -> None:
    text = odata.substitute(
        "PartitionKey eq @pk and N ge @n and Big lt @big and At lt @at and B eq @b",
        {"pk": "x' or PartitionKey ne '", "n": 3, "big": 2**40, "at": T, "b": False},
    )
    assert text == (
        "PartitionKey eq 'x'' or PartitionKey ne ''' and N ge 3 and Big lt 1099511627776L "
        "and At lt datetime'2026-03-01T12:00:00.123456Z' and B eq false"
    )


@given(st.text())
def test_a_string_parameter_never_leaves_its_quotes(value: str) -> None:
    literal = odata.substitute("RowKey eq @v", {"v": value})[len("RowKey eq ") :]
    assert literal.startswith("'") and literal.endswith("'")
    assert literal[1:-1].replace("''", "").count("'") == 0
    assert literal[1:-1].replace("''", "'") == value


def test_a_missing_parameter_is_named() -> None:
    with pytest.raises(KeyError, match="@pk"):
        odata.substitute("PartitionKey eq @pk", {})


# ------------------------------------------------------------------------ transactions


def test_a_transaction_is_one_changeset_in_order() -> None:
    boundary, body = batch.build(
        [
            batch.Operation("PUT", "http://h/t(PartitionKey='p',RowKey='a')", {"X": 1}, 'W/"1"'),
            batch.Operation("DELETE", "http://h/t(PartitionKey='p',RowKey='b')", None, "*"),
        ]
    )
    text = body.decode()
    assert text.startswith(f"--{boundary}\r\nContent-Type: multipart/mixed; boundary=changeset_")
    assert text.index("PUT http://h/t(") < text.index("DELETE http://h/t(")
    assert 'If-Match: W/"1"' in text and "If-Match: *" in text
    assert text.rstrip().endswith(f"--{boundary}--")


ANSWER = (
    "--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_1\r\n\r\n"
    "--changesetresponse_1\r\nContent-Type: application/http\r\n"
    "Content-Transfer-Encoding: binary\r\n\r\n"
    'HTTP/1.1 204 No Content\r\nETag: W/"a"\r\n\r\n\r\n'
    "--changesetresponse_1\r\nContent-Type: application/http\r\n"
    "Content-Transfer-Encoding: binary\r\n\r\n"
    'HTTP/1.1 201 Created\r\nETag: W/"b"\r\nContent-Type: application/json\r\n\r\n{"x":1}\r\n'
    "--changesetresponse_1--\r\n--batchresponse_1--\r\n"
)


def test_a_transactions_answers_are_read_in_order() -> None:
    parts = batch.parse(ANSWER)
    assert [(p.status, p.headers["etag"]) for p in parts] == [(204, 'W/"a"'), (201, 'W/"b"')]
    assert parts[1].body == '{"x":1}'


# ------------------------------------------------------------------------------- auth


def test_shared_key_signs_verb_type_date_and_resource() -> None:
    key = SharedKey.of("acct", KEY)
    headers = {"x-ms-date": "Sun, 01 Mar 2026 12:00:00 GMT", "Content-Type": "application/json"}
    signed = key.authorization("POST", "/acct/orders?comp=x&y=1", headers)
    import hashlib
    import hmac

    text = "POST\n\napplication/json\nSun, 01 Mar 2026 12:00:00 GMT\n/acct/acct/orders?comp=x"
    digest = hmac.new(b"k" * 32, text.encode(), hashlib.sha256).digest()
    assert signed == f"SharedKey acct:{base64.b64encode(digest).decode()}"


def test_connection_strings() -> None:
    parsed = parse_connection_string(CS)
    assert parsed.endpoint == "http://h:1/acct" and parsed.auth.account == "acct"
    cloud = parse_connection_string(
        f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={KEY}"
    )
    assert cloud.endpoint == "https://a.table.core.windows.net"
    dev = parse_connection_string("UseDevelopmentStorage=true")
    assert dev.endpoint == "http://127.0.0.1:10002/devstoreaccount1"
    with pytest.raises(ValueError, match="lacks AccountName and AccountKey"):
        parse_connection_string("TableEndpoint=http://h")
    with pytest.raises(ValueError, match="not base64"):
        parse_connection_string("AccountName=a;AccountKey=%%%")


def test_a_token_is_reused_until_five_minutes_before_it_expires(monkeypatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("core.tablestorage.auth.time.time", lambda: now[0])
    issued: list[str] = []

    class Credential:
        def get_token(self, scope: str) -> Any:
            assert scope == "https://storage.azure.com/.default"
            issued.append(f"t{len(issued)}")
            return SimpleNamespace(token=issued[-1], expires_on=now[0] + 3600)

    bearer = BearerToken(Credential())
    assert bearer.authorization("GET", "/x", {}) == "Bearer t0"
    now[0] += 3600 - 301
    assert bearer.authorization("GET", "/x", {}) == "Bearer t0"
    now[0] += 2
    assert bearer.authorization("GET", "/x", {}) == "Bearer t1"


# ------------------------------------------------------------------ retries and errors


def service(answers: list[Any], seen: list[Sent] | None = None) -> TableService:
    """A service whose transport answers from ``answers`` in turn (a response or an error)."""

    async def handler(request: httpx.Request) -> httpx.Response:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    hook = seen.append if seen is not None else None
    return TableService.from_connection_string(
        CS, request_hook=hook, transport=httpx.MockTransport(handler)
    )


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch) -> list[float]:
    """The client's backoff waits, instead of waiting: the client module's asyncio (it uses only
    its sleep) is swapped for one whose sleep records, the loop's own left alone."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(client, "asyncio", SimpleNamespace(sleep=sleep))
    return waits


def error(status: int, code: str) -> httpx.Response:
    body = {"odata.error": {"code": code, "message": {"value": f"0:{code} happened"}}}
    return httpx.Response(status, json=body)


def entity(pk: str = "p", rk: str = "r", etag: str = "e") -> httpx.Response:
    return httpx.Response(200, json={"PartitionKey": pk, "RowKey": rk, "odata.etag": etag})


def test_io_is_awaited_and_building_is_not() -> None:
    for name in (
        "get_entity", "create_entity", "upsert_entity", "update_entity", "delete_entity",
        "submit_transaction", "close", "__aenter__", "__aexit__",
    ):  # fmt: skip
        assert inspect.iscoroutinefunction(getattr(client.Table, name)), name
    for name in ("create_table_if_not_exists", "delete_table", "request", "close"):
        assert inspect.iscoroutinefunction(getattr(client.TableService, name)), name
    for name in ("from_connection_string", "with_credential", "get_table_client", "url"):
        assert not inspect.iscoroutinefunction(getattr(client.TableService, name)), name
    assert not inspect.iscoroutinefunction(client.Table.query_entities)
    assert client.Sent is tablestorage.Sent


async def test_transient_failures_are_retried_and_each_attempt_is_counted(no_backoff) -> None:
    seen: list[Sent] = []
    answers = [httpx.ConnectError("refused"), httpx.Response(503), entity()]
    async with service(answers, seen) as svc:
        row = await svc.get_table_client("t").get_entity("p", "r")
    assert row.metadata["etag"] == "e"
    assert [s.method for s in seen] == ["GET", "GET", "GET"]
    assert seen[0].url == "http://h:1/acct/t(PartitionKey='p',RowKey='r')"
    assert len(no_backoff) == 2


async def test_retries_end() -> None:
    table = service([httpx.ConnectError("refused")] * 4).get_table_client("t")
    with pytest.raises(ServiceRequestError, match="refused"):
        await table.get_entity("p", "r")
    with pytest.raises(HttpResponseError) as raised:
        await service([httpx.Response(503)] * 4).get_table_client("t").get_entity("p", "r")
    assert raised.value.status_code == 503


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
async def test_errors_have_the_sdks_types_and_codes(status: int, code: str, kind: type) -> None:
    table = service([error(status, code)]).get_table_client("t")
    with pytest.raises(kind) as raised:
        await table.create_entity({"PartitionKey": "p", "RowKey": "r"})
    assert type(raised.value) is kind
    assert raised.value.status_code == status and raised.value.error_code == code
    assert code in str(raised.value)


async def test_a_failed_transaction_names_its_operation() -> None:
    failed = (
        "--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_1\r\n\r\n"
        "--changesetresponse_1\r\nContent-Type: application/http\r\n\r\n"
        "HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\n\r\n"
        '{"odata.error":{"code":"EntityAlreadyExists","message":{"value":"1:exists"}}}\r\n'
        "--changesetresponse_1--\r\n--batchresponse_1--\r\n"
    )
    table = service([httpx.Response(202, text=failed)]).get_table_client("t")
    with pytest.raises(TableTransactionError) as raised:
        await table.submit_transaction(
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


async def test_a_transaction_the_service_would_refuse_is_refused_before_any_request() -> None:
    seen: list[Sent] = []
    table = service([], seen).get_table_client("t")
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
    assert seen == []


async def test_deleting_a_row_or_table_already_gone_is_not_an_error() -> None:
    svc = service([error(404, "ResourceNotFound"), error(404, "TableNotFound")])
    await svc.get_table_client("t").delete_entity("p", "r")
    await svc.delete_table("t")


async def test_a_table_that_owns_its_service_closes_it() -> None:
    closed: list[str] = []

    class Transport(httpx.MockTransport):
        async def aclose(self) -> None:
            closed.append("closed")

    svc = TableService.from_connection_string(CS, transport=Transport(lambda r: entity()))
    async with svc.get_table_client("t") as table:  # not its owner: leaves the service open
        await table.get_entity("p", "r")
    assert closed == []
    async with svc.get_table_client("t", owns_service=True) as table:
        await table.get_entity("p", "r")
    assert closed == ["closed"]


# ---------------------------------------------------------- what each operation sends


def recording(log: list[tuple[str, str, bytes]]) -> Handler:
    """A handler answering as the service would, recording each request."""

    def handler(request: httpx.Request) -> httpx.Response:
        log.append((request.method, str(request.url), request.content))
        if request.method == "GET" and "()" in request.url.path:
            return httpx.Response(200, json={"value": [{"PartitionKey": "p", "RowKey": "r"}]})
        if request.method == "GET":
            return entity()
        if request.url.path.endswith("$batch"):
            answer = (
                "--b\r\nContent-Type: multipart/mixed; boundary=c\r\n\r\n"
                + (
                    "--c\r\nContent-Type: application/http\r\n\r\n"
                    'HTTP/1.1 204 No Content\r\nETag: W/"x"\r\n\r\n\r\n'
                )
                * 2
                + "--c--\r\n--b--\r\n"
            )
            return httpx.Response(202, text=answer)
        if request.url.path.endswith("/Tables"):
            return error(409, "TableAlreadyExists")
        return httpx.Response(204, headers={"ETag": 'W/"x"'})

    return handler


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


def _comparable(log: list[tuple[str, str, bytes]]) -> list[tuple[str, str, bytes]]:
    """Requests without what differs each time (a transaction's boundaries)."""
    out = []
    for method, url, content in log:
        text = content.decode()
        for line in text.splitlines():
            if line.startswith(("--batch_", "--changeset_")) or "boundary=" in line:
                text = text.replace(line, "")
        out.append((method, url, text.encode()))
    return out


ROW_URL = "http://h:1/acct/t(PartitionKey='p',RowKey='r')"
BATCH_URLS = (
    "http://h:1/acct/t(PartitionKey='p',RowKey='a')",
    "http://h:1/acct/t(PartitionKey='p',RowKey='b')",
)
PART = "Content-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n"
HEADERS = "Accept: application/json;odata=minimalmetadata\r\nDataServiceVersion: 3.0\r\n"
TRANSACTION = (
    f"\r\n\r\n\r\n\r\n{PART}PATCH {BATCH_URLS[0]} HTTP/1.1\r\n{HEADERS}"
    "Content-Type: application/json\r\nPrefer: return-no-content\r\n\r\n"
    '{"PartitionKey":"p","RowKey":"a"}\r\n\r\n'
    f"{PART}DELETE {BATCH_URLS[1]} HTTP/1.1\r\n{HEADERS}If-Match: *\r\n\r\n\r\n--\r\n--\r\n"
)
REQUESTS = [
    ("POST", "http://h:1/acct/Tables", b'{"TableName":"t"}'),
    ("POST", "http://h:1/acct/t", b'{"PartitionKey":"p","RowKey":"r","N":1}'),
    ("GET", f"{ROW_URL}?$select=N", b""),
    ("PUT", ROW_URL, b'{"PartitionKey":"p","RowKey":"r"}'),
    ("PATCH", ROW_URL, b'{"PartitionKey":"p","RowKey":"r"}'),
    ("DELETE", ROW_URL, b""),
    ("POST", "http://h:1/acct/$batch", TRANSACTION.encode()),
    ("GET", "http://h:1/acct/t()?$filter=N%20eq%201", b""),
]
"""What OPS send after creating the table, then the query: one request each."""
ETAG = {"etag": 'W/"x"'}
RESULTS = [ETAG, {"PartitionKey": "p", "RowKey": "r"}, ETAG, ETAG, None, [ETAG, ETAG]]


async def test_each_operation_sends_its_request_and_reports_it_once() -> None:
    log: list[tuple[str, str, bytes]] = []
    seen: list[Sent] = []
    svc = TableService.from_connection_string(
        CS, request_hook=seen.append, transport=httpx.MockTransport(recording(log))
    )
    await svc.create_table_if_not_exists("t")
    table = svc.get_table_client("t")
    for (name, args, kwargs), expected in zip(OPS, RESULTS, strict=True):
        assert await getattr(table, name)(*args, **kwargs) == expected, name
    rows = [dict(r) async for r in table.query_entities("N eq @n", parameters={"n": 1})]
    assert rows == [{"PartitionKey": "p", "RowKey": "r"}]
    assert _comparable(log) == REQUESTS
    assert [(s.method, s.url) for s in seen] == [(m, u) for m, u, _ in REQUESTS]
    assert len(seen) == len(OPS) + 2
    assert seen[-2].batch_urls == BATCH_URLS
    await svc.close()


# ------------------------------------------------------------------------------- pages


def paging(log: list[dict[str, list[str]]], fail_at: int | None = None) -> Handler:
    """Three pages of two rows, the service's continuation headers between them."""

    def handler(request: httpx.Request) -> httpx.Response:
        query = parse_qs(urlsplit(str(request.url)).query)
        log.append(query)
        start = int(query.get("NextRowKey", ["0"])[0])
        if fail_at is not None and start == fail_at:
            return error(500, "InternalError")
        rows = [{"PartitionKey": "p", "RowKey": str(i), "I": i} for i in (start, start + 1)]
        headers = {}
        if start + 2 < 6:
            headers = {
                "x-ms-continuation-NextPartitionKey": "p",
                "x-ms-continuation-NextRowKey": str(start + 2),
            }
        return httpx.Response(200, json={"value": rows}, headers=headers)

    return handler


def paged_service(log: list[dict[str, list[str]]], **options: Any) -> TableService:
    return TableService.from_connection_string(
        CS, transport=httpx.MockTransport(paging(log, **options))
    )


async def test_rows_are_read_a_page_at_a_time_as_they_are_walked() -> None:
    log: list[dict[str, list[str]]] = []
    table = paged_service(log).get_table_client("t")
    rows = table.query_entities("I ge @low", parameters={"low": 0}, results_per_page=2)
    assert log == []  # no request until walked
    seen = []
    async for row in rows:
        seen.append(row["I"])
        if row["I"] == 2:
            assert len(log) == 2
    assert seen == [0, 1, 2, 3, 4, 5] and len(log) == 3
    assert log[0] == {"$filter": ["I ge 0"], "$top": ["2"]}
    assert log[1]["NextPartitionKey"] == ["p"] and log[1]["NextRowKey"] == ["2"]
    assert [r["I"] async for r in table.list_entities(select=["I"])] == seen
    assert log[-1]["$select"] == ["I"]


async def test_pages_resume_from_a_continuation_token() -> None:
    log: list[dict[str, list[str]]] = []
    table = paged_service(log).get_table_client("t")
    pages = table.list_entities(results_per_page=2).by_page()
    first = await pages.__anext__()
    assert isinstance(first, odata.Page) and [r["I"] for r in first] == [0, 1]
    assert [r["I"] async for r in first] == [0, 1]  # as azure-core's async pages walk
    assert pages.continuation_token == {"PartitionKey": "p", "RowKey": "2"}
    resumed = table.list_entities(results_per_page=2).by_page(pages.continuation_token)
    rest = [[r["I"] for r in page] async for page in resumed]
    assert rest == [[2, 3], [4, 5]] and resumed.continuation_token is None
    assert len(log) == 3


async def test_a_failed_page_says_where_it_started() -> None:
    log: list[dict[str, list[str]]] = []
    table = paged_service(log, fail_at=4).get_table_client("t")
    pages = table.list_entities().by_page()
    await pages.__anext__()
    await pages.__anext__()
    with pytest.raises(HttpResponseError) as raised:
        await pages.__anext__()
    assert raised.value.continuation_token == {"PartitionKey": "p", "RowKey": "4"}


# -------------------------------------------------------------------------- Entra tokens


class Credential:
    """Hands out t0, t1, ...: each ``lifetime`` seconds long, after ``hold`` is set."""

    def __init__(self, lifetime: float) -> None:
        self.lifetime = lifetime
        self.issued: list[str] = []
        self.threads: list[str] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()

    def get_token(self, scope: str) -> Any:
        assert scope == auth.STORAGE_SCOPE
        self.entered.set()
        self.hold.wait(5)
        self.threads.append(threading.current_thread().name)
        self.issued.append(f"t{len(self.issued)}")
        return SimpleNamespace(token=self.issued[-1], expires_on=time.time() + self.lifetime)


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_token_is_renewed_ahead_on_a_thread_while_requests_go_on(monkeypatch) -> None:
    monkeypatch.setattr(auth, "_RENEW_AHEAD_S", 599.8)  # renew 0.2 s after each fetch
    credential = Credential(lifetime=600)
    bearer = BearerToken(credential)
    assert bearer.authorization("GET", "/x", {}) == "Bearer t0"  # the first: fetched here
    credential.hold.clear()  # the renewal waits on the token endpoint ...
    credential.entered.clear()
    assert credential.entered.wait(5)
    started = time.monotonic()
    assert bearer.authorization("GET", "/x", {}) == "Bearer t0"  # ... requests do not
    assert time.monotonic() - started < 0.5
    credential.hold.set()
    wait_for(lambda: credential.issued == ["t0", "t1"])
    wait_for(lambda: bearer.authorization("GET", "/x", {}) == "Bearer t1")
    assert credential.threads[1] != threading.current_thread().name
    bearer._timer.cancel()


def test_the_same_token_again_is_asked_for_again_later(monkeypatch) -> None:
    monkeypatch.setattr(auth, "_RENEW_AHEAD_S", 599.9)
    monkeypatch.setattr(auth, "_RETRY_S", 0.05)
    asked: list[float] = []
    fixed = time.time() + 600

    class Cached:
        def get_token(self, scope: str) -> Any:
            asked.append(time.time())
            return SimpleNamespace(token="same", expires_on=fixed)

    bearer = BearerToken(Cached())
    assert bearer.authorization("GET", "/x", {}) == "Bearer same"
    wait_for(lambda: len(asked) >= 3)  # renewals kept asking, every _RETRY_S
    bearer._timer.cancel()


def test_a_failed_renewal_leaves_the_token_and_tries_again(monkeypatch, caplog) -> None:
    monkeypatch.setattr(auth, "_RENEW_AHEAD_S", 599.9)
    monkeypatch.setattr(auth, "_RETRY_S", 0.05)
    calls: list[int] = []

    class Flaky:
        def get_token(self, scope: str) -> Any:
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("token endpoint down")
            return SimpleNamespace(token=f"t{len(calls)}", expires_on=time.time() + 600)

    bearer = BearerToken(Flaky())
    assert bearer.authorization("GET", "/x", {}) == "Bearer t1"
    wait_for(lambda: len(calls) >= 3)
    assert "token endpoint down" in caplog.text
    wait_for(lambda: bearer.authorization("GET", "/x", {}) == "Bearer t3")
    bearer._timer.cancel()


def test_an_async_credential_is_refused_by_name() -> None:
    class AsyncCredential:
        async def get_token(self, scope: str) -> Any:
            raise AssertionError

    with pytest.raises(TypeError, match="sync credential"):
        TableService.with_credential("https://a.table.core.windows.net", AsyncCredential())


async def test_requests_carry_the_bearer_token() -> None:
    headers: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        headers.append(request.headers["Authorization"])
        return entity()

    credential = Credential(lifetime=3600)
    svc = TableService.with_credential(
        "https://a.table.core.windows.net", credential, transport=httpx.MockTransport(handler)
    )
    await svc.get_table_client("t").get_entity("p", "r")
    await svc.get_table_client("t").get_entity("p", "r")
    assert headers == ["Bearer t0", "Bearer t0"]
    await svc.close()
