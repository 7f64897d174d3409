"""The retention purge against Azurite (Table store + Blob archive) and in memory (devstack.memory).

What must hold: an order in flight is never touched; an order that changes between being read
and being deleted is skipped untouched; a purged order can be read back from the archive; a dry
run changes nothing; a crash between archiving and deleting leaves the order in place, and the
next run deletes it with one archived copy as read back.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from datetime import date, timedelta
from typing import Any

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob.aio import BlobServiceClient

from adapters import archive, archive_reading
from adapters.archive import ArchivedOrder
from adapters.archive_reading import ReadableBlobArchive
from adapters.op_counts import OperationCounts
from adapters.store.records import PURGE_MARKER_ROW, OrderRecords
from adapters.store.rows import OrderNotFound
from adapters.tables import TableService
from devstack.memory import MemoryArchive, MemoryStore
from domain.order import Order
from domain.retention import ACK_EVENT, DeleteOutcome, OrderSnapshot, ack_detail
from domain.states import ProcessState
from service.purge import PurgeRequest, run_purge
from tests.integration.test_state_store import (
    RESUBMIT,
    T0,
    Clock,
    create,
    move,
    to_error,
    to_processed,
)
from tests.support.archive import archived_on

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

RETENTION = timedelta(days=30)
LATER = timedelta(days=31)


@dataclasses.dataclass
class Backend:
    kind: str
    store: Any
    archive: Any
    clock: Clock
    counts: OperationCounts

    async def purge(self, **changes: Any):
        request = PurgeRequest(older_than=RETENTION, requested_by="operator:ann")
        return await run_purge(
            self.store, self.archive, dataclasses.replace(request, **changes), clock=self.clock
        )

    async def rows(self, order_id: str) -> list[str]:
        """RowKeys left in the order's partition."""
        if isinstance(self.store, MemoryStore):
            found = await self.store.snapshot(order_id)
            return [] if found is None else ["details", "process", *found.other_rows]
        table = self.store._orders
        query = table.query_entities("PartitionKey eq @pk", parameters={"pk": order_id})
        return sorted([row["RowKey"] async for row in query])

    async def error_rows(self) -> set[str]:
        if isinstance(self.store, MemoryStore):
            return {row.order_id for row in self.store.errors.rows()}
        return {row.order_id for row in (await self.store.errors.page(1000)).rows}


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def counts() -> OperationCounts:
    return OperationCounts()


@pytest.fixture
async def table_backend(azurite, unique_name, clock, counts) -> AsyncIterator[Backend]:
    tables = TableService.from_connection_string(
        azurite.connection_string, request_hook=counts.request_hook("table")
    )
    blobs = BlobServiceClient.from_connection_string(
        azurite.connection_string, raw_request_hook=counts.request_hook("blob")
    )
    names = [unique_name(n) for n in ("orders", "active", "supervision")]
    orders, active, supervision = names
    store = OrderRecords(
        tables, orders_table=orders, active_table=active, supervision_table=supervision, clock=clock
    )
    await store.ensure_tables()
    container = f"archive-{unique_name('c')}"
    archive = ReadableBlobArchive(blobs.get_container_client(container))
    yield Backend("table", store, archive, clock, counts)
    for name in names:
        await tables.delete_table(name)
    with contextlib.suppress(ResourceNotFoundError):  # nothing was ever archived
        await blobs.delete_container(container)
    await tables.close()
    await blobs.close()


@pytest.fixture(params=["memory", "table"])
def backend(request, clock, counts) -> Backend:
    if request.param == "memory":
        return Backend("memory", MemoryStore(clock), MemoryArchive(), clock, counts)
    return request.getfixturevalue("table_backend")


async def finished(backend: Backend, order: Order) -> Order:
    """What the shell does once a finished order's last messages are sent."""
    await backend.store.index.discard(order.order_id, order.generation)
    return order


