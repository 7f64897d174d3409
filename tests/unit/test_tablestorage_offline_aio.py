"""core.tablestorage without a server (httpx.MockTransport stands in for the service, as in
test_tablestorage_offline.py): the async client's retries, errors, transactions and pages; that
it sends exactly the requests the sync twin sends, each reported once to the request hook; the
pages both twins hand out; and the Entra token renewed off the request path."""

from __future__ import annotations

import base64
import inspect
import threading
import time
from collections.abc import Callable
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
from azure.data.tables import TableTransactionError, UpdateMode

from core import tablestorage
from core.tablestorage import Sent, TableService, auth, client, odata
from core.tablestorage import client as sync_client
from core.tablestorage.auth import BearerToken

pytestmark = pytest.mark.anyio

KEY = base64.b64encode(b"k" * 32).decode()
CS = f"AccountName=acct;AccountKey={KEY};TableEndpoint=http://h:1/acct"

Handler = Callable[[httpx.Request], httpx.Response]


def service(answers: list[Any], seen: list[Sent] | None = None) -> TableService:
    """An async service whose transport answers from ``answers`` in turn (a response or an
    error)."""

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
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(client.time, "sleep", sleep)
    monkeypatch.setattr(sync_client.time, "sleep", waits.append)
    return waits


def error(status: int, code: str) -> httpx.Response:
    body = {"odata.error": {"code": code, "message": {"value": f"0:{code} happened"}}}
    return httpx.Response(status, json=body)


def entity(pk: str = "p", rk: str = "r", etag: str = "e") -> httpx.Response:
    return httpx.Response(200, json={"PartitionKey": pk, "RowKey": rk, "odata.etag": etag})


async def test_io_is_async_and_the_pure_parts_are_the_sync_ones() -> None:
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
    assert client.Sent is sync_client.Sent is tablestorage.Sent
    assert client.TransportError is sync_client.TransportError
    assert client.Answer is sync_client.Answer and client.Headers is sync_client.Headers
    from core.tablestorage import aio

    assert aio.Entity is tablestorage.Entity and aio.Page is tablestorage.Page
    assert set(tablestorage.__all__) == set(aio.__all__)


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


# ------------------------------------------------------ the same requests as the sync twin


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


async def test_each_operation_sends_the_sync_twins_requests_and_reports_each_once() -> None:
    sync_log: list[tuple[str, str, bytes]] = []
    async_log: list[tuple[str, str, bytes]] = []
    sync_seen: list[Sent] = []
    async_seen: list[Sent] = []
    sync_svc = sync_client.TableService.from_connection_string(
        CS, request_hook=sync_seen.append, transport=httpx.MockTransport(recording(sync_log))
    )
    async_svc = TableService.from_connection_string(
        CS, request_hook=async_seen.append, transport=httpx.MockTransport(recording(async_log))
    )
    sync_svc.create_table_if_not_exists("t")
    await async_svc.create_table_if_not_exists("t")
    sync_table, async_table = sync_svc.get_table_client("t"), async_svc.get_table_client("t")
    for name, args, kwargs in OPS:
        expected = getattr(sync_table, name)(*args, **kwargs)
        assert await getattr(async_table, name)(*args, **kwargs) == expected, name
    assert [dict(r) for r in sync_table.query_entities("N eq @n", parameters={"n": 1})] == [
        dict(r) async for r in async_table.query_entities("N eq @n", parameters={"n": 1})
    ]
    assert _comparable(async_log) == _comparable(sync_log)
    assert async_seen == sync_seen and len(async_seen) == len(OPS) + 2
    assert async_seen[-2].batch_urls == (
        "http://h:1/acct/t(PartitionKey='p',RowKey='a')",
        "http://h:1/acct/t(PartitionKey='p',RowKey='b')",
    )
    sync_svc.close()
    await async_svc.close()


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


def test_the_sync_twin_pages_alike() -> None:
    log: list[dict[str, list[str]]] = []
    table = sync_client.TableService.from_connection_string(
        CS, transport=httpx.MockTransport(paging(log))
    ).get_table_client("t")
    assert [r["I"] for r in table.query_entities("I ge 0")] == [0, 1, 2, 3, 4, 5]
    pages = table.list_entities().by_page()
    assert [r["I"] for r in next(pages)] == [0, 1]
    rest = table.list_entities().by_page(continuation_token=pages.continuation_token)
    assert [[r["I"] for r in page] for page in rest] == [[2, 3], [4, 5]]
    assert next(iter(table.list_entities()))["I"] == 0  # one request, the rest never read
    assert len(log) == 3 + 1 + 2 + 1


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


async def test_a_token_is_renewed_ahead_on_a_thread_while_requests_go_on(monkeypatch) -> None:
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


async def test_the_same_token_again_is_asked_for_again_later(monkeypatch) -> None:
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


async def test_a_failed_renewal_leaves_the_token_and_tries_again(monkeypatch, caplog) -> None:
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


async def test_an_async_credential_is_refused_by_name() -> None:
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
