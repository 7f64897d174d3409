"""The app's Table client on azure-core's pipeline: the part of azure-data-tables'
``TableClient`` the app uses, async, with its requests sent through
:mod:`adapters.tables.pipeline` (aiohttp, the Tables retry semantics, request ids, tracing,
Shared Key or Entra tokens).

Why not azure-data-tables itself: its request preparation costs several times more client CPU
than the service's answer takes (docs/performance.md). The wire format stays the app's own,
written and read here: OData JSON (:mod:`adapters.tables.odata`) and ``multipart/mixed``
transactions (:mod:`adapters.tables.batch`, where the SDK runs each operation through a
pipeline on a thread pool and the ``email`` package). The entity types are the SDK's, and so
are the errors (azure-core's, and the SDK's ``TableTransactionError``), so the store's code and
tests read the same, and rows written here read the same through azure-data-tables
(tests/integration/test_tablestorage.py).

Every method that makes a request is ``async``; queries are async iterators (``async for``),
their pages lists. Safe to use from several tasks of one event loop.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import quote

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.core.pipeline.transport import AsyncHttpResponse, HttpRequest
from azure.data.tables import TableTransactionError, UpdateMode

from adapters.tables import batch, odata, pipeline
from adapters.tables.auth import SharedKey, parse_connection_string

API_VERSION: Final = "2019-02-02"
"""The first version that accepts Entra tokens; the one azure-data-tables 12 sends."""
MAX_TRANSACTION: Final = 100
_MINIMAL: Final = "application/json;odata=minimalmetadata"
_HEADERS: Final = {
    "x-ms-version": API_VERSION,
    "DataServiceVersion": "3.0",
    "MaxDataServiceVersion": "3.0;NetFx",
    "Accept": _MINIMAL,
}

Operation = tuple[Any, ...]


class TableService:
    """The account's table endpoint: builds :class:`Table` clients sharing one pipeline.

    ``credential``: a :class:`~adapters.tables.auth.SharedKey` (connection strings: Azurite),
    or an async token credential (``azure.identity.aio``). ``request_hook`` is told of every
    attempt, retries included (:class:`~adapters.tables.pipeline.Sent`). ``options`` set the
    connections (:class:`~adapters.tables.pipeline.Sender`: their number, timeouts, TLS).
    """

    def __init__(
        self,
        endpoint: str,
        credential: SharedKey | Any,
        *,
        request_hook: pipeline.Hook | None = None,
        **options: Any,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._headers = {**_HEADERS, "User-Agent": pipeline.user_agent()}
        policies = pipeline.policies(self.endpoint, credential, request_hook)
        self._sender = pipeline.Sender(policies, **options)

    @classmethod
    def from_connection_string(cls, text: str, **options: Any) -> TableService:
        parsed = parse_connection_string(text)
        return cls(parsed.endpoint, parsed.auth, **options)

    def get_table_client(self, table_name: str, *, owns_service: bool = False) -> Table:
        """A client of one table; with ``owns_service``, closing it closes this service too
        (a caller that keeps only the table)."""
        return Table(self, table_name, owns_service=owns_service)

    async def create_table_if_not_exists(self, table_name: str) -> None:
        answer = await self.request("POST", "Tables", body={"TableName": table_name})
        if answer.status_code != 409:  # the table exists already
            raise_for(answer, f"creating table {table_name}")

    async def delete_table(self, table_name: str) -> None:
        answer = await self.request("DELETE", f"Tables('{quote(table_name, safe='')}')")
        if answer.status_code != 404:
            raise_for(answer, f"deleting table {table_name}")

    async def close(self) -> None:
        await self._sender.close()

    async def __aenter__(self) -> TableService:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def url(self, path: str) -> str:
        return f"{self.endpoint}/{path}"

    async def request(
        self,
        verb: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        batch_urls: Sequence[str] = (),
    ) -> AsyncHttpResponse:
        """Send one request (``path`` relative to the endpoint, already encoded) through the
        pipeline, which retries what the Tables policy retries, by the invocation's deadline.
        The answer is returned whatever its status, its body read; no answer raises azure-core's
        ``ServiceRequestError`` or ``ServiceResponseError``, or, for a write that may have been
        applied, :class:`~adapters.tables.pipeline.OutcomeUnknown`."""
        sent = {**self._headers, "x-ms-client-request-id": str(uuid.uuid4())}
        if body is not None:
            content = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
            sent["Content-Type"] = "application/json"
        if headers:
            sent.update(headers)
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in (params or {}).items())
        url = self.url(path) + (f"?{query}" if query else "")
        request = HttpRequest(verb, url, headers=sent, data=content)
        return await self._sender.send(request, batch_urls)


class Table:
    """One table: point reads, conditional writes, transactions and paged queries."""

    def __init__(self, service: TableService, table_name: str, *, owns_service: bool = False):
        self.service = service
        self.table_name = table_name
        self._owns_service = owns_service

    async def close(self) -> None:
        """The pipeline belongs to the service: closed here only if this table owns it."""
        if self._owns_service:
            await self.service.close()

    async def __aenter__(self) -> Table:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # --------------------------------------------------------------------------- entities

    async def get_entity(
        self, partition_key: str, row_key: str, *, select: Sequence[str] | None = None
    ) -> odata.Entity:
        params = {"$select": ",".join(select)} if select else None
        path = self._entity(partition_key, row_key)
        answer = await self.service.request("GET", path, params=params)
        raise_for(answer, f"reading {partition_key}/{row_key} of {self.table_name}")
        entity = odata.decode(json.loads(answer.body()))
        entity.metadata.setdefault("etag", answer.headers.get("etag"))
        return entity

    async def create_entity(self, entity: Mapping[str, Any]) -> dict[str, Any]:
        answer = await self.service.request(
            "POST",
            quote(self.table_name, safe=""),
            body=odata.encode(entity),
            headers={"Prefer": "return-no-content"},
        )
        raise_for(answer, f"inserting into {self.table_name}")
        return _metadata(answer.headers)

    async def upsert_entity(
        self, entity: Mapping[str, Any], mode: UpdateMode = UpdateMode.MERGE
    ) -> dict[str, Any]:
        return await self._write(entity, mode, if_match=None)

    async def update_entity(
        self,
        entity: Mapping[str, Any],
        mode: UpdateMode = UpdateMode.MERGE,
        *,
        etag: str | None = None,
        match_condition: MatchConditions = MatchConditions.Unconditionally,
    ) -> dict[str, Any]:
        return await self._write(entity, mode, if_match=_if_match(etag, match_condition))

    async def delete_entity(
        self,
        partition_key: str,
        row_key: str,
        *,
        etag: str | None = None,
        match_condition: MatchConditions = MatchConditions.Unconditionally,
    ) -> None:
        """Delete a row; a row already gone is not an error (as in the SDK)."""
        answer = await self.service.request(
            "DELETE",
            self._entity(partition_key, row_key),
            headers={"If-Match": _if_match(etag, match_condition)},
        )
        if answer.status_code != 404:
            raise_for(answer, f"deleting {partition_key}/{row_key} of {self.table_name}")

    async def _write(
        self, entity: Mapping[str, Any], mode: UpdateMode, *, if_match: str | None
    ) -> dict:
        headers = {} if if_match is None else {"If-Match": if_match}
        answer = await self.service.request(
            _verb(mode),
            self._entity(entity["PartitionKey"], entity["RowKey"]),
            body=odata.encode(entity),
            headers=headers,
        )
        raise_for(answer, f"writing {entity['PartitionKey']}/{entity['RowKey']}")
        return _metadata(answer.headers)

    def _entity(self, partition_key: str, row_key: str) -> str:
        return odata.entity_path(quote(self.table_name, safe=""), partition_key, row_key)

    # ----------------------------------------------------------------------- transactions

    async def submit_transaction(self, operations: Iterable[Operation]) -> list[dict[str, Any]]:
        """Apply ``operations`` (the SDK's tuples: ``("create", entity)``, ``("update", entity,
        {"mode": …, "etag": …, "match_condition": …})``, ``("upsert", …)``, ``("delete",
        entity)``) all or none; each answer's metadata (its ``etag``) in order. Raises
        :class:`TableTransactionError` with the failing operation's status and error code."""
        operations = list(operations)
        if not operations:
            return []
        _check_transaction(operations)
        ops = [self._operation(op) for op in operations]
        boundary, content = batch.build(ops)
        answer = await self.service.request(
            "POST",
            "$batch",
            content=content,
            headers={"Content-Type": f"multipart/mixed; boundary={boundary}"},
            batch_urls=[op.url for op in ops],
        )
        if answer.status_code != 202:
            raise_for(answer, f"a transaction on {self.table_name}")
        parts = batch.parse(_text(answer))
        failed = next((p for p in parts if p.status >= 300), None)
        if failed is not None:
            raise _transaction_error(failed)
        if len(parts) != len(ops):
            raise pipeline.OutcomeUnknown(
                f"a transaction on {self.table_name} was accepted, but its answer holds "
                f"{len(parts)} of {len(ops)} operations; it may have been applied: read to know"
            )
        return [_metadata(part.headers) for part in parts]

    def _operation(self, op: Operation) -> batch.Operation:
        kind, entity = op[0], op[1]
        options: Mapping[str, Any] = op[2] if len(op) > 2 else {}
        url = self.service.url(self._entity(entity["PartitionKey"], entity["RowKey"]))
        if kind == "create":
            return batch.Operation("POST", self.service.url(quote(self.table_name, safe="")),
                                   odata.encode(entity))  # fmt: skip
        mode = options.get("mode", UpdateMode.MERGE)
        if kind == "upsert":
            return batch.Operation(_verb(mode), url, odata.encode(entity))
        condition = _if_match(
            options.get("etag"), options.get("match_condition", MatchConditions.Unconditionally)
        )
        if kind == "update":
            return batch.Operation(_verb(mode), url, odata.encode(entity), condition)
        if kind == "delete":
            return batch.Operation("DELETE", url, None, condition)
        raise ValueError(f"unknown transaction operation {kind!r}: use create, update, upsert "
                         "or delete")  # fmt: skip

    # ---------------------------------------------------------------------------- queries

    def query_entities(
        self,
        query_filter: str,
        *,
        parameters: Mapping[str, Any] | None = None,
        select: Sequence[str] | None = None,
        results_per_page: int | None = None,
    ) -> Paged:
        """Rows matching ``query_filter`` (each ``@name`` replaced by its value from ``parameters``
        as OData literals), paged; ``.by_page(continuation_token)`` resumes a listing. No request
        until the rows are walked."""
        params = {"$filter": odata.substitute(query_filter, parameters)}
        return self._paged(params, select, results_per_page)

    def list_entities(
        self, *, select: Sequence[str] | None = None, results_per_page: int | None = None
    ) -> Paged:
        return self._paged({}, select, results_per_page)

    def _paged(
        self, params: dict[str, str], select: Sequence[str] | None, per_page: int | None
    ) -> Paged:
        if select:
            params["$select"] = ",".join(select)
        if per_page:
            params["$top"] = str(per_page)
        return Paged(self, params)


