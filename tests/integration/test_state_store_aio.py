"""The async order state store (core.aio.state_store) and its tables, against Azurite.

The hot path awaits the same store the Supervisor and the tools call synchronously: the sync
module is generated from this async one (devstack.unasync), so tests/integration/
test_state_store.py proves the rules once. What is proven here is the async side for real:
every method awaited on one event loop against Azurite - create (and AlreadyExists), load and
find (OrderNotFound), ETag-conditional saves (ConcurrencyConflict), the active-order and Error
indexes, the supervision leases, the purge and its log - the failure paths, and that each
operation costs exactly the requests the sync store's does. Run with ``-W
error::RuntimeWarning`` so a coroutine left un-awaited fails.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError
from azure.data.tables import TableTransactionError

from adapters import tables as adapter_tables
from core import lifecycle
from core.active_index import index_partition
from core.aio import state_store as aio_store_module
from core.aio.active_index import ActiveOrderIndex
from core.aio.error_index import ErrorOrderIndex
from core.aio.purge_log import PurgeLog
from core.aio.state_store import OrderStateStore as AioStore
from core.aio.supervision import SupervisionTable
from core.index_rows import INDEX_BUCKETS, ErrorRow
from core.op_counts import OperationCounts
from core.order import Order
from core.retention import DeleteOutcome
from core.roster import BucketLease, Member, Sweep
from core.state_models import (
    ActiveRow,
    AlreadyExists,
    ConcurrencyConflict,
    OrderNotFound,
)
from core.state_store import PURGE_MARKER_ROW
from core.state_store import OrderStateStore as SyncStore
from core.states import ProcessState
from core.tablestorage import TableService as SyncService
from core.tablestorage.aio import TableService as AioService
from tests.integration.test_state_store import (
    RESUBMIT,
    T0,
    Clock,
    bare,
    decide,
    declined,
    new_order,
    submitted,
    succeeded,
    transaction_error,
)

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

GRACE = timedelta(minutes=10)


# ------------------------------------------------------------------------------- fixtures


@dataclasses.dataclass
class Tables:
    orders: str
    active: str
    supervision: str

    def kwargs(self) -> dict[str, str]:
        return {
            "orders_table": self.orders,
            "active_table": self.active,
            "supervision_table": self.supervision,
        }


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def counts() -> OperationCounts:
    """Table requests of the async store under test."""
    return OperationCounts()


@pytest.fixture
def tables(unique_name) -> Tables:
    return Tables(*(unique_name(n) for n in ("orders", "active", "supervision")))


@pytest.fixture
def sync_service(azurite) -> Iterator[SyncService]:
    service = SyncService.from_connection_string(azurite.connection_string)
    yield service
    service.close()


@pytest.fixture(
    params=[AioService, adapter_tables.TableService], ids=["own-pool", "azure-core-pipeline"]
)
async def store(request, azurite, tables, clock, counts, sync_service) -> AsyncIterator[AioStore]:
    """The store on the Table client that runs today, and on adapters.tables (which the app
    moves onto in the restructuring): the same store, the same rules, the same requests."""
    service = request.param.from_connection_string(
        azurite.connection_string, request_hook=counts.request_hook("table")
    )
    aio = AioStore(service, clock=clock, owns_service=True, **tables.kwargs())
    await aio.ensure_tables()
    counts.reset()
    yield aio
    await aio.close()
    for name in (tables.orders, tables.active, tables.supervision):
        sync_service.delete_table(name)


@pytest.fixture
def twin(store, sync_service, tables, clock) -> SyncStore:
    """The sync store over the same tables: an independent look at what the async one wrote."""
    return SyncStore(sync_service, clock=clock, **tables.kwargs())


async def create(store: AioStore, clock: Clock, order_id: str = "o-1", **fields: Any) -> Order:
    order = submitted(order_id, **fields)
    result = await store.create(order, *new_order(clock, order))
    assert isinstance(result, Order)
    return result


async def move(
    store: AioStore, order: Order, event: lifecycle.Event, clock: Clock, actor: str = "scheduler-1"
) -> Order:
    return await store.save(order, *decide(order, event, clock, actor))


async def to_error(store: AioStore, clock: Clock, order_id: str = "o-1") -> Order:
    current = await create(store, clock, order_id)
    errored = await move(store, current, declined(current, clock), clock)
    assert errored.state is ProcessState.ERROR
    return errored


async def to_processed(store: AioStore, clock: Clock, order_id: str = "o-1") -> Order:
    current = await create(store, clock, order_id, workflow="single_step")
    done = await move(store, current, succeeded(current, clock), clock)
    assert done.state is ProcessState.PROCESSED
    return done


async def error_rows(store: AioStore) -> set[tuple[str, int]]:
    page = await store.errors.page(1000)
    return {(row.order_id, row.generation) for row in page.rows}


async def active_rows(store: AioStore) -> set[tuple[str, int]]:
    return {(row.order_id, row.generation) async for row in store.all_active()}


# ---------------------------------------------------------------------------------- create


async def test_the_store_is_built_of_the_async_tables(store):
    assert isinstance(store.index, ActiveOrderIndex)
    assert isinstance(store.errors, ErrorOrderIndex)
    assert isinstance(store.purges, PurgeLog)
    assert isinstance(store.supervision, SupervisionTable)


async def test_create_then_load_find_get_order_and_timeline(store, twin, clock):
    order = submitted()
    decided, entry = new_order(clock, order)
    result = await store.create(order, decided, entry)
    assert isinstance(result, Order) and result.etag and result.write_id
    assert bare(result) == decided
    assert await store.load("o-1") == result == twin.load("o-1")
    assert await store.find("o-1") == result
    assert await store.get_timeline("o-1") == [entry]
    record = await store.get_order("o-1")
    assert (record.details, record.payload_hash, record.process) == (
        order,
        order.content_hash(),
        result,
    )
    assert await active_rows(store) == {("o-1", 1)}
    assert await store.index.has("o-1", 1)
    assert await error_rows(store) == set()


async def test_creating_the_same_id_again_is_already_exists(store, twin, clock):
    first = await create(store, clock)
    again = submitted(submitted_at=T0 + timedelta(minutes=1))
    result = await store.create(again, *new_order(clock, again))
    assert result == AlreadyExists(True, submitted().content_hash(), first)
    other = submitted(items=[{"sku": "SKU-9", "quantity": 1, "unit_price_cents": 1}])
    result = await store.create(other, *new_order(clock, other))
    assert isinstance(result, AlreadyExists)
    assert (result.same_payload, result.order) == (False, first)
    assert [e.event for e in twin.get_timeline("o-1")] == ["created"]
    assert await active_rows(store) == {("o-1", 1)}


async def test_a_duplicate_of_a_finished_order_removes_the_row_it_added(store, clock):
    done = await to_processed(store, clock)
    await store.index.discard("o-1", 1)
    order = submitted(workflow="single_step")
    result = await store.create(order, *new_order(clock, order))
    assert result == AlreadyExists(True, order.content_hash(), done)
    assert await active_rows(store) == set()


# ------------------------------------------------------------------------------------ reads


async def test_a_missing_order(store, clock):
    with pytest.raises(OrderNotFound, match="order nope does not exist"):
        await store.load("nope")
    assert await store.find("nope") is None
    with pytest.raises(OrderNotFound):
        await store.get_order("nope")
    assert await store.get_timeline("nope") == []
    assert await store.snapshot("nope") is None
    # A save of an order that is gone.
    ghost = await create(store, clock, "o-2")
    after, entry = decide(ghost, succeeded(ghost, clock), clock)
    snapshot = await store.snapshot("o-2")
    assert snapshot is not None
    assert await store.purge(snapshot) is DeleteOutcome.PURGED
    with pytest.raises(OrderNotFound):
        await store.save(ghost, after, entry)


async def test_timeline_after_and_limit(store, clock):
    current = await create(store, clock)
    current = await move(store, current, succeeded(current, clock), clock)
    current = await store.annotate(current, actor="op", event="noted")
    events = [e.event for e in await store.get_timeline("o-1")]
    assert events == ["created", "step_succeeded", "noted"]
    assert [e.seq for e in await store.get_timeline("o-1", after_seq=0, limit=1)] == [1]


# ----------------------------------------------------------------------------------- writes


async def test_save_with_the_current_etag_then_with_a_stale_one(store, twin, clock):
    current = await create(store, clock)
    saved = await move(store, current, succeeded(current, clock), clock)
    assert saved.etag != current.etag and await store.load("o-1") == saved
    with pytest.raises(ConcurrencyConflict, match="expected Processing at timeline 0"):
        await move(store, current, succeeded(current, clock), clock, "scheduler-2")
    assert twin.load("o-1") == saved
    assert [e.event for e in twin.get_timeline("o-1")] == ["created", "step_succeeded"]


async def test_concurrent_saves_from_one_read_exactly_one_wins(store, twin, clock):
    current = await create(store, clock)
    results = await asyncio.gather(
        *(
            move(store, current, succeeded(current, clock), clock, f"scheduler-{n}")
            for n in range(4)
        ),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, Order)]
    lost = [r for r in results if isinstance(r, ConcurrencyConflict)]
    assert (len(won), len(lost)) == (1, 3), results
    assert twin.load("o-1") == won[0]
    assert len(twin.get_timeline("o-1")) == 2


async def test_an_sdk_resend_of_a_committed_save_is_not_a_conflict(store, clock, monkeypatch):
    current = await create(store, clock)
    table = store._orders
    real_submit = table.submit_transaction

    async def commit_then_412(operations, **kwargs):
        await real_submit(list(operations), **kwargs)
        raise transaction_error(412, "UpdateConditionNotSatisfied")

    monkeypatch.setattr(table, "submit_transaction", commit_then_412)
    after, entry = decide(current, declined(current, clock), clock)
    saved = await store.save(current, after, entry)
    monkeypatch.undo()
    assert saved == await store.load("o-1")
    assert bare(saved) == bare(after)
    assert await error_rows(store) == {("o-1", 1)}  # kept: the write is ours


@pytest.mark.parametrize(("status", "code"), [(409, "TableBeingDeleted"), (500, "InternalError")])
async def test_other_transaction_errors_propagate(store, clock, monkeypatch, status, code):
    current = await create(store, clock)

    async def fail(operations, **kwargs):
        raise transaction_error(status, code)

    monkeypatch.setattr(store._orders, "submit_transaction", fail)
    with pytest.raises(TableTransactionError) as caught:
        await move(store, current, succeeded(current, clock), clock)
    assert caught.value.status_code == status
    order = submitted("o-2")
    with pytest.raises(TableTransactionError):
        await store.create(order, *new_order(clock, order))
    monkeypatch.undo()
    assert await store.load("o-1") == current
    assert await store.find("o-2") is None


# ------------------------------------------------------------------------------ Error index


async def test_entering_error_puts_an_error_row_and_a_resubmit_removes_it(store, twin, clock):
    errored = await to_error(store, clock)
    [row] = (await store.errors.page(10)).rows
    assert isinstance(row, ErrorRow)  # one class for both twins (core.index_rows)
    assert (row.order_id, row.generation, row.written_at) == ("o-1", 1, clock())
    assert twin.errors.page(10).rows == (row,)
    resubmitted = await move(store, errored, RESUBMIT, clock, "operator-ann")
    assert resubmitted.generation == 2 and resubmitted.state.in_flight
    assert await error_rows(store) == set()
    assert await store.index.has("o-1", 2)


async def test_a_write_into_error_that_loses_its_race_removes_its_error_row(store, clock):
    current = await create(store, clock)
    winner = await move(store, current, succeeded(current, clock), clock)
    with pytest.raises(ConcurrencyConflict):
        await move(store, current, declined(current, clock), clock)
    assert await error_rows(store) == set()
    assert await store.load("o-1") == winner


async def test_a_loser_into_error_keeps_the_winners_error_row(store, clock):
    current = await create(store, clock)
    await move(store, current, declined(current, clock), clock)
    with pytest.raises(ConcurrencyConflict):
        await move(store, current, declined(current, clock), clock, "scheduler-2")
    assert await error_rows(store) == {("o-1", 1)}


async def test_error_rows_are_reaped_once_old_and_not_live(store, clock):
    errored = await to_error(store, clock)
    [row] = (await store.errors.page(10)).rows
    assert await store.errors.reap(row, errored, grace=GRACE) is False  # live
    clock.advance(GRACE + timedelta(seconds=1))
    assert await store.errors.reap(row, None, grace=GRACE) is True
    assert await error_rows(store) == set()


async def test_a_failed_error_row_delete_is_only_logged(store, clock, monkeypatch, caplog):
    await to_error(store, clock)

    async def refused(*args, **kwargs):
        raise HttpResponseError(message="503 Server Busy")

    monkeypatch.setattr(store._orders, "delete_entity", refused)
    with caplog.at_level(logging.WARNING):
        await store.errors.discard("o-1", 1)
    assert "could not delete error index row o-1.1" in caplog.text
    monkeypatch.undo()
    assert await error_rows(store) == {("o-1", 1)}


# ----------------------------------------------------------------------------- active index


async def test_active_index_put_add_due_postpone_discard(store, twin, clock):
    index = store.index
    bucket = int(index_partition("o-9")[1:])
    assert not await index.has("o-9", 1)
    await index.put("o-9", 1, "order", T0 + timedelta(minutes=5))
    assert await index.has("o-9", 1) and twin.index.has("o-9", 1)
    assert await index.add("o-9", 1, "order") is False  # there already: left as it is
    assert await index.due(bucket, T0, 10) == ()
    [row] = await index.due(bucket, T0 + timedelta(minutes=5), 10)
    assert isinstance(row, ActiveRow)
    assert (row.order_id, row.generation, row.due_at) == ("o-9", 1, T0 + timedelta(minutes=5))
    assert await index.postpone(row, T0 + timedelta(hours=1)) is True
    assert await index.postpone(row, T0 + timedelta(hours=2)) is False  # stale ETag
    assert await index.due(bucket, T0 + timedelta(minutes=59), 10) == ()
    assert await index.add("o-9", 2, "order") is True
    await index.discard("o-9", 1)
    await index.discard("o-9", 1)  # already gone: nothing to do
    assert not await index.has("o-9", 1) and await index.has("o-9", 2)
    assert await active_rows(store) == {("o-9", 2)}


async def test_a_failed_discard_is_only_logged(store, monkeypatch, caplog):
    await store.index.put("o-9", 1, "order")

    async def refused(*args, **kwargs):
        raise HttpResponseError(message="503 Server Busy")

    monkeypatch.setattr(store._active, "delete_entity", refused)
    with caplog.at_level(logging.WARNING):
        await store.index.discard("o-9", 1)
    assert "could not delete index row o-9.1" in caplog.text
    monkeypatch.undo()
    assert await store.index.has("o-9", 1)


async def test_list_active_and_page_after_page_through_the_index(store, twin):
    expected = {f"o-{n}" for n in range(25)}
    for order_id in sorted(expected):
        await store.index.put(order_id, 1, "order")
    seen: list[str] = []
    continuation = None
    pages = 0
    while True:
        page = await store.list_active(7, continuation=continuation)
        assert page == twin.list_active(7, continuation=continuation)
        seen.extend(row.order_id for row in page.rows)
        pages += 1
        continuation = page.continuation
        if continuation is None:
            break
        assert pages < 30, "paging does not end"
    assert sorted(seen) == sorted(expected) and pages >= 4
    assert {row.order_id async for row in store.all_active()} == expected
    after = None
    walked: list[str] = []
    while True:
        rows, more = await store.index.page_after(10, after=after)
        assert (rows, more) == twin.index.page_after(10, after=after)
        walked.extend(row.order_id for row in rows)
        if not more:
            break
        after = (rows[-1].partition_key, rows[-1].row_key)
    assert sorted(walked) == sorted(expected)


async def test_list_active_of_an_empty_index(store):
    page = await store.list_active(10)
    assert (page.rows, page.continuation) == ((), None)
    assert await store.index.page_after(10) == ((), False)
    assert [row async for row in store.all_active()] == []


async def test_reap_active_deletes_only_old_garbage(store, clock):
    errored = await to_error(store, clock)
    noted = await store.annotate(errored, actor="operator-bob", event="acknowledged")
    with pytest.raises(ConcurrencyConflict):
        await move(store, errored, RESUBMIT, clock, "operator-ann")
    rows = {row.generation: row async for row in store.all_active()}
    assert set(rows) == {1, 2}  # 2: written ahead of the resubmit that lost
    order = await store.find("o-1")
    assert order == noted
    assert await store.reap_active(rows[2], order, grace=GRACE) is False  # too young
    clock.advance(GRACE + timedelta(seconds=1))
    assert await store.reap_active(rows[1], order, grace=GRACE) is False  # its current row
    assert await store.reap_active(rows[2], order, grace=GRACE) is True
    assert await active_rows(store) == {("o-1", 1)}


# ------------------------------------------------------------------------------ supervision


def lease(bucket: int, holder: str, etag: str | None = None) -> BucketLease:
    return BucketLease(bucket, holder=holder, until=T0 + timedelta(seconds=45), etag=etag)


async def test_a_lease_claim_racing_another_one_wins(store, twin):
    roster = await store.supervision.read()
    assert roster.buckets == tuple(BucketLease(b) for b in range(INDEX_BUCKETS))
    other = SupervisionTable(store._supervision)  # a second instance, same table

    async def claim(instance: str) -> dict[int, str]:
        until = T0 + timedelta(minutes=1)
        hold = [dataclasses.replace(b, holder=instance, until=until) for b in roster.buckets[:4]]
        table = store.supervision if instance == "sup-a" else other
        return await table.claim(Member(instance, until), hold, [])

    results = await asyncio.gather(claim("sup-a"), claim("sup-b"), return_exceptions=True)
    won = [r for r in results if isinstance(r, dict)]
    lost = [r for r in results if isinstance(r, ConcurrencyConflict)]
    assert (len(won), len(lost)) == (1, 1), results
    winner = "sup-a" if isinstance(results[0], dict) else "sup-b"
    after = await store.supervision.read()
    assert after == twin.supervision.read()
    assert {b.holder for b in after.buckets[:4]} == {winner}
    assert [m.instance for m in after.members] == [winner]  # the loser wrote nothing
    assert {b.bucket: b.etag for b in after.buckets[:4]} == won[0]


async def test_checkpoint_records_sweeps_and_skips_a_bucket_taken_over(store):
    table = store.supervision
    etags = await table.claim(Member("sup-a", T0), [lease(0, "sup-a"), lease(1, "sup-a")], [])
    held = {b: lease(b, "sup-a", etags[b]) for b in (0, 1)}
    sweeps = [Sweep(held[b], T0, 1.5, 3) for b in (0, 1)]
    assert await table.checkpoint(sweeps, "sup-a") == 2
    roster = await table.read()
    assert (roster.buckets[0].swept_at, roster.buckets[0].lag_s) == (T0, 1.5)
    # Bucket 1 taken over by sup-b: the batch fails and the rows are written one by one.
    taken = await table.claim(Member("sup-b", T0), [lease(1, "sup-b", roster.buckets[1].etag)], [])
    fresh = {b.bucket: b for b in roster.buckets}
    late = [Sweep(fresh[0], T0 + timedelta(seconds=30), 0.0, 0), Sweep(fresh[1], T0, 0.0, 0)]
    assert await table.checkpoint(late, "sup-a") == 1
    after = await table.read()
    assert after.buckets[0].swept_at == T0 + timedelta(seconds=30)
    assert (after.buckets[1].holder, after.buckets[1].etag) == ("sup-b", taken[1])
    assert await table.checkpoint([], "sup-a") == 0


async def test_a_stale_claim_conflicts(store):
    table = store.supervision
    await table.claim(Member("sup-a", T0), [lease(0, "sup-a")], [])
    with pytest.raises(ConcurrencyConflict):
        await table.claim(Member("sup-b", T0), [lease(0, "sup-b")], [])  # no ETag: a create


# ------------------------------------------------------------------------------------ purge


async def test_purge_candidates_snapshot_and_purge(store, twin, clock):
    done = await to_processed(store, clock, "o-1")
    await store.index.discard("o-1", 1)
    await create(store, clock, "o-2")  # in flight: never a candidate
    later = T0 + timedelta(days=31)
    found = [c async for c in store.purge_candidates(later)]
    assert [(c.order_id, c.state) for c in found] == [("o-1", ProcessState.PROCESSED)]
    assert found == list(twin.purge_candidates(later))
    snapshot = await store.snapshot("o-1")
    assert snapshot is not None and snapshot.process == done
    assert [e.event for e in snapshot.timeline] == ["created", "processed"]
    # Changed since the snapshot: nothing is deleted.
    noted = await store.annotate(done, actor="op", event="noted")
    assert await store.purge(snapshot) is DeleteOutcome.CHANGED
    assert await store.load("o-1") == noted
    fresh = await store.snapshot("o-1")
    assert fresh is not None
    assert await store.purge(fresh) is DeleteOutcome.PURGED
    assert await store.find("o-1") is None
    assert await store.purge(fresh) is DeleteOutcome.GONE
    assert await store.finish_purge("o-1") is False


async def test_an_interrupted_purge_is_finished(store, twin, clock, sync_service):
    done = await to_processed(store, clock)
    # What a purge of many rows leaves when it stops after its first transaction.
    orders = sync_service.get_table_client(store.orders_table)
    orders.delete_entity("o-1", "process")
    orders.create_entity({"PartitionKey": "o-1", "RowKey": PURGE_MARKER_ROW, "Generation": 1})
    assert done.generation == 1
    found = [c async for c in store.purge_candidates(T0 + timedelta(days=31))]
    assert [(c.order_id, c.interrupted) for c in found] == [("o-1", True)]
    assert await store.snapshot("o-1") is None
    assert await store.finish_purge("o-1") is True
    assert [
        row
        async for row in store._orders.query_entities(
            "PartitionKey eq @pk", parameters={"pk": "o-1"}
        )
    ] == []


async def test_the_purge_log(store, twin):
    for n in range(3):
        await store.purges.record(f"run-{n}", T0 + timedelta(days=n), {"purged": n})
    assert await store.purges.recent(2) == [{"purged": 2}, {"purged": 1}]
    assert twin.purges.recent(5) == await store.purges.recent(5)
    with pytest.raises(ValueError, match="limit"):
        await store.purges.recent(0)


# ---------------------------------------------------------------------------- the requests


async def test_requests_per_operation_equal_the_sync_stores(
    store, counts, clock, azurite, unique_name, sync_service
):
    """One scenario, run step by step on the async store and on the sync store (own tables):
    each step costs the same requests on both."""
    sync_counts = OperationCounts()
    names = Tables(*(unique_name(n) for n in ("orders", "active", "supervision")))
    sync_clock = Clock(T0)
    service = SyncService.from_connection_string(
        azurite.connection_string, request_hook=sync_counts.request_hook("table")
    )
    sync = SyncStore(service, clock=sync_clock, **names.kwargs())
    sync.ensure_tables()
    try:
        seen: dict[str, dict[str, int]] = {}
        for name, step in scenario():
            counts.reset()
            sync_counts.reset()
            aio_result = step(store, clock)
            assert asyncio.iscoroutine(aio_result), name
            await aio_result
            assert not asyncio.iscoroutine(step(sync, sync_clock)), name
            assert counts.snapshot() == sync_counts.snapshot(), name
            seen[name] = counts.snapshot()
    finally:
        for name in (names.orders, names.active, names.supervision):
            sync_service.delete_table(name)
        service.close()
    assert seen["create"] == {"table.post": 2}
    assert seen["load"] == {"table.get": 1}
    assert seen["save"] == {"table.post": 1}
    assert seen["save into Error"] == {"table.post": 2}
    assert seen["resubmit"] == {"table.put": 1, "table.post": 1, "table.delete": 1}


def scenario() -> list[tuple[str, Callable[[Any, Clock], Any]]]:
    """Steps that work on either store: each returns what the store returns (a coroutine for
    the async one, which the test awaits)."""
    state: dict[Any, Any] = {}

    def keep(store: Any, key: str, value: Any) -> Any:
        state[(id(store), key)] = value
        return value

    def got(store: Any, key: str) -> Any:
        return state[(id(store), key)]

    def then(result: Any, done: Callable[[Any], Any]) -> Any:
        """``done(result)``, awaiting ``result`` first when it is a coroutine."""
        if asyncio.iscoroutine(result):

            async def chained() -> Any:
                value = done(await result)
                return await value if asyncio.iscoroutine(value) else value

            return chained()
        return done(result)

    def create_step(order_id: str, key: str, workflow: str = "order"):
        def step(store: Any, clock: Clock) -> Any:
            order = submitted(order_id, workflow=workflow)
            decided, entry = new_order(clock, order)
            return then(store.create(order, decided, entry), lambda r: keep(store, key, r))

        return step

    def save_step(key: str, event: Callable[[Order, Clock], Any], actor: str = "scheduler-1"):
        def step(store: Any, clock: Clock) -> Any:
            current = got(store, key)
            after, entry = decide(current, event(current, clock), clock, actor)
            return then(store.save(current, after, entry), lambda r: keep(store, key, r))

        return step

    def call(method: str, *args: Any, **kwargs: Any):
        def step(store: Any, clock: Clock) -> Any:
            target: Any = store
            for part in method.split("."):
                target = getattr(target, part)
            return target(*args, **kwargs)

        return step

    def collect(method: str, *args: Any):
        def step(store: Any, clock: Clock) -> Any:
            found = getattr(store, method)(*args)
            if hasattr(found, "__aiter__"):

                async def drain() -> list[Any]:
                    return [item async for item in found]

                return drain()
            return list(found)

        return step

    def purge_step(order_id: str):
        def step(store: Any, clock: Clock) -> Any:
            return then(store.snapshot(order_id), lambda snap: store.purge(snap))

        return step

    def claim_step(store: Any, clock: Clock) -> Any:
        until = T0 + timedelta(minutes=1)
        hold = [lease(b, "sup-a") for b in range(INDEX_BUCKETS)]
        return then(
            store.supervision.claim(Member("sup-a", until), hold, []),
            lambda etags: keep(store, "etags", etags),
        )

    def checkpoint_step(store: Any, clock: Clock) -> Any:
        etags = got(store, "etags")
        sweeps = [Sweep(lease(b, "sup-a", etags[b]), T0, 0.0, 0) for b in range(4)]
        return store.supervision.checkpoint(sweeps, "sup-a")

    later = T0 + timedelta(days=31)
    return [
        ("create", create_step("o-1", "o1")),
        ("duplicate create", create_step("o-1", "dup")),
        ("load", call("load", "o-1")),
        ("find missing", call("find", "nope")),
        ("get_order", call("get_order", "o-1")),
        ("get_timeline", call("get_timeline", "o-1")),
        ("save", save_step("o1", succeeded)),
        ("create o-2", create_step("o-2", "o2")),
        ("save into Error", save_step("o2", declined)),
        ("resubmit", save_step("o2", lambda order, clock: RESUBMIT, "operator-ann")),
        ("annotate", lambda store, clock: store.annotate(got(store, "o2"), actor="op", event="n")),
        ("list_active", call("list_active", 1000)),
        ("all_active", collect("all_active")),
        ("index.has", call("index.has", "o-1", 1)),
        ("index.put", call("index.put", "o-3", 1, "order")),
        ("index.due", call("index.due", int(index_partition("o-3")[1:]), later)),
        ("index.page_after", call("index.page_after", 10)),
        ("index.discard", call("index.discard", "o-3", 1)),
        ("errors.page", call("errors.page", 10)),
        ("create o-4", create_step("o-4", "o4", "single_step")),
        ("save o-4 done", save_step("o4", succeeded)),
        ("purge_candidates", collect("purge_candidates", later)),
        ("snapshot", call("snapshot", "o-4")),
        ("purge", purge_step("o-4")),
        ("finish_purge", call("finish_purge", "o-4")),
        ("purges.record", call("purges.record", "run-1", T0, {"purged": 1})),
        ("purges.recent", call("purges.recent", 5)),
        ("supervision.read", call("supervision.read")),
        ("supervision.claim", claim_step),
        ("supervision.checkpoint", checkpoint_step),
    ]


# ---------------------------------------------------------------------------- lifecycle


async def test_an_async_with_store_works_and_closes(azurite, tables, clock, sync_service):
    async with AioStore.from_connection_string(
        azurite.connection_string, clock=clock, **tables.kwargs()
    ) as store:
        await store.ensure_tables()
        created = await create(store, clock)
        assert await store.load("o-1") == created
    try:
        assert SyncStore(sync_service, **tables.kwargs()).load("o-1") == created
    finally:
        for name in (tables.orders, tables.active, tables.supervision):
            sync_service.delete_table(name)


async def test_the_generated_twin_shares_the_plain_names():
    """What both twins import from plain modules has one identity."""
    from core import active_index, error_index, purge_log, state_store, supervision
    from core.aio import active_index as aio_active_index
    from core.aio import error_index as aio_error_index
    from core.aio import purge_log as aio_purge_log
    from core.aio import supervision as aio_supervision

    assert aio_active_index.DEFAULT_GRACE is active_index.DEFAULT_GRACE
    assert aio_active_index.index_partition is active_index.index_partition
    assert aio_error_index.ErrorRow is error_index.ErrorRow
    assert aio_purge_log.MemoryPurgeLog is purge_log.MemoryPurgeLog
    assert aio_supervision.BucketLease is supervision.BucketLease
    assert aio_supervision.MemorySupervision is supervision.MemorySupervision
    assert aio_store_module.AlreadyExists is state_store.AlreadyExists
    assert aio_store_module.PURGE_MARKER_ROW == state_store.PURGE_MARKER_ROW
