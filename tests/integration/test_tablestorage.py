"""core.tablestorage against Azurite, checked against azure-data-tables: rows written by one
read the same through the other, and the service's answers map to the SDK's errors."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
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

from core.tablestorage import Sent, Table, TableService

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
def ours(azurite, names, sent) -> Iterator[Table]:
    with TableService.from_connection_string(
        azurite.connection_string, request_hook=sent.append
    ) as service:
        service.create_table_if_not_exists(names)
        service.create_table_if_not_exists(names)  # twice: already there is fine
        yield service.get_table_client(names)
        service.delete_table(names)


@pytest.fixture
def sdk(azurite, names, ours) -> Iterator[TableClient]:
    with TableServiceClient.from_connection_string(azurite.connection_string) as service:
        yield service.get_table_client(names)


def test_rows_written_here_read_the_same_through_the_sdk(ours: Table, sdk: TableClient) -> None:
    written = ours.create_entity(ROW)
    theirs = sdk.get_entity(ROW["PartitionKey"], ROW["RowKey"])
    assert dict(theirs) == ROW
    assert theirs.metadata["etag"] == written["etag"]


def test_rows_written_by_the_sdk_read_the_same_here(ours: Table, sdk: TableClient) -> None:
    sdk.create_entity(ROW)
    mine = ours.get_entity(ROW["PartitionKey"], ROW["RowKey"])
    assert dict(mine) == ROW
    assert mine.metadata["etag"] == sdk.get_entity(ROW["PartitionKey"], "process").metadata["etag"]
    assert mine.metadata["timestamp"].tzinfo is not None


def test_conditional_writes_and_their_errors(ours: Table) -> None:
    etag = ours.create_entity(ROW)["etag"]
    with pytest.raises(ResourceExistsError) as exists:
        ours.create_entity(ROW)
    assert exists.value.error_code == "EntityAlreadyExists"
    newer = ours.update_entity(
        {**ROW, "S": "v2"},
        mode=UpdateMode.REPLACE,
        etag=etag,
        match_condition=MatchConditions.IfNotModified,
    )["etag"]
    with pytest.raises(ResourceModifiedError):
        ours.update_entity(
            {**ROW, "S": "v3"}, etag=etag, match_condition=MatchConditions.IfNotModified
        )
    ours.update_entity({"PartitionKey": ROW["PartitionKey"], "RowKey": "process", "X": 1})
    merged = ours.get_entity(ROW["PartitionKey"], "process")
    assert (merged["S"], merged["X"]) == ("v2", 1)
    with pytest.raises(ResourceModifiedError):
        ours.delete_entity(
            ROW["PartitionKey"],
            "process",
            etag=newer,
            match_condition=MatchConditions.IfNotModified,
        )
    ours.delete_entity(ROW["PartitionKey"], "process")
    ours.delete_entity(ROW["PartitionKey"], "process")  # already gone
    with pytest.raises(ResourceNotFoundError):
        ours.get_entity(ROW["PartitionKey"], "process")


def if_not_modified(etag: str) -> dict:
    return {
        "mode": UpdateMode.REPLACE,
        "etag": etag,
        "match_condition": MatchConditions.IfNotModified,
    }


def test_transactions_are_all_or_nothing(ours: Table, sent: list[Sent]) -> None:
    pk = ROW["PartitionKey"]
    row = {"PartitionKey": pk, "RowKey": "t0"}
    etag = ours.submit_transaction([("create", ROW), ("create", row)])[0]["etag"]
    with pytest.raises(TableTransactionError) as conflict:
        ours.submit_transaction([("create", {"PartitionKey": pk, "RowKey": "t1"}), ("create", row)])
    assert (conflict.value.status_code, conflict.value.error_code) == (409, "EntityAlreadyExists")
    assert conflict.value.index == 1
    with pytest.raises(ResourceNotFoundError):
        ours.get_entity(pk, "t1")  # the first operation did not happen either

    stale = if_not_modified("W/\"datetime'2000-01-01T00%3A00%3A00Z'\"")
    with pytest.raises(TableTransactionError) as lost:
        ours.submit_transaction([("update", {**ROW, "S": "x"}, stale), ("delete", row)])
    assert lost.value.status_code == 412

    sent.clear()
    done = ours.submit_transaction(
        [
            ("update", {**ROW, "S": "y"}, if_not_modified(etag)),
            ("upsert", {"PartitionKey": pk, "RowKey": "t2"}),
            ("delete", row),
        ]
    )
    assert [(s.method, len(s.batch_urls)) for s in sent] == [("POST", 3)]
    assert done[0]["etag"] == ours.get_entity(pk, "process").metadata["etag"]
    assert {
        r["RowKey"] for r in ours.query_entities("PartitionKey eq @pk", parameters={"pk": pk})
    } == {"process", "t2"}


def test_queries_page_and_resume(ours: Table) -> None:
    for i in range(25):
        ours.upsert_entity({"PartitionKey": "q", "RowKey": f"r{i:03}", "I": i})
    ours.upsert_entity({"PartitionKey": "other", "RowKey": "x", "I": 99})
    query = "PartitionKey eq @pk and I ge @low"
    pages = ours.query_entities(query, parameters={"pk": "q", "low": 3}, results_per_page=10)
    pager = pages.by_page()
    first = [row["I"] for row in next(pager)]
    assert first == list(range(3, 13))
    resumed = ours.query_entities(query, parameters={"pk": "q", "low": 3}, results_per_page=10)
    rest = [row["I"] for page in resumed.by_page(pager.continuation_token) for row in page]
    assert rest == list(range(13, 25))
    assert len(list(ours.list_entities(select=["I"]))) == 26
    hostile = {"pk": "x' or PartitionKey ne '"}
    assert list(ours.query_entities("PartitionKey eq @pk", parameters=hostile)) == []