class Paged:
    """A query's rows, read a page (one request) at a time as they are walked, as azure-core's
    ``AsyncItemPaged`` reads them: walk the rows, or :meth:`by_page` for the pages."""

    def __init__(self, table: Table, params: dict[str, str]) -> None:
        self._table = table
        self._params = params

    def by_page(self, continuation_token: dict[str, str] | None = None) -> Pages:
        """The pages from the start, or from where ``continuation_token`` (a page iterator's
        ``continuation_token``) says the listing stopped."""
        return Pages(self._table, self._params, continuation_token)

    async def __aiter__(self) -> AsyncIterator[odata.Entity]:
        async for page in self.by_page():
            for row in page:
                yield row


class Pages:
    """The pages of a query (each an :class:`odata.Page`, a list of rows), one request each, as
    azure-core's page iterator: ``continuation_token`` is where the next page starts, None once
    the last has been read. An error says on its ``continuation_token`` where the failed page
    started (as azure-core's do)."""

    def __init__(
        self, table: Table, params: dict[str, str], continuation_token: dict[str, str] | None
    ) -> None:
        self._table = table
        self._params = params
        self.continuation_token = continuation_token
        self._asked = False

    def __aiter__(self) -> Pages:
        return self

    async def __anext__(self) -> odata.Page:
        token = self.continuation_token
        if token is None and self._asked:
            raise StopAsyncIteration
        page = dict(self._params)
        if token:
            page["NextPartitionKey"] = token["PartitionKey"]
            if token.get("RowKey"):
                page["NextRowKey"] = token["RowKey"]
        table = self._table
        try:
            answer = await table.service.request(
                "GET", f"{quote(table.table_name, safe='')}()", params=page
            )
            raise_for(answer, f"querying {table.table_name}")
        except AzureError as error:
            error.continuation_token = token
            raise
        self._asked = True
        self.continuation_token = _continuation(answer.headers)
        rows = json.loads(answer.body()).get("value", [])
        return odata.Page(odata.decode(row) for row in rows)