async def acknowledged(backend: Backend, order_id: str, reason: str = "step_declined") -> Order:
    """An operator acknowledging the order's terminal alert (operator_api records it so)."""
    order = await backend.store.load(order_id)
    return await backend.store.annotate(
        order, actor="operator:ann", event=ACK_EVENT, detail=ack_detail(41, "error", reason)
    )


async def snapshot_of(backend: Backend, order_id: str) -> OrderSnapshot:
    found = await backend.store.snapshot(order_id)
    assert found is not None
    return found


def assert_archived_as(record: ArchivedOrder | None, before: OrderSnapshot) -> None:
    assert record is not None
    assert record.order_id == before.process.order_id
    assert record.submitted == before.submitted
    assert record.payload_hash == before.payload_hash
    assert record.process == dataclasses.replace(before.process, etag="", write_id="")
    assert record.timeline == before.timeline


# ------------------------------------------------------------------------------ the purge


async def test_purge_archives_finished_orders_then_deletes_them(backend):
    store, clock = backend.store, backend.clock
    await finished(backend, await to_processed(store, clock, "p-1"))
    resolved = await finished(backend, await to_error(store, clock, "e-resolved"))
    await acknowledged(backend, resolved.order_id)
    unresolved = await finished(backend, await to_error(store, clock, "e-open"))
    other_alert = await finished(backend, await to_error(store, clock, "e-other"))
    await acknowledged(backend, other_alert.order_id, reason="duplicate_order_id")
    owing = await to_processed(store, clock, "p-owes")  # its index row is still there
    before = {oid: await snapshot_of(backend, oid) for oid in ("p-1", "e-resolved")}

    clock.advance(LATER)
    report = await backend.purge()

    assert (report.examined, report.purgeable, report.archived, report.purged) == (5, 2, 2, 2)
    assert report.kept == {"unresolved_error": 2, "owes_messages": 1}
    assert report.skipped_changed == report.failed == 0 and not report.more
    for order_id, snapshot in before.items():
        with pytest.raises(OrderNotFound):
            await store.load(order_id)
        assert await backend.rows(order_id) == []
        assert_archived_as(await archive_reading.find(backend.archive, order_id), snapshot)
    assert await archive_reading.find(backend.archive, unresolved.order_id) is None
    for kept in (unresolved, other_alert, owing):
        assert (await store.load(kept.order_id)).state.terminal
    assert await backend.error_rows() == {"e-open", "e-other"}, "a purged Error leaves no index row"
    assert report.blobs == [archive.blob_name(clock().date())]
    assert [run["run_id"] for run in await store.purges.recent()] == [report.run_id]
    assert (await store.purges.recent())[0]["purged"] == 2


async def test_orders_in_flight_and_recent_ones_are_never_touched(backend):
    store, clock = backend.store, backend.clock
    in_flight = await create(store, clock, "f-1")  # Processing, claimed for its first step
    old_done = await finished(backend, await to_processed(store, clock, "p-old"))
    clock.advance(timedelta(days=20))
    recent = await finished(backend, await to_processed(store, clock, "p-new"))
    clock.advance(timedelta(days=15))  # in-flight and p-old unchanged for 35 days, p-new 15

    report = await backend.purge()

    assert (report.purged, report.kept) == (1, {})  # p-new is no candidate: too recent
    assert await store.load(in_flight.order_id) == in_flight, "not even its ETag moved"
    assert await store.load(recent.order_id) == recent
    timeline = (await snapshot_of(backend, "f-1")).timeline
    assert await store.get_timeline(in_flight.order_id) == list(timeline)
    with pytest.raises(OrderNotFound):
        await store.load(old_done.order_id)
    # Asked for in-flight states outright, the store refuses.
    with pytest.raises(ValueError, match="only finished states"):
        [c async for c in store.purge_candidates(clock(), [ProcessState.PROCESSING])]


