"""The app's Table client (adapters.tables) against Azurite, checked against azure-data-tables:
rows written by one read the same through the other; conditional writes fail with the SDK's
errors (409, 412 on a stale ETag, 404); transactions commit all or nothing; queries page across
continuations and resume; concurrent requests share the connection pool; and each request is
reported to the request hook once."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import (
    EdmType,
    EntityProperty,
    TableClient,
    TableServiceClient,
    TableTransactionError,
    UpdateMode,
)

from adapters.op_counts import OperationCounts
from adapters.tables import Page, Sent, Table, TableService

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

ROW = {
    "PartitionKey": "o'1 %",
    "RowKey": "process",
    "S": "ünïcode 😀",
    "I": 5,
    "Big": EntityProperty(2**40, EdmType.INT64),
    "F": 1.5,
    "B": True,
    "D": datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC),
    "G": uuid.UUID(int=7),
    "Bin": b"\x00\x01",
}


@pytest.fixture
def names(unique_name) -> str:
    return unique_name("lean")


@pytest.fixture
def sent() -> list[Sent]:
    return []


@pytest.fixture
async def ours(azurite, names, sent) -> AsyncIterator[Table]:
    async with TableService.from_connection_string(
        azurite.connection_string, request_hook=sent.append
    ) as service:
        await service.create_table_if_not_exists(names)
        await service.create_table_if_not_exists(names)  # twice: already there is fine
        yield service.get_table_client(names)
        await service.delete_table(names)
        await service.delete_table(names)  # twice: already gone is fine


@pytest.fixture
def sdk(azurite, names, ours) -> Iterator[TableClient]:
    with TableServiceClient.from_connection_string(azurite.connection_string) as service:
        yield service.get_table_client(names)


async def test_rows_written_here_read_the_same_through_the_sdk(
    ours: Table, sdk: TableClient
) -> None:
    written = await ours.create_entity(ROW)
    theirs = sdk.get_entity(ROW["PartitionKey"], ROW["RowKey"])
    assert dict(theirs) == ROW and theirs.metadata["etag"] == written["etag"]
    mine = await ours.get_entity(ROW["PartitionKey"], ROW["RowKey"])
    assert dict(mine) == ROW and mine.metadata["etag"] == written["etag"]


async def test_rows_written_by_the_sdk_read_the_same_here(ours: Table, sdk: TableClient) -> None:
    sdk.create_entity(ROW)
    mine = await ours.get_entity(ROW["PartitionKey"], ROW["RowKey"])
    assert dict(mine) == ROW
    assert mine.metadata["etag"] == sdk.get_entity(ROW["PartitionKey"], "process").metadata["etag"]
    assert mine.metadata["timestamp"].tzinfo is not None
    selected = await ours.get_entity(ROW["PartitionKey"], "process", select=["S"])
    assert dict(selected) == {"S": ROW["S"]}


async def test_conditional_writes_and_their_errors(ours: Table) -> None:
    pk = ROW["PartitionKey"]
    etag = (await ours.create_entity(ROW))["etag"]
    with pytest.raises(ResourceExistsError) as exists:
        await ours.create_entity(ROW)
    assert (exists.value.status_code, exists.value.error_code) == (409, "EntityAlreadyExists")
    newer = (
        await ours.update_entity(
            {**ROW, "S": "v2"},
            mode=UpdateMode.REPLACE,
            etag=etag,
            match_condition=MatchConditions.IfNotModified,
        )
    )["etag"]
    with pytest.raises(ResourceModifiedError) as stale:  # the ETag read before v2
        await ours.update_entity(
            {**ROW, "S": "v3"}, etag=etag, match_condition=MatchConditions.IfNotModified
        )
    assert (stale.value.status_code, stale.value.error_code) == (
        412,
        "UpdateConditionNotSatisfied",
    )
    await ours.update_entity({"PartitionKey": pk, "RowKey": "process", "X": 1})  # merge
    merged = await ours.get_entity(pk, "process")
    assert (merged["S"], merged["X"]) == ("v2", 1)
    replaced = await ours.upsert_entity(
        {"PartitionKey": pk, "RowKey": "process", "Y": 2}, mode=UpdateMode.REPLACE
    )
    assert dict(await ours.get_entity(pk, "process")) == {
        "PartitionKey": pk,
        "RowKey": "process",
        "Y": 2,
    }
    with pytest.raises(ResourceModifiedError):
        await ours.delete_entity(
            pk, "process", etag=newer, match_condition=MatchConditions.IfNotModified
        )
    await ours.delete_entity(
        pk, "process", etag=replaced["etag"], match_condition=MatchConditions.IfNotModified
    )
    await ours.delete_entity(pk, "process")  # already gone
    with pytest.raises(ResourceNotFoundError) as missing:
        await ours.get_entity(pk, "process")
    assert (missing.value.status_code, missing.value.error_code) == (404, "ResourceNotFound")
    with pytest.raises(ResourceNotFoundError):  # 404 on a conditional update of no row
        await ours.update_entity(
            {"PartitionKey": pk, "RowKey": "none"},
            etag=etag,
            match_condition=MatchConditions.IfNotModified,
        )


def if_not_modified(etag: str) -> dict:
    return {
        "mode": UpdateMode.REPLACE,
        "etag": etag,
        "match_condition": MatchConditions.IfNotModified,
    }


async def test_transactions_are_all_or_nothing(ours: Table, sent: list[Sent]) -> None:
    pk = ROW["PartitionKey"]
    row = {"PartitionKey": pk, "RowKey": "t0"}
    etag = (await ours.submit_transaction([("create", ROW), ("create", row)]))[0]["etag"]
    with pytest.raises(TableTransactionError) as conflict:
        await ours.submit_transaction(
            [("create", {"PartitionKey": pk, "RowKey": "t1"}), ("create", row)]
        )
    assert (conflict.value.status_code, conflict.value.error_code) == (409, "EntityAlreadyExists")
    assert conflict.value.index == 1
    with pytest.raises(ResourceNotFoundError):
        await ours.get_entity(pk, "t1")  # the first operation did not happen either

    stale = if_not_modified("W/\"datetime'2000-01-01T00%3A00%3A00Z'\"")
    with pytest.raises(TableTransactionError) as lost:
        await ours.submit_transaction([("update", {**ROW, "S": "x"}, stale), ("delete", row)])
    assert lost.value.status_code == 412
    assert (await ours.get_entity(pk, "t0"))["RowKey"] == "t0"  # not deleted

    sent.clear()
    done = await ours.submit_transaction(
        [
            ("update", {**ROW, "S": "y"}, if_not_modified(etag)),
            ("upsert", {"PartitionKey": pk, "RowKey": "t2"}),
            ("delete", row),
        ]
    )
    assert [(s.method, len(s.batch_urls)) for s in sent] == [("POST", 3)]
    assert done[0]["etag"] == (await ours.get_entity(pk, "process")).metadata["etag"]
    rows = ours.query_entities("PartitionKey eq @pk", parameters={"pk": pk})
    assert {r["RowKey"] async for r in rows} == {"process", "t2"}


async def test_queries_page_across_continuations_and_resume(ours: Table, sent) -> None:
    await asyncio.gather(
        *(
            ours.upsert_entity({"PartitionKey": "q", "RowKey": f"r{i:03}", "I": i})
            for i in range(25)
        )
    )
    await ours.upsert_entity({"PartitionKey": "other", "RowKey": "x", "I": 99})
    query = "PartitionKey eq @pk and I ge @low"
    sent.clear()
    pages = ours.query_entities(query, parameters={"pk": "q", "low": 3}, results_per_page=10)
    pager = pages.by_page()
    first = await pager.__anext__()
    assert isinstance(first, Page) and [row["I"] for row in first] == list(range(3, 13))
    assert pager.continuation_token is not None and len(sent) == 1
    resumed = ours.query_entities(query, parameters={"pk": "q", "low": 3}, results_per_page=10)
    rest = [
        row["I"] async for page in resumed.by_page(pager.continuation_token) async for row in page
    ]
    assert rest == list(range(13, 25)) and len(sent) == 3  # two more pages: 13-22, 23-24
    sent.clear()
    everything = [row async for row in ours.list_entities(select=["I"], results_per_page=7)]
    assert len(everything) == 26 and len(sent) == 4  # 7 + 7 + 7 + 5
    assert all(set(row) == {"I"} for row in everything)
    hostile = {"pk": "x' or PartitionKey ne '"}
    assert [r async for r in ours.query_entities("PartitionKey eq @pk", parameters=hostile)] == []


async def test_concurrent_requests_share_the_pool(azurite, names, ours: Table) -> None:
    pk = "c"
    async with TableService.from_connection_string(
        azurite.connection_string, max_connections=4
    ) as service:
        table = service.get_table_client(names)
        await asyncio.gather(
            *(table.create_entity({"PartitionKey": pk, "RowKey": str(i)}) for i in range(40))
        )
        rows = await asyncio.gather(*(table.get_entity(pk, str(i)) for i in range(40)))
        assert [row["RowKey"] for row in rows] == [str(i) for i in range(40)]
        connector = service._sender._pipeline._transport.session.connector
        assert connector.limit == 4
        assert sum(len(idle) for idle in connector._conns.values()) <= 4


async def test_each_request_is_counted_once(azurite, names, ours) -> None:
    """Each request once in adapters.op_counts, by method: what the benchmarks bill."""
    counts = OperationCounts()
    async with TableService.from_connection_string(
        azurite.connection_string, request_hook=counts.request_hook("table")
    ) as service:
        table = service.get_table_client(names)
        await table.create_entity({"PartitionKey": "n", "RowKey": "a"})
        await table.upsert_entity({"PartitionKey": "n", "RowKey": "b"})
        await table.get_entity("n", "a")
        with pytest.raises(ResourceNotFoundError):
            await table.get_entity("n", "none")
        await table.submit_transaction([("delete", {"PartitionKey": "n", "RowKey": "a"})])
        assert len([r async for r in table.query_entities("PartitionKey eq 'n'")]) == 1
        await table.delete_entity("n", "b")
    assert counts.snapshot() == {
        "table.delete": 1,
        "table.get": 3,  # two point reads (one a 404) and one page
        "table.patch": 1,  # the upsert (a merge)
        "table.post": 2,  # the insert and the transaction
    }