def _check_transaction(operations: Sequence[Operation]) -> None:
    """What the service would refuse, refused before any request (as the SDK does)."""
    if len(operations) > MAX_TRANSACTION:
        raise ValueError(
            f"a transaction holds at most {MAX_TRANSACTION} operations, not {len(operations)}"
        )
    partitions = {op[1]["PartitionKey"] for op in operations}
    if len(partitions) > 1:
        raise ValueError(
            f"the operations of one transaction must share a PartitionKey, not {len(partitions)}"
        )


def _continuation(headers: Mapping[str, str]) -> dict[str, str] | None:
    partition = headers.get("x-ms-continuation-NextPartitionKey")
    if partition is None:
        return None
    return {"PartitionKey": partition, "RowKey": headers.get("x-ms-continuation-NextRowKey", "")}


def _verb(mode: UpdateMode) -> str:
    return "PUT" if mode == UpdateMode.REPLACE else "PATCH"


def _if_match(etag: str | None, condition: MatchConditions) -> str:
    if condition == MatchConditions.IfNotModified:
        if not etag:
            raise ValueError("IfNotModified needs the etag the row was read with")
        return etag
    return "*"


def _metadata(headers: Mapping[str, str]) -> dict[str, Any]:
    return {"etag": headers.get("etag")}