async def test_an_order_in_flight_again_is_kept_even_when_listed(backend):
    """Resubmitted between the scan and the read: read whole, it is in flight, so kept."""
    store, clock = backend.store, backend.clock
    errored = await finished(backend, await to_error(store, clock, "e-1"))
    await acknowledged(backend, errored.order_id)
    clock.advance(LATER)

    class ResubmitWhileListing:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def purge_candidates(self, *args: Any, **kwargs: Any):
            async for candidate in self.inner.purge_candidates(*args, **kwargs):
                current = await self.inner.load(candidate.order_id)
                await move(self.inner, current, RESUBMIT, clock, actor="operator-ann")
                yield candidate

    report = await run_purge(
        ResubmitWhileListing(store),
        backend.archive,
        PurgeRequest(older_than=RETENTION, requested_by="operator:ann"),
        clock=clock,
    )
    assert (report.examined, report.purged, report.kept) == (1, 0, {"in_flight": 1})
    assert (await store.load("e-1")).state is ProcessState.PROCESSING
    assert await archive_reading.find(backend.archive, "e-1") is None


async def test_an_order_that_changes_between_reading_and_deleting_is_skipped(backend):
    store, clock = backend.store, backend.clock
    errored = await finished(backend, await to_error(store, clock, "e-1"))
    await acknowledged(backend, errored.order_id)
    clock.advance(LATER)

    class AnnotatedWhileArchiving:
        """An operator writes on the order after it was read, before it is deleted."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def append(self, day: date, records: Sequence[ArchivedOrder]) -> str:
            name = await self.inner.append(day, records)
            for record in records:
                current = await store.load(record.order_id)
                await store.annotate(current, actor="operator:bob", event="note", detail="looked")
            return name

    report = await run_purge(
        store,
        AnnotatedWhileArchiving(backend.archive),
        PurgeRequest(older_than=RETENTION, requested_by="operator:ann"),
        clock=clock,
    )

    assert (report.archived, report.purged, report.skipped_changed) == (1, 0, 1)
    kept = await store.load("e-1")
    assert kept.state is ProcessState.ERROR
    assert [e.event for e in await store.get_timeline("e-1")][-2:] == [ACK_EVENT, "note"]
    assert await backend.error_rows() == {"e-1"}
    # Its next purge archives the changed order; the reader shows that copy.
    clock.advance(LATER)
    latest = await snapshot_of(backend, "e-1")
    assert (await backend.purge()).purged == 1
    assert_archived_as(await archive_reading.find(backend.archive, "e-1"), latest)


async def test_a_dry_run_changes_nothing(backend):
    store, clock = backend.store, backend.clock
    done = await finished(backend, await to_processed(store, clock, "p-1"))
    clock.advance(LATER)

    report = await backend.purge(dry_run=True)

    assert (report.examined, report.purgeable, report.archived, report.purged) == (1, 1, 0, 0)
    assert await store.load("p-1") == done
    assert await backend.archive.blobs() == []
    assert await store.purges.recent() == [], "a dry run is only logged, not recorded"


class Crash(Exception):
    """The process died here."""


async def test_a_crash_between_archive_and_delete_archives_twice_and_reads_back_once(backend):
    store, clock = backend.store, backend.clock
    await finished(backend, await to_processed(store, clock, "p-1"))
    before = await snapshot_of(backend, "p-1")
    clock.advance(LATER)

    class CrashOnDelete:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def purge(self, snapshot: OrderSnapshot) -> DeleteOutcome:
            raise Crash

    with pytest.raises(Crash):
        await run_purge(
            CrashOnDelete(store),
            backend.archive,
            PurgeRequest(older_than=RETENTION, requested_by="operator:ann"),
            clock=clock,
        )
    assert await store.load("p-1") == before.process, "archived, not deleted"
    assert len(await archive_reading.find_all(backend.archive, "p-1")) == 1

    clock.advance(timedelta(hours=1))
    report = await backend.purge()

    assert (report.archived, report.purged) == (1, 1)
    assert len(await archive_reading.find_all(backend.archive, "p-1")) == 2, "archived twice"
    assert_archived_as(await archive_reading.find(backend.archive, "p-1"), before)
    day = await archived_on(backend.archive, clock().date())
    assert [r.order_id for r in day] == ["p-1"]
    with pytest.raises(OrderNotFound):
        await store.load("p-1")


async def test_state_selects_processed_or_error(backend):
    store, clock = backend.store, backend.clock
    await finished(backend, await to_processed(store, clock, "p-1"))
    await finished(backend, await to_error(store, clock, "e-1"))
    await acknowledged(backend, "e-1")
    clock.advance(LATER)

    only_errors = await backend.purge(states=(ProcessState.ERROR,))
    assert (only_errors.examined, only_errors.purged) == (1, 1)
    assert (await store.load("p-1")).state is ProcessState.PROCESSED
    assert (await backend.purge(states=(ProcessState.PROCESSED,))).purged == 1


# ------------------------------------------------------------------- Table store only


async def test_purge_cost_in_requests(table_backend):
    backend = table_backend
    store, clock = backend.store, backend.clock
    for n in range(3):
        await finished(backend, await to_processed(store, clock, f"p-{n}"))
    clock.advance(LATER)
    backend.counts.reset()

    report = await backend.purge()

    cost = backend.counts.snapshot()
    print("purge of 3 Processed orders:", cost)
    assert report.purged == 3
    # 1 scan + per order (1 partition query + 1 index point read + 1 transaction) + 1 record.
    assert cost["table.get"] == 1 + 3 * 2
    assert cost["table.post"] == 3
    assert cost["table.put"] == 1
    # The first append of a day: properties (404), container, block, block list.
    assert sum(v for k, v in cost.items() if k.startswith("blob.")) == 4


async def test_an_order_of_more_than_100_rows_is_purged_in_several_transactions(table_backend):
    backend = table_backend
    store, clock = backend.store, backend.clock
    order = await to_processed(store, clock, "p-long")
    for n in range(230):  # every annotation is a timeline row: 233 rows in all
        order = await store.annotate(order, actor="operator:ann", event="note", detail=str(n))
    await finished(backend, order)
    before = await snapshot_of(backend, "p-long")
    assert len(await backend.rows("p-long")) == 234
    clock.advance(LATER)

    assert (await backend.purge()).purged == 1

    assert await backend.rows("p-long") == []
    assert_archived_as(await archive_reading.find(backend.archive, "p-long"), before)


async def test_an_interrupted_multi_transaction_purge_is_finished_by_the_next_run(
    table_backend, monkeypatch
):
    backend = table_backend
    store, clock = backend.store, backend.clock
    order = await to_processed(store, clock, "p-long")
    for n in range(150):
        order = await store.annotate(order, actor="operator:ann", event="note", detail=str(n))
    await finished(backend, order)
    clock.advance(LATER)

    table = store._orders
    submit = table.submit_transaction
    calls = []

    async def crash_after_the_first(operations: Any, **kwargs: Any) -> Any:
        calls.append(len(operations))
        if len(calls) > 1:
            raise Crash
        return await submit(operations, **kwargs)

    monkeypatch.setattr(table, "submit_transaction", crash_after_the_first)
    with pytest.raises(Crash):
        await backend.purge()
    monkeypatch.setattr(table, "submit_transaction", submit)

    left = await backend.rows("p-long")
    assert PURGE_MARKER_ROW in left and "details" in left and "process" not in left
    with pytest.raises(OrderNotFound):
        await store.load("p-long")  # the first transaction decided: the order is gone
    assert calls[0] == 100

    report = await backend.purge()

    assert (report.interrupted_finished, report.purged) == (1, 0)
    assert await backend.rows("p-long") == []
    assert await archive_reading.find(backend.archive, "p-long") is not None
