"""The summaries' one pass over timelines (devstack.observe.timeline_tally) against Azurite: it
counts what reading every order's timeline would, with one query, and only for the run asked."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from adapters.store.rows import PROCESS_ROW, details_entity, timeline_entity
from adapters.tables import Table, TableService
from devstack.observe import (
    RETRY_EVENTS,
    TimelineTally,
    common_prefix,
    past_prefix,
    timeline_tally,
    timelines,
)
from domain.messages import utc_now
from domain.order import TimelineEntry
from domain.states import ProcessState
from tests.integration.test_supervisor_cost import new_submission

pytestmark = pytest.mark.anyio

# (actor, event) of each order's timeline after "created".
HISTORIES = {
    "plain": [("scheduler:h1", "step_completed"), ("scheduler:h1", "processed")],
    "retried": [
        ("scheduler:h1", "released"),
        ("scheduler:h2", "claimed"),
        ("scheduler:h2", "deferred"),
        ("scheduler:h1", "processed"),
    ],
    "recovered": [
        ("supervisor:h2", "released"),
        ("scheduler:h1", "claimed"),
        ("supervisor:h1", "flushed"),
        ("scheduler:h1", "processed"),
    ],
    "operator": [("operator:alice", "resubmitted"), ("scheduler:h1", "processed")],
}


@pytest.fixture
async def table(azurite, unique_name) -> AsyncIterator[Table]:
    async with TableService.from_connection_string(azurite.connection_string) as service:
        name = unique_name("orders")
        await service.create_table_if_not_exists(name)
        yield service.get_table_client(name)


async def write_order(table: Table, order_id: str, history: list[tuple[str, str]]) -> None:
    submitted = new_submission().model_copy(update={"order_id": order_id})
    at = utc_now()
    entries = [("scheduler:h1", "created"), *history]
    rows = [details_entity(submitted, submitted.content_hash())]
    # The state row has no Event or Actor: the filter must pass over it.
    rows.append({"PartitionKey": order_id, "RowKey": PROCESS_ROW, "ProcessState": "Processed"})
    for seq, (actor, event) in enumerate(entries):
        entry = TimelineEntry(
            seq=seq,
            at=at + timedelta(seconds=seq),
            actor=actor,
            event=event,
            from_state=None,
            to_state=ProcessState.PROCESSED,
            step=None,
            attempt=1,
            detail=f"{event} by {actor}",
        )
        rows.append(timeline_entity(order_id, entry))
    await table.submit_transaction([("create", row) for row in rows])


async def per_order(table: Table, order_ids: list[str]) -> TimelineTally:
    """What the demo used to do: read each order's timeline (one query per order)."""
    retries, recovered = 0, set()
    for order_id in order_ids:
        query = table.query_entities("PartitionKey eq @pk", parameters={"pk": order_id})
        timeline = [row async for row in query]
        events = [row for row in timeline if str(row["RowKey"]).startswith("timeline-")]
        retries += sum(1 for row in events if row["Event"] in RETRY_EVENTS)
        if any(row["Actor"].startswith("supervisor:") for row in events):
            recovered.add(order_id)
    return TimelineTally(retries, frozenset(recovered))


async def test_one_query_counts_what_reading_each_timeline_would(table: Table) -> None:
    ours = [f"run-a-{name}-{n}" for name in HISTORIES for n in range(3)]
    for order_id in ours:
        await write_order(table, order_id, HISTORIES[order_id.split("-")[2]])
    # Another run's orders, with retries and a Supervisor entry, are not counted.
    await write_order(table, "run-b-recovered-0", HISTORIES["recovered"])
    await write_order(table, "run-a", HISTORIES["retried"])  # the prefix itself is no run order

    tally = await timeline_tally(table, "run-a-")

    assert tally == await per_order(table, ours)
    assert tally.retries == 3 * 2 + 3 * 1
    assert tally.recovered_by_supervisor == {f"run-a-recovered-{n}" for n in range(3)}


async def test_only_the_orders_named_are_counted(table: Table) -> None:
    for n in range(3):
        await write_order(table, f"run-c-{n}", HISTORIES["recovered"])
    tally = await timeline_tally(table, "run-c-", {"run-c-0", "run-c-2"})
    assert tally == TimelineTally(2, frozenset({"run-c-0", "run-c-2"}))


def test_past_prefix_ends_the_range_of_a_prefix() -> None:
    assert past_prefix("demo-ab12-") == "demo-ab12."
    assert past_prefix("supervisor:") == "supervisor;"
    assert "demo-ab12-99999" < past_prefix("demo-ab12-") <= "demo-ab12.x"
    with pytest.raises(ValueError):
        past_prefix("")


async def test_one_query_reads_every_timeline_of_a_run_in_order(table: Table) -> None:
    ours = [f"run-d-{name}" for name in HISTORIES]
    for order_id in ours:
        await write_order(table, order_id, HISTORIES[order_id.split("-")[2]])
    await write_order(table, "run-e-plain", HISTORIES["plain"])  # another run's order

    found = await timelines(table, common_prefix(ours))

    assert set(found) == set(ours)
    for order_id in ours:
        expected = [("scheduler:h1", "created"), *HISTORIES[order_id.split("-")[2]]]
        assert [(e.actor, e.event) for e in found[order_id]] == expected
        assert [e.seq for e in found[order_id]] == list(range(len(expected)))


def test_common_prefix_of_a_run() -> None:
    assert common_prefix(["chaos-ab12-00001", "chaos-ab12-00999", "chaos-ab12-00010"]) == (
        "chaos-ab12-00"
    )
    assert common_prefix(["only-one"]) == "only-one"
    with pytest.raises(ValueError):
        common_prefix([])