def _text(answer: AsyncHttpResponse) -> str:
    """The body as text: the service writes UTF-8 (read here rather than by azure-core's
    ``text()``, which guesses an encoding when the answer names none)."""
    return answer.body().decode("utf-8", errors="replace")


_ERRORS: Final[dict[int, type[HttpResponseError]]] = {
    401: ClientAuthenticationError,
    404: ResourceNotFoundError,
    409: ResourceExistsError,
    412: ResourceModifiedError,
}


def raise_for(answer: AsyncHttpResponse, doing: str) -> None:
    """Raise azure-core's error for a failed answer (401, 404, 409, 412 by their own types), with
    the service's error code and message, and the answer (its headers: ``x-ms-request-id``)."""
    if answer.status_code < 300:
        return
    code, message = _error_of(_text(answer))
    error = _ERRORS.get(answer.status_code, HttpResponseError)(
        message=f"{doing}: {answer.status_code} {code or answer.reason}: {message}",
        response=answer,
    )
    error.status_code, error.error_code = answer.status_code, code
    raise error


def _transaction_error(failed: batch.Part) -> TableTransactionError:
    """The failed operation's refusal: a change set is applied whole or not at all."""
    code, message = _error_of(failed.body)
    error = TableTransactionError(message=message or f"0:{failed.status}")
    error.status_code, error.error_code = failed.status, code
    return error


def _error_of(text: str) -> tuple[str | None, str]:
    """(error code, message) of an OData error body, or (None, the text)."""
    try:
        error = json.loads(text)["odata.error"]
    except (ValueError, KeyError, TypeError):
        return None, text[:500]
    message = error.get("message")
    message = message.get("value", "") if isinstance(message, dict) else str(message or "")
    return error.get("code"), message
