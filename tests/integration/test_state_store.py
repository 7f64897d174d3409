"""The order state store: what the Table store (on Azurite) and the in-memory store share, and
what only the Table store has to get right (one transaction per write, the WriteId rule, ids
refused before any request, requests per operation, the active-order and Error indexes, the
supervision leases, the purge and its log), checked where it matters through another store
over the same tables.

Orders are made and moved by the lifecycle (``domain.lifecycle.submit`` / ``decide``), as the
shell does: the store is tested on the records the app really writes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError, ServiceRequestError, ServiceResponseError
from azure.data.tables import TableTransactionError

from adapters.op_counts import OperationCounts
from adapters.store import state_store as store_module
from adapters.store.active_index import INDEX_BUCKETS, ActiveOrderIndex, index_partition
from adapters.store.error_index import ErrorOrderIndex, ErrorRow
from adapters.store.purge_log import PurgeLog
from adapters.store.records import PURGE_MARKER_ROW, OrderRecords
from adapters.store.rows import (
    ActivePage,
    ActiveRow,
    AlreadyExists,
    ConcurrencyConflict,
    CorruptOrderState,
    OrderNotFound,
    Unconfirmed,
)
from adapters.store.supervision import BucketLease, Member, SupervisionTable, Sweep
from adapters.tables import OutcomeUnknown, TableService
from devstack.memory import MemoryStore
from domain import events, lifecycle, operator_actions
from domain.ids import InvalidId
from domain.messages import MAX_TOTAL_CENTS, AgentRequest, AgentResponse, OrderSubmitted
from domain.order import Order, StepState, TimelineEntry
from domain.retention import DeleteOutcome
from domain.states import ProcessState
from domain.workflows import WORKFLOWS, resolve
from tests.support.storage_faults import through_proxy
from tests.support.submissions import submission

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

T0 = datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)
GRACE = timedelta(minutes=10)
HOSTILE = "x' or PartitionKey ne '"

Store = MemoryStore | OrderRecords


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


@dataclasses.dataclass
class Backend:
    """A store under test, and how to look at its Error index (the two differ there)."""

    kind: str
    store: Any
    clock: Clock

    async def error_rows(self) -> set[tuple[str, int]]:
        if isinstance(self.store, MemoryStore):
            rows: Any = self.store.errors.rows()
        else:
            rows = (await self.store.errors.page(1000)).rows
        return {(row.order_id, row.generation) for row in rows}

    async def active_rows(self) -> set[tuple[str, int]]:
        page = await self.store.list_active(1000)
        return {(row.order_id, row.generation) for row in page.rows}

    async def events(self, order_id: str = "o-1") -> list[str]:
        return [entry.event for entry in await self.store.get_timeline(order_id)]


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def counts() -> OperationCounts:
    """Table requests of the store under test, counted by its request hook (adapters.op_counts)."""
    return OperationCounts()


@pytest.fixture
async def service(azurite, counts) -> AsyncIterator[TableService]:
    client = TableService.from_connection_string(
        azurite.connection_string, request_hook=counts.request_hook("table")
    )
    yield client
    await client.close()


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
def tables(unique_name) -> Tables:
    return Tables(*(unique_name(n) for n in ("orders", "active", "supervision")))


@pytest.fixture
async def table_store(service, tables, clock, counts) -> AsyncIterator[OrderRecords]:
    store = OrderRecords(service, clock=clock, **tables.kwargs())
    await store.ensure_tables()
    counts.reset()
    yield store
    for name in (tables.orders, tables.active, tables.supervision):
        await service.delete_table(name)


@pytest.fixture
async def other(azurite, tables, clock, table_store) -> AsyncIterator[OrderRecords]:
    """Another store over the tables of ``table_store``, on its own connections: an independent
    look at what the store under test wrote."""
    store = OrderRecords.from_connection_string(
        azurite.connection_string, clock=clock, **tables.kwargs()
    )
    yield store
    await store.close()


@pytest.fixture(params=["memory", "table"])
def backend(request, clock) -> Backend:
    if request.param == "memory":
        return Backend("memory", MemoryStore(clock), clock)
    return Backend("table", request.getfixturevalue("table_store"), clock)


# ------------------------------------------------------------------------------- helpers


def submitted(order_id: str = "o-1", **overrides: Any) -> OrderSubmitted:
    return submission(order_id, at=T0, **overrides)


def context(clock: Clock, workflow: str = "order", actor: str = "scheduler-1") -> events.Context:
    return events.Context(workflow=resolve(WORKFLOWS, workflow), now=clock(), actor=actor)


def new_order(clock: Clock, order: OrderSubmitted) -> tuple[Order, TimelineEntry]:
    decision = lifecycle.submit(order, context(clock, order.workflow))
    assert decision.order is not None and decision.entry is not None
    return decision.order, decision.entry


async def create(
    store: Store, clock: Clock, order_id: str = "o-1", workflow: str = "order", **fields: Any
) -> Order:
    order = submitted(order_id, workflow=workflow, **fields)
    result = await store.create(order, *new_order(clock, order))
    assert isinstance(result, Order)
    return result


def decide(
    order: Order,
    event: events.Event | operator_actions.Action,
    clock: Clock,
    actor: str = "scheduler-1",
) -> tuple[Order, TimelineEntry]:
    ctx = context(clock, order.workflow, actor)
    if isinstance(event, operator_actions.Action):
        decision = operator_actions.act(order, event, ctx)
    else:
        decision = lifecycle.decide(order, event, ctx)
    assert decision.order is not None and decision.entry is not None, decision.note
    return decision.order, decision.entry


async def move(
    store: Store,
    order: Order,
    event: events.Event | operator_actions.Action,
    clock: Clock,
    actor: str = "scheduler-1",
) -> Order:
    """Decide on ``event`` and save the decision, as the shell does."""
    return await store.save(order, *decide(order, event, clock, actor))


def replied(order: Order, clock: Clock, outcome: str = "succeeded", **fields: Any):
    """The answer to the agent request ``order`` has in flight."""
    [sent] = [o.message for o in order.outbox if isinstance(o.message, AgentRequest)]
    response = AgentResponse(
        order_id=sent.order_id,
        step=sent.step,
        operation=sent.operation,
        attempt=sent.attempt,
        idempotency_key=sent.idempotency_key,
        outcome=outcome,  # type: ignore[arg-type]
        responded_at=clock(),
        **fields,
    )
    return events.Replied(response)


def succeeded(order: Order, clock: Clock, result: dict | None = None):
    return replied(order, clock, result=result or {"ref": f"{order.current_step}-{order.attempt}"})


def declined(order: Order, clock: Clock):
    return replied(order, clock, "failed", error_code="out_of_stock", error_message="none left")


def transient(order: Order, clock: Clock):
    return replied(order, clock, "failed", transient=True, error_code="timeout")


RESUBMIT = operator_actions.Resubmit(
    actor="operator-ann", reason="stock arrived", outbox_delivered=True
)


async def to_error(store: Store, clock: Clock, order_id: str = "o-1") -> Order:
    """An order whose first step was declined: Error, nothing to undo."""
    current = await create(store, clock, order_id)
    errored = await move(store, current, declined(current, clock), clock)
    assert errored.state is ProcessState.ERROR
    return errored


async def to_processed(store: Store, clock: Clock, order_id: str = "o-1") -> Order:
    current = await create(store, clock, order_id, workflow="single_step")
    done = await move(store, current, succeeded(current, clock), clock)
    assert done.state is ProcessState.PROCESSED
    return done


def bare(order: Order) -> Order:
    """``order`` without what the store adds (ETag, WriteId)."""
    return dataclasses.replace(order, etag="", write_id="")


async def error_rows(store: OrderRecords) -> set[tuple[str, int]]:
    page = await store.errors.page(1000)
    return {(row.order_id, row.generation) for row in page.rows}


async def active_rows(store: OrderRecords) -> set[tuple[str, int]]:
    return {(row.order_id, row.generation) async for row in store.all_active()}


# ============================================================ shared by both implementations

# ---------------------------------------------------------------------------------- create


async def test_create_then_load_equals_the_order(backend):
    store, clock = backend.store, backend.clock
    order = submitted()
    decided, entry = new_order(clock, order)
    result = await store.create(order, decided, entry)
    assert isinstance(result, Order)
    assert result.etag
    assert bare(result) == decided
    assert await store.load("o-1") == result
    assert await store.find("o-1") == result
    assert await store.get_timeline("o-1") == [entry]
    record = await store.get_order("o-1")
    assert record.details == order
    assert record.payload_hash == order.content_hash()
    assert record.process == result
    assert await backend.active_rows() == {("o-1", 1)}
    assert await backend.error_rows() == set()


async def test_creating_the_same_id_again(backend):
    store, clock = backend.store, backend.clock
    first = await create(store, clock)
    # A redelivery: the same order, submitted again with a fresh timestamp.
    again = submitted(submitted_at=T0 + timedelta(minutes=1))
    result = await store.create(again, *new_order(clock, again))
    assert result == AlreadyExists(True, first_hash := submitted().content_hash(), first)
    # Another order under a taken id.
    other = submitted(items=[{"sku": "SKU-9", "quantity": 1, "unit_price_cents": 1}])
    result = await store.create(other, *new_order(clock, other))
    assert isinstance(result, AlreadyExists)
    assert (result.same_payload, result.existing_payload_hash) == (False, first_hash)
    assert result.order == first
    assert await store.load("o-1") == first
    assert (await store.get_order("o-1")).details == submitted()
    assert await backend.events() == ["created"]
    assert await backend.active_rows() == {("o-1", 1)}


async def test_a_duplicate_of_a_finished_order_leaves_no_active_row(backend):
    store, clock = backend.store, backend.clock
    done = await to_processed(store, clock)
    await store.index.discard("o-1", 1)  # the shell, once the final outbox was sent
    order = submitted(workflow="single_step")
    result = await store.create(order, *new_order(clock, order))
    assert result == AlreadyExists(True, order.content_hash(), done)
    assert await backend.active_rows() == set()


async def test_a_duplicate_of_a_finished_order_keeps_the_row_of_an_outbox_still_owed(backend):
    # The write into Error committed but its alert was not sent yet (the send failed, or the
    # writer crashed): the active-index row is what tells the Supervisor to send it. A duplicate
    # submission arriving meanwhile must not remove that row - the intake sends nothing for a
    # finished order (events.Resent flushes only orders in flight).
    store, clock = backend.store, backend.clock
    errored = await to_error(store, clock)
    assert any(o.to == "alerts" for o in errored.outbox)
    order = submitted()
    result = await store.create(order, *new_order(clock, order))
    assert isinstance(result, AlreadyExists) and result.order == errored
    assert lifecycle.decide(errored, events.Resent(), context(clock)).send == ()
    assert await backend.active_rows() == {("o-1", 1)}


# ------------------------------------------------------------------------------------ reads


async def test_missing_order(backend):
    store = backend.store
    with pytest.raises(OrderNotFound, match="order nope does not exist"):
        await store.load("nope")
    with pytest.raises(OrderNotFound):
        await store.get_order("nope")
    assert await store.find("nope") is None
    assert await store.get_timeline("nope") == []


async def test_orders_do_not_see_each_other(backend):
    store, clock = backend.store, backend.clock
    for order_id in ("o-1", "o-10", "o-2"):
        await create(store, clock, order_id)
    o10 = await store.load("o-10")
    await move(store, o10, succeeded(o10, clock), clock)
    assert (await store.load("o-1")).current_step == "reserve_inventory"
    assert (await store.load("o-10")).current_step == "charge_payment"
    assert await backend.events("o-1") == ["created"]
    assert await backend.events("o-10") == ["created", "step_succeeded"]
    assert await backend.active_rows() == {("o-1", 1), ("o-10", 1), ("o-2", 1)}


# ----------------------------------------------------------------------------------- writes


async def test_save_with_the_current_etag_succeeds_and_appends_the_timeline_entry(backend):
    store, clock = backend.store, backend.clock
    current = await create(store, clock)
    clock.advance(timedelta(seconds=2))
    after, entry = decide(current, succeeded(current, clock), clock)
    saved = await store.save(current, after, entry)
    assert saved.etag and saved.etag != current.etag
    assert bare(saved) == bare(after)
    assert await store.load("o-1") == saved
    assert (await store.get_timeline("o-1"))[-1] == entry
    assert await backend.events() == ["created", "step_succeeded"]
    assert (saved.state, saved.current_step) == (ProcessState.PROCESSING, "charge_payment")
    assert saved.step("reserve_inventory").result == {"ref": "reserve_inventory-1"}
    # The returned order is the one to write next with.
    again = await move(store, saved, succeeded(saved, clock), clock)
    assert await store.load("o-1") == again
    assert await backend.events() == ["created", "step_succeeded", "step_succeeded"]


async def test_save_with_a_stale_etag_raises_and_writes_nothing(backend):
    store, clock = backend.store, backend.clock
    current = await create(store, clock)
    winner = await move(store, current, succeeded(current, clock), clock)
    timeline = await store.get_timeline("o-1")
    cancel = operator_actions.Cancel(actor="operator-ann", reason="customer called")
    with pytest.raises(ConcurrencyConflict, match="changed by someone else"):
        await move(store, current, cancel, clock, actor="operator-ann")
    assert await store.load("o-1") == winner
    assert await store.get_timeline("o-1") == timeline
    assert await backend.error_rows() == set()


async def test_concurrent_writers_from_the_same_read_exactly_one_wins(backend):
    store, clock = backend.store, backend.clock
    current = await create(store, clock)
    contenders = 6
    barrier = asyncio.Barrier(contenders)
    outcomes: dict[str, str] = {}

    async def contend(n: int) -> None:
        actor = f"operator-{n}"
        after, entry = decide(current, operator_actions.Cancel(actor, "race"), clock, actor)
        await barrier.wait()
        try:
            await store.save(current, after, entry)
            outcome = "won"
        except ConcurrencyConflict:
            outcome = "lost"
        outcomes[actor] = outcome

    await asyncio.wait_for(asyncio.gather(*(contend(n) for n in range(contenders))), 30)
    winners = [actor for actor, outcome in outcomes.items() if outcome == "won"]
    assert len(outcomes) == contenders and len(winners) == 1
    timeline = await store.get_timeline("o-1")
    assert [e.event for e in timeline] == ["created", "compensation_started"]
    assert timeline[-1].actor == winners[0]
    stored = await store.load("o-1")
    assert (stored.state, stored.locked_by) == (ProcessState.COMPENSATING, winners[0])


async def test_a_full_run_to_processed(backend):
    store, clock = backend.store, backend.clock
    current = await create(store, clock)
    for _ in range(3):
        clock.advance(timedelta(seconds=1))
        current = await move(store, current, succeeded(current, clock), clock)
    assert await store.load("o-1") == current
    assert (current.state, current.locked_by, current.complete_by) == (
        ProcessState.PROCESSED,
        None,
        None,
    )
    assert [(s.state, s.result) for s in current.steps] == [
        (StepState.SUCCEEDED, {"ref": "reserve_inventory-1"}),
        (StepState.SUCCEEDED, {"ref": "charge_payment-2"}),
        (StepState.SUCCEEDED, {"ref": "create_shipment-3"}),
    ]
    timeline = await store.get_timeline("o-1")
    assert [(e.seq, e.event, e.from_state, e.to_state) for e in timeline] == [
        (0, "created", None, ProcessState.PROCESSING),
        (1, "step_succeeded", ProcessState.PROCESSING, ProcessState.PROCESSING),
        (2, "step_succeeded", ProcessState.PROCESSING, ProcessState.PROCESSING),
        (3, "processed", ProcessState.PROCESSING, ProcessState.PROCESSED),
    ]
    assert current.timeline_seq == 3
    assert [e.seq for e in await store.get_timeline("o-1", after_seq=1, limit=1)] == [2]
    assert [e.seq for e in await store.get_timeline("o-1", after_seq=3)] == []
    # The final outbox is still owed: the row goes when the shell has sent it.
    assert await backend.active_rows() == {("o-1", 1)}
    assert await backend.error_rows() == set()


async def test_save_of_a_missing_order_raises_not_found(backend):
    store, clock = backend.store, backend.clock
    current = await create(store, clock)
    after, entry = decide(current, declined(current, clock), clock)
    assert after.state is ProcessState.ERROR
    ghost = dataclasses.replace(current, order_id="o-ghost")
    with pytest.raises(OrderNotFound):
        await store.save(ghost, dataclasses.replace(after, order_id="o-ghost"), entry)
    assert await store.find("o-ghost") is None
    assert await backend.error_rows() == set()  # the row written ahead of the write is gone again


async def test_annotate_records_without_changing_the_order(backend):
    store, clock = backend.store, backend.clock
    errored = await to_error(store, clock)
    clock.advance(timedelta(minutes=1))
    noted = await store.annotate(
        errored, actor="operator-ann", event="acknowledged", detail="on it"
    )
    assert noted.etag != errored.etag
    assert await store.load("o-1") == noted
    unchanged = dataclasses.replace(
        noted, updated_at=errored.updated_at, timeline_seq=errored.timeline_seq
    )
    assert bare(unchanged) == bare(errored)
    last = (await store.get_timeline("o-1"))[-1]
    assert last == TimelineEntry(
        seq=errored.timeline_seq + 1,
        at=clock(),
        actor="operator-ann",
        event="acknowledged",
        from_state=ProcessState.ERROR,
        to_state=ProcessState.ERROR,
        step=None,
        attempt=errored.attempt,
        detail="on it",
    )
    assert await backend.error_rows() == {("o-1", 1)}
    with pytest.raises(ConcurrencyConflict):
        await store.annotate(errored, actor="operator-bob", event="acknowledged")


# ---------------------------------------------------------------------- Error and resubmit


async def test_entering_error_puts_an_error_row_and_a_resubmit_removes_it(backend):
    store, clock = backend.store, backend.clock
    errored = await to_error(store, clock)
    assert errored.last_error and "out_of_stock" in errored.last_error
    assert await backend.error_rows() == {("o-1", 1)}
    await store.index.discard("o-1", 1)  # the shell, once the alert was sent
    assert await backend.active_rows() == set()

    clock.advance(timedelta(hours=1))
    resubmitted = await move(store, errored, RESUBMIT, clock, actor="operator-ann")
    assert resubmitted.generation == 2 and resubmitted.state.in_flight
    assert resubmitted.failure_count == 0 and resubmitted.last_error is None
    assert resubmitted.step("reserve_inventory").generation == 2
    assert await store.load("o-1") == resubmitted
    assert await backend.error_rows() == set()
    assert await backend.active_rows() == {("o-1", 2)}
    assert await backend.events() == ["created", "error", "resubmitted"]
    # The resubmitted generation can enter Error again: a row of its own.
    again = await move(store, resubmitted, declined(resubmitted, clock), clock)
    assert again.state is ProcessState.ERROR
    assert await backend.error_rows() == {("o-1", 2)}


async def test_a_write_into_error_that_loses_its_race_removes_its_error_row(backend):
    store, clock = backend.store, backend.clock
    current = await create(store, clock)
    winner = await move(store, current, succeeded(current, clock), clock)
    with pytest.raises(ConcurrencyConflict):
        await move(store, current, declined(current, clock), clock)
    assert await backend.error_rows() == set()
    assert await store.load("o-1") == winner


async def test_a_resubmit_that_loses_its_race_leaves_only_garbage_the_reaper_removes(backend):
    store, clock = backend.store, backend.clock
    errored = await to_error(store, clock)
    await store.index.discard("o-1", 1)
    noted = await store.annotate(errored, actor="operator-bob", event="acknowledged")
    with pytest.raises(ConcurrencyConflict):
        await move(store, errored, RESUBMIT, clock, actor="operator-ann")
    assert await store.load("o-1") == noted
    assert await backend.error_rows() == {("o-1", 1)}
    # The index row was written ahead of the write that lost: garbage, reaped after the grace.
    [row] = (await store.list_active()).rows
    assert (row.order_id, row.generation) == ("o-1", 2)
    assert await store.reap_active(row, await store.find("o-1"), grace=GRACE) is False
    clock.advance(GRACE + timedelta(seconds=1))
    assert await store.reap_active(row, await store.find("o-1"), grace=GRACE) is True
    assert await backend.active_rows() == set()


# ------------------------------------------------------------------------------------ index


async def test_index_has_put_discard(backend):
    index, clock = backend.store.index, backend.clock
    assert not await index.has("o-9", 1)
    await index.put("o-9", 1, "order")
    assert await index.has("o-9", 1)
    assert not await index.has("o-9", 2) and not await index.has("o-90", 1)
    [row] = (await backend.store.list_active()).rows
    assert (row.order_id, row.generation, row.workflow, row.written_at) == (
        "o-9",
        1,
        "order",
        clock(),
    )
    assert row.row_key == "o-9.1" and row.etag
    await index.put("o-9", 2, "order")
    await index.discard("o-9", 1)
    assert not await index.has("o-9", 1) and await index.has("o-9", 2)
    await index.discard("o-9", 1)  # already gone: nothing to do
    assert await backend.active_rows() == {("o-9", 2)}


async def every_page(
    read: Callable[[str | None], Awaitable[ActivePage]],
) -> tuple[list[str], int]:
    """The order ids on every page ``read`` gives, each continuation followed, and how many
    pages there were."""
    seen: list[str] = []
    continuation = None
    pages = 0
    while True:
        page = await read(continuation)
        seen.extend(row.order_id for row in page.rows)
        pages += 1
        continuation = page.continuation
        if continuation is None:
            return seen, pages
        assert pages < 30, "paging does not end"


async def test_list_active_pages_with_continuation(backend):
    store = backend.store
    expected = {f"o-{n}" for n in range(25)}
    for order_id in expected:
        await store.index.put(order_id, 1, "order")  # index rows alone are enough here

    async def read(continuation: str | None) -> ActivePage:
        page = await store.list_active(7, continuation=continuation)
        assert len(page.rows) <= 7
        return page

    seen, pages = await every_page(read)
    assert sorted(seen) == sorted(expected)
    assert pages >= 4
    assert (await store.list_active(1000)).continuation is None


async def test_list_active_of_an_empty_index(backend):
    page = await backend.store.list_active(10)
    assert page.rows == () and page.continuation is None


async def test_reap_active_deletes_only_old_garbage(backend):
    store, clock = backend.store, backend.clock
    live = await create(store, clock, "o-live")
    await to_processed(store, clock, "o-done")  # its row: as if the shell had not deleted it yet
    errored = await to_error(store, clock, "o-old")
    await move(store, errored, RESUBMIT, clock, actor="operator-ann")  # row 1 left over, row 2 live
    await store.index.put("o-missing", 1, "order")  # as if create crashed after the index row
    rows = {(row.order_id, row.generation): row for row in (await store.list_active()).rows}
    assert set(rows) == {
        ("o-live", 1),
        ("o-done", 1),
        ("o-old", 1),
        ("o-old", 2),
        ("o-missing", 1),
    }

    async def reap() -> set[tuple[str, int]]:
        return {
            key
            for key, row in rows.items()
            if await store.reap_active(row, await store.find(row.order_id), grace=GRACE)
        }

    assert await reap() == set()  # everything is younger than the grace period
    clock.advance(GRACE + timedelta(seconds=1))
    # A finished order's row of its current generation stays: it may still owe its final
    # messages (the shell or the Supervisor's flush removes it after sending them).
    assert await reap() == {("o-old", 1), ("o-missing", 1)}
    assert await backend.active_rows() == {("o-live", 1), ("o-done", 1), ("o-old", 2)}
    assert await store.load("o-live") == live


async def test_reap_keeps_a_row_rewritten_since_it_was_listed(backend):
    store, clock = backend.store, backend.clock
    await store.index.put("o-gone", 1, "order")  # as if a create crashed after the index row
    [row] = (await store.list_active()).rows
    clock.advance(timedelta(hours=1))
    await store.index.put("o-gone", 1, "order")  # e.g. a submission re-wrote it meanwhile
    assert await store.reap_active(row, None, grace=GRACE) is False
    assert await backend.active_rows() == {("o-gone", 1)}
    [fresh] = (await store.list_active()).rows
    clock.advance(timedelta(hours=1))
    assert await store.reap_active(fresh, None, grace=GRACE) is True
    assert await backend.active_rows() == set()


async def test_a_finished_orders_own_row_is_never_reaped(backend):
    store, clock = backend.store, backend.clock
    errored = await to_error(store, clock)
    [row] = (await store.list_active()).rows
    clock.advance(timedelta(days=1))
    assert await store.reap_active(row, errored, grace=GRACE) is False
    assert await backend.active_rows() == {("o-1", 1)}


async def test_reaping_a_row_already_gone_reports_it_gone(backend):
    # Two Supervisors reap the same listed row: the SDK does not tell which one deleted it.
    store, clock = backend.store, backend.clock
    await store.index.put("o-gone", 1, "order")
    [row] = (await store.list_active()).rows
    clock.advance(GRACE + timedelta(seconds=1))
    assert await store.reap_active(row, None, grace=GRACE) is True
    assert await store.reap_active(row, None, grace=GRACE) is True
    assert await backend.active_rows() == set()


async def test_due_rows_are_those_due_by_now_in_that_bucket(backend):
    store = backend.store
    ids = [f"o-{n}" for n in range(40)]
    for n, order_id in enumerate(ids):
        await store.index.put(order_id, 1, "order", T0 + timedelta(seconds=n))
    now = T0 + timedelta(seconds=19.5)
    found = {
        row.order_id: row
        for bucket in range(INDEX_BUCKETS)
        for row in await store.index.due(bucket, now, 1000)
    }
    assert set(found) == set(ids[:20])
    assert all(row.partition_key == index_partition(row.order_id) for row in found.values())
    bucket = int(index_partition("o-0")[1:])
    in_bucket = await store.index.due(bucket, now, 1000)
    assert [r.due_at for r in in_bucket] == sorted(r.due_at for r in in_bucket)
    assert len(await store.index.due(bucket, now, 1)) == 1


async def test_a_row_without_a_due_time_is_due_at_once(backend):
    store, clock = backend.store, backend.clock
    await store.index.put("o-1", 1, "order")
    bucket = int(index_partition("o-1")[1:])
    assert [r.order_id for r in await store.index.due(bucket, clock(), 10)] == ["o-1"]


async def test_postpone_moves_a_row_up_unless_it_changed_since_read(backend):
    store = backend.store
    bucket = int(index_partition("o-1")[1:])
    await store.index.put("o-1", 1, "order", T0)
    [row] = await store.index.due(bucket, T0, 10)
    assert await store.index.postpone(row, T0 + timedelta(minutes=5)) is True
    assert await store.index.due(bucket, T0 + timedelta(minutes=4), 10) == ()
    # An earlier due time written after the row was read must win over the Supervisor's move.
    [row] = await store.index.due(bucket, T0 + timedelta(minutes=5), 10)
    await store.index.put("o-1", 1, "order", T0 + timedelta(minutes=1))
    assert await store.index.postpone(row, T0 + timedelta(hours=1)) is False
    [kept] = await store.index.due(bucket, T0 + timedelta(minutes=1), 10)
    assert kept.due_at == T0 + timedelta(minutes=1)


# ------------------------------------------------------------------------------ hand-outs

HAND_OUT = "a" * 32
AGAIN = "b" * 32
LEASE = timedelta(seconds=13)


def one_bucket(count: int) -> tuple[int, list[str]]:
    """``count`` order ids whose index rows share a bucket, and that bucket."""
    ids = [f"h-{n}" for n in range(400)]
    bucket = index_partition(ids[0])
    same = [i for i in ids if index_partition(i) == bucket][:count]
    return int(bucket[1:]), same


async def test_a_hand_out_marks_the_rows_as_found_and_leaves_out_one_changed_since(backend):
    store = backend.store
    bucket, ids = one_bucket(3)
    for order_id in ids:
        await store.index.put(order_id, 1, "order", T0)
    found = await store.index.due(bucket, T0, 10)
    await store.index.put(ids[2], 1, "order", T0 - timedelta(seconds=1))  # a writer, since
    until = T0 + LEASE

    marked = await store.index.hand_out(found, until, T0, HAND_OUT)

    assert sorted(r.order_id for r in marked) == sorted(ids[:2])
    for row in marked:
        assert (row.due_at, row.dispatch_id, row.dispatched_at) == (until, HAND_OUT, T0)
        assert row.overdue_since == T0
    # Not due again until the lease ends: the next tick does not hand them out again.
    assert [
        r.order_id for r in await store.index.due(bucket, until - timedelta(seconds=1), 10)
    ] == [ids[2]]
    returned = {r.order_id: r for r in await store.index.due(bucket, until, 10)}
    for row in marked:
        assert returned[row.order_id] == row  # as the hand-out left it: same version
    assert returned[ids[2]].dispatch_id == ""


async def test_a_recovery_ends_the_hand_out_also_after_the_row_was_handed_out_again(backend):
    store = backend.store
    bucket, [order_id] = one_bucket(1)
    await store.index.put(order_id, 1, "order", T0)
    [first] = await store.index.hand_out(
        await store.index.due(bucket, T0, 10), T0 + LEASE, T0, HAND_OUT
    )
    later = T0 + LEASE
    [again] = await store.index.hand_out(
        await store.index.due(bucket, later, 10), later + LEASE, later, AGAIN
    )
    assert again.overdue_since == T0  # still overdue since it first came due

    # The first recovery's message arrives late: nobody else moved the row on, so it does.
    assert await store.index.postpone(first, T0 + timedelta(minutes=5)) is True
    [moved] = [r for r in await store.index.due(bucket, T0 + timedelta(minutes=5), 10)]
    assert (moved.due_at, moved.dispatch_id, moved.overdue_since) == (
        T0 + timedelta(minutes=5),
        "",
        T0 + timedelta(minutes=5),
    )
    # The second finds it moved on already, and leaves it.
    assert await store.index.postpone(again, T0 + timedelta(minutes=9)) is False
    assert [r.due_at for r in await store.index.due(bucket, T0 + timedelta(hours=1), 10)] == [
        T0 + timedelta(minutes=5)
    ]


async def test_the_rows_of_a_hand_out_still_handed_out_are_read_back_in_one_query(backend):
    store = backend.store
    bucket, ids = one_bucket(4)
    for order_id in ids:
        await store.index.put(order_id, 1, "order", T0)
    found = sorted(await store.index.due(bucket, T0, 10), key=lambda r: r.row_key)
    marked = await store.index.hand_out(found[:3], T0 + LEASE, T0, HAND_OUT)
    await store.index.postpone(marked[1], T0 + timedelta(minutes=5))  # recovered already
    keys = [row.row_key for row in found]  # the fourth was never handed out

    still = await store.index.handed_out(bucket, keys)

    assert [r.row_key for r in still] == [marked[0].row_key, marked[2].row_key]
    assert [r.etag for r in still] == [marked[0].etag, marked[2].etag]
    assert await store.index.handed_out(bucket, []) == ()


async def test_the_rows_of_a_message_are_moved_on_together(backend):
    store = backend.store
    bucket, ids = one_bucket(3)
    for order_id in ids:
        await store.index.put(order_id, 1, "order", T0)
    marked = sorted(
        await store.index.hand_out(await store.index.due(bucket, T0, 10), T0 + LEASE, T0, HAND_OUT),
        key=lambda r: r.order_id,
    )
    await store.index.put(marked[0].order_id, 1, "order", T0 + timedelta(seconds=3))  # a writer
    later = T0 + timedelta(minutes=5)

    moved = await store.index.move_on([(row, later) for row in marked])

    assert moved == 2  # the transaction refused, then row by row: the writer's row kept
    stored = {r.order_id: r for r in await store.index.due(bucket, later, 10)}
    assert {o: (r.due_at, r.dispatch_id) for o, r in stored.items()} == {
        marked[0].order_id: (T0 + timedelta(seconds=3), ""),
        marked[1].order_id: (later, ""),
        marked[2].order_id: (later, ""),
    }
    assert await store.index.move_on([]) == 0


async def test_a_recovery_leaves_a_handed_out_row_a_writer_moved_since(backend):
    store = backend.store
    bucket, [order_id] = one_bucket(1)
    await store.index.put(order_id, 1, "order", T0)
    [row] = await store.index.hand_out(
        await store.index.due(bucket, T0, 10), T0 + LEASE, T0, HAND_OUT
    )
    await store.index.put(order_id, 1, "order", T0 + timedelta(seconds=2))  # an earlier due time
    assert await store.index.postpone(row, T0 + timedelta(minutes=5)) is False
    [kept] = await store.index.due(bucket, T0 + timedelta(seconds=2), 10)
    assert (kept.due_at, kept.dispatch_id) == (T0 + timedelta(seconds=2), "")


# ======================================================================= Table store only


async def raw_rows(store: OrderRecords, service: TableService, pk: str) -> dict[str, Any]:
    table = service.get_table_client(store.orders_table)
    rows = table.query_entities("PartitionKey eq @pk", parameters={"pk": pk})
    return {row["RowKey"]: row async for row in rows}


async def during(
    counts: OperationCounts, action: Callable[[], Awaitable[Any]]
) -> tuple[dict[str, int], Any]:
    counts.reset()
    result = await action()
    return counts.snapshot(), result


def transaction_error(status: int, code: str) -> TableTransactionError:
    error = TableTransactionError(message=f"0:{code}")
    error.status_code = status
    error.error_code = code  # type: ignore[assignment]
    return error


async def test_create_writes_its_rows_in_one_transaction(table_store, service, clock, counts):
    order = submitted()
    decided, entry = new_order(clock, order)
    cost, result = await during(counts, lambda: table_store.create(order, decided, entry))
    assert isinstance(result, Order)
    assert cost == {"table.post": 2}  # the index row (an insert), then the batch
    rows = await raw_rows(table_store, service, "o-1")
    assert list(rows) == ["details", "process", "timeline-00000000"]
    assert rows["process"]["WriteId"] == result.write_id != ""
    assert rows["process"].metadata["etag"] == result.etag


async def test_requests_per_operation(table_store, clock, counts):
    current = await create(table_store, clock)
    assert (await during(counts, lambda: table_store.load("o-1")))[0] == {"table.get": 1}
    assert (await during(counts, lambda: table_store.find("o-1")))[0] == {"table.get": 1}
    assert (await during(counts, lambda: table_store.get_order("o-1")))[0] == {"table.get": 2}
    assert (await during(counts, lambda: table_store.get_timeline("o-1")))[0] == {"table.get": 1}
    after, entry = decide(current, succeeded(current, clock), clock)
    assert (await during(counts, lambda: table_store.save(current, after, entry)))[0] == {
        "table.post": 1
    }
    # Into Error: the Error-index row first, then the batch.
    current = await create(table_store, clock, "o-2")
    after, entry = decide(current, declined(current, clock), clock)
    cost, errored = await during(counts, lambda: table_store.save(current, after, entry))
    assert errored.state is ProcessState.ERROR
    assert cost == {"table.post": 2}  # an insert: a row already there is another writer's
    # Out of Error: the new active-index row first, the batch, then the Error row deleted.
    after, entry = decide(errored, RESUBMIT, clock, "operator-ann")
    cost, resubmitted = await during(counts, lambda: table_store.save(errored, after, entry))
    assert cost == {"table.put": 1, "table.post": 1, "table.delete": 1}
    note = await during(
        counts, lambda: table_store.annotate(resubmitted, actor="op", event="noted")
    )
    assert note[0] == {"table.post": 1}


async def test_a_writer_that_loses_the_race_into_error_keeps_the_winners_error_row(backend):
    """Two writers decide, on the same state, that the order enters Error; the second one's
    write loses on its ETag. The Error row the winner wrote stays: the loser only deletes a row
    it inserted itself."""
    store, clock = backend.store, backend.clock
    current = await create(store, clock)
    after, entry = decide(current, declined(current, clock), clock)
    await store.save(current, after, entry)
    late, late_entry = decide(current, declined(current, clock), clock, "scheduler-2")
    with pytest.raises(ConcurrencyConflict):
        await store.save(current, late, late_entry)
    assert await backend.error_rows() == {("o-1", 1)}
    assert (await store.load("o-1")).state is ProcessState.ERROR


async def test_the_error_index_is_a_partition_of_the_orders_table(table_store, service, clock):
    await to_error(table_store, clock)
    [row] = (await raw_rows(table_store, service, "~error")).values()
    assert (row["RowKey"], row["OrderID"], row["Generation"]) == ("o-1.1", "o-1", 1)
    assert row["WrittenAt"] == clock()
    assert (await table_store.get_timeline("o-1"))[-1].event == "error"


async def test_a_hand_out_whose_answer_was_lost_is_read_back(table_store, clock, monkeypatch):
    bucket, ids = one_bucket(2)
    for order_id in ids:
        await table_store.index.put(order_id, 1, "order", T0)
    found = await table_store.index.due(bucket, T0, 10)
    table = table_store._active
    real_submit = table.submit_transaction
    applies = True

    async def answer_lost(operations, **kwargs):
        if applies:
            await real_submit(list(operations), **kwargs)
        raise OutcomeUnknown("the connection was reset after the request went out")

    monkeypatch.setattr(table, "submit_transaction", answer_lost)
    marked = await table_store.index.hand_out(found, T0 + LEASE, T0, HAND_OUT)
    assert sorted(r.order_id for r in marked) == sorted(ids)  # ours: they carry its id
    assert all(r.dispatch_id == HAND_OUT for r in marked)

    applies = False
    later = T0 + LEASE
    again = await table_store.index.due(bucket, later, 10)
    assert await table_store.index.hand_out(again, later + LEASE, later, AGAIN) == ()
    assert {r.dispatch_id for r in await table_store.index.due(bucket, later, 10)} == {HAND_OUT}


async def test_a_hand_out_refused_twice_marks_each_row_on_its_own(table_store, monkeypatch):
    """Recoveries move rows on while a tick marks: a transaction refused again and again (one
    of its rows changed each time) ends with each row marked on its own."""
    bucket, ids = one_bucket(3)
    for order_id in ids:
        await table_store.index.put(order_id, 1, "order", T0)
    found = await table_store.index.due(bucket, T0, 10)
    await table_store.index.put(ids[0], 1, "order", T0 + timedelta(seconds=1))  # moved on

    async def refused(operations, **kwargs):
        raise transaction_error(412, "UpdateConditionNotSatisfied")

    monkeypatch.setattr(table_store._active, "submit_transaction", refused)
    marked = await table_store.index.hand_out(found, T0 + LEASE, T0, HAND_OUT)

    assert sorted(r.order_id for r in marked) == sorted(ids[1:])
    monkeypatch.undo()
    stored = {r.order_id: r for r in await table_store.index.due(bucket, T0 + LEASE, 10)}
    assert {o: stored[o].dispatch_id for o in ids} == {
        ids[0]: "",
        ids[1]: HAND_OUT,
        ids[2]: HAND_OUT,
    }
    assert all(stored[r.order_id] == r for r in marked)


async def test_an_sdk_retry_of_a_committed_save_is_not_a_conflict(table_store, clock, monkeypatch):
    # The first try of the batch committed but its response was lost; the SDK's resend then
    # fails with 412 because of our own write. The store recognises its WriteId.
    current = await create(table_store, clock)
    table = table_store._orders
    real_submit = table.submit_transaction

    async def commit_then_412(operations, **kwargs):
        await real_submit(list(operations), **kwargs)
        raise transaction_error(412, "UpdateConditionNotSatisfied")

    monkeypatch.setattr(table, "submit_transaction", commit_then_412)
    after, entry = decide(current, declined(current, clock), clock)
    saved = await table_store.save(current, after, entry)
    assert saved == await table_store.load("o-1")
    assert bare(saved) == bare(after)
    assert [e.event for e in await table_store.get_timeline("o-1")] == ["created", "error"]
    assert (await table_store.errors.page(10)).rows[0].order_id == "o-1"  # kept: it is ours
    assert await error_rows(table_store) == {("o-1", 1)}


def resend_each_batch(store: OrderRecords, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each batch of the orders table is committed and sent again, as the SDK resends one whose
    answer it lost; the answer to the resend is the service's own."""
    table = store._orders
    real_submit = table.submit_transaction

    async def commit_then_resend(operations, **kwargs):
        operations = list(operations)
        await real_submit(operations, **kwargs)
        return await real_submit(operations, **kwargs)

    monkeypatch.setattr(table, "submit_transaction", commit_then_resend)


async def test_an_sdk_resend_of_a_committed_save_is_not_a_conflict(table_store, clock, monkeypatch):
    # The same, with the service's own answer to the resent batch.
    current = await create(table_store, clock)
    resend_each_batch(table_store, monkeypatch)
    saved = await move(table_store, current, succeeded(current, clock), clock)
    assert saved == await table_store.load("o-1")
    assert [e.event for e in await table_store.get_timeline("o-1")] == ["created", "step_succeeded"]


async def test_an_sdk_resend_of_a_committed_create_is_that_create(table_store, clock, monkeypatch):
    resend_each_batch(table_store, monkeypatch)
    order = submitted()
    decided, entry = new_order(clock, order)
    result = await table_store.create(order, decided, entry)
    assert isinstance(result, Order), "its own rows, found by its WriteId: no duplicate"
    assert result == await table_store.load("o-1")
    assert bare(result) == decided
    assert [row for row in (await table_store.list_active()).rows if row.order_id == "o-1"]


@pytest.mark.parametrize(
    ("status", "code"),
    [(400, "PropertyValueTooLarge"), (409, "TableBeingDeleted"), (500, "InternalError")],
)
async def test_other_transaction_errors_propagate(table_store, clock, monkeypatch, status, code):
    current = await create(table_store, clock)
    table = table_store._orders

    async def fail(operations, **kwargs):
        raise transaction_error(status, code)

    monkeypatch.setattr(table, "submit_transaction", fail)
    with pytest.raises(TableTransactionError) as caught:
        await move(table_store, current, succeeded(current, clock), clock)
    assert caught.value.status_code == status
    order = submitted("o-2")
    with pytest.raises(TableTransactionError):
        await table_store.create(order, *new_order(clock, order))
    monkeypatch.undo()
    assert await table_store.load("o-1") == current
    assert await table_store.find("o-2") is None


async def test_a_conflict_with_another_writer_is_not_taken_for_our_retry(
    table_store, clock, monkeypatch
):
    current = await create(table_store, clock)
    table = table_store._orders
    real_submit = table.submit_transaction

    async def someone_else_first(operations, **kwargs):
        # Another instance writes between our read and our batch.
        monkeypatch.setattr(table, "submit_transaction", real_submit)
        stored = await table_store.load("o-1")
        await table_store.annotate(stored, actor="operator-bob", event="acknowledged")
        return await real_submit(list(operations), **kwargs)

    monkeypatch.setattr(table, "submit_transaction", someone_else_first)
    with pytest.raises(ConcurrencyConflict, match="now Processing at 1"):
        await move(table_store, current, succeeded(current, clock), clock)
    assert [e.event for e in await table_store.get_timeline("o-1")] == ["created", "acknowledged"]


@pytest.mark.parametrize("hostile", [HOSTILE, "../x", "a/b", "", "é", "a" * 65, "~error"])
async def test_hostile_ids_are_refused_before_any_request(table_store, clock, counts, hostile):
    current = await create(table_store, clock)
    after, entry = decide(current, succeeded(current, clock), clock)
    order = submitted()
    decided, first = new_order(clock, order)
    counts.reset()
    for call in (
        table_store.load,
        table_store.find,
        table_store.get_order,
        table_store.get_timeline,
    ):
        with pytest.raises(InvalidId):
            await call(hostile)
    with pytest.raises(InvalidId):
        await table_store.create(order, dataclasses.replace(decided, order_id=hostile), first)
    with pytest.raises(InvalidId):
        await table_store.save(dataclasses.replace(current, order_id=hostile), after, entry)
    with pytest.raises(InvalidId):
        await table_store.annotate(
            dataclasses.replace(current, order_id=hostile), actor="a", event="e"
        )
    assert counts.snapshot() == {}


async def test_a_save_cannot_move_an_order_to_another_id(table_store, clock, counts):
    current = await create(table_store, clock)
    after, entry = decide(current, succeeded(current, clock), clock)
    counts.reset()
    with pytest.raises(ValueError):
        await table_store.save(current, dataclasses.replace(after, order_id="o-2"), entry)
    assert counts.snapshot() == {}  # refused before any request
    assert await table_store.load("o-1") == current
    assert await table_store.find("o-2") is None


async def test_null_fields_are_removed_by_the_replace(table_store, service, clock):
    current = await create(table_store, clock)
    assert "LockedBy" in (await raw_rows(table_store, service, "o-1"))["process"]
    released = await move(table_store, current, transient(current, clock), clock)
    assert released.state is ProcessState.PENDING and released.locked_by is None
    row = (await raw_rows(table_store, service, "o-1"))["process"]
    assert "LockedBy" not in row and "CompleteBy" not in row
    assert row["NextAttemptAt"] == released.next_attempt_at
    assert await table_store.load("o-1") == released


async def test_large_payloads_and_results_are_split_and_read_back(table_store, service, clock):
    order = submitted()
    decided, entry = new_order(clock, order)
    payload = {"blob": "é😀" * 12_000}  # 72 KiB of UTF-16
    created = await table_store.create(order, dataclasses.replace(decided, payload=payload), entry)
    assert isinstance(created, Order)
    result = {"blob": "ü" * 40_000, "n": list(range(1000))}  # 80 KiB of UTF-16
    saved = await move(table_store, created, succeeded(created, clock, result), clock)
    row = (await raw_rows(table_store, service, "o-1"))["process"]
    assert row["AgentPayloadParts"] > 1 and row["StepsParts"] > 1
    loaded = await table_store.load("o-1")
    assert loaded == saved
    assert loaded.payload == payload and loaded.step("reserve_inventory").result == result


async def test_the_largest_order_fits(table_store, clock):
    items = [
        {"sku": f"{i:03d}-" + "s" * 60, "quantity": 1_000_000, "unit_price_cents": 10**7}
        for i in range(100)
    ]
    big = submitted(items=items, customer_id="c" * 64)
    created = await table_store.create(big, *new_order(clock, big))
    assert isinstance(created, Order)
    record = await table_store.get_order("o-1")
    assert record.details == big
    assert record.details.total_cents == MAX_TOTAL_CENTS
    assert record.process == created


async def test_datetimes_round_trip_exactly(table_store, clock):
    clock.now = datetime(2031, 12, 31, 23, 59, 29, 999999, tzinfo=UTC)
    created = await create(table_store, clock)
    loaded = await table_store.load("o-1")
    assert loaded.created_at == clock() and loaded.complete_by == created.complete_by
    for stamp in (loaded.created_at, loaded.updated_at, loaded.complete_by):
        assert type(stamp) is datetime and stamp.tzinfo is UTC


async def test_create_is_atomic_when_a_row_conflicts(table_store, service, clock):
    # A stray row at the end of the batch: the service rejects the whole transaction.
    table = service.get_table_client(table_store.orders_table)
    await table.create_entity({"PartitionKey": "o-1", "RowKey": "timeline-00000000", "Stray": True})
    order = submitted()
    with pytest.raises(CorruptOrderState, match="no details row"):
        await table_store.create(order, *new_order(clock, order))
    assert list(await raw_rows(table_store, service, "o-1")) == ["timeline-00000000"]


async def test_create_is_atomic_when_a_property_is_too_large(
    table_store, service, clock, monkeypatch
):
    real = store_module.order_entity

    def oversized(order: Order) -> dict:
        return {**real(order), "Junk": "x" * 40_000}  # > 64 KiB as UTF-16

    monkeypatch.setattr(store_module, "order_entity", oversized)
    order = submitted()
    with pytest.raises(TableTransactionError) as caught:
        await table_store.create(order, *new_order(clock, order))
    assert caught.value.status_code == 400
    assert await raw_rows(table_store, service, "o-1") == {}
    with pytest.raises(OrderNotFound):
        await table_store.load("o-1")


async def test_an_unreadable_process_row_is_corrupt(table_store, service, clock):
    await create(table_store, clock)
    table = service.get_table_client(table_store.orders_table)
    await table.update_entity({"PartitionKey": "o-1", "RowKey": "process", "ProcessState": "Bogus"})
    with pytest.raises(CorruptOrderState, match="process row of o-1"):
        await table_store.load("o-1")
    with pytest.raises(CorruptOrderState, match="process row of o-1"):
        await table_store.get_order("o-1")


async def test_an_order_without_its_details_row_is_corrupt(table_store, service, clock):
    await create(table_store, clock)
    await service.get_table_client(table_store.orders_table).delete_entity("o-1", "details")
    with pytest.raises(CorruptOrderState, match="details"):
        await table_store.get_order("o-1")
    order = submitted()
    with pytest.raises(CorruptOrderState, match="no details row"):
        await table_store.create(order, *new_order(clock, order))


# ------------------------------------------------------- Table store only: every part of it


async def test_the_store_is_built_of_its_tables(table_store):
    assert isinstance(table_store.index, ActiveOrderIndex)
    assert isinstance(table_store.errors, ErrorOrderIndex)
    assert isinstance(table_store.purges, PurgeLog)
    assert isinstance(table_store.supervision, SupervisionTable)


async def test_create_then_load_find_get_order_and_timeline(table_store, other, clock):
    order = submitted()
    decided, entry = new_order(clock, order)
    result = await table_store.create(order, decided, entry)
    assert isinstance(result, Order) and result.etag and result.write_id
    assert bare(result) == decided
    assert await table_store.load("o-1") == result == await other.load("o-1")
    assert await table_store.find("o-1") == result
    assert await table_store.get_timeline("o-1") == [entry]
    record = await table_store.get_order("o-1")
    assert (record.details, record.payload_hash, record.process) == (
        order,
        order.content_hash(),
        result,
    )
    assert await active_rows(table_store) == {("o-1", 1)}
    assert await table_store.index.has("o-1", 1)
    assert await error_rows(table_store) == set()


async def test_creating_the_same_id_again_is_already_exists(table_store, other, clock):
    first = await create(table_store, clock)
    again = submitted(submitted_at=T0 + timedelta(minutes=1))
    result = await table_store.create(again, *new_order(clock, again))
    assert result == AlreadyExists(True, submitted().content_hash(), first)
    another = submitted(items=[{"sku": "SKU-9", "quantity": 1, "unit_price_cents": 1}])
    result = await table_store.create(another, *new_order(clock, another))
    assert isinstance(result, AlreadyExists)
    assert (result.same_payload, result.order) == (False, first)
    assert [e.event for e in await other.get_timeline("o-1")] == ["created"]
    assert await active_rows(table_store) == {("o-1", 1)}


# ------------------------------------------------------------------------------------ reads


async def test_a_missing_order(table_store, clock):
    with pytest.raises(OrderNotFound, match="order nope does not exist"):
        await table_store.load("nope")
    assert await table_store.find("nope") is None
    with pytest.raises(OrderNotFound):
        await table_store.get_order("nope")
    assert await table_store.get_timeline("nope") == []
    assert await table_store.snapshot("nope") is None
    # A save of an order that is gone.
    ghost = await create(table_store, clock, "o-2")
    after, entry = decide(ghost, succeeded(ghost, clock), clock)
    snapshot = await table_store.snapshot("o-2")
    assert snapshot is not None
    assert await table_store.purge(snapshot) is DeleteOutcome.PURGED
    with pytest.raises(OrderNotFound):
        await table_store.save(ghost, after, entry)


async def test_timeline_after_and_limit(table_store, clock):
    current = await create(table_store, clock)
    current = await move(table_store, current, succeeded(current, clock), clock)
    current = await table_store.annotate(current, actor="op", event="noted")
    events = [e.event for e in await table_store.get_timeline("o-1")]
    assert events == ["created", "step_succeeded", "noted"]
    assert [e.seq for e in await table_store.get_timeline("o-1", after_seq=0, limit=1)] == [1]


# ----------------------------------------------------------------------------------- writes


async def test_save_with_the_current_etag_then_with_a_stale_one(table_store, other, clock):
    current = await create(table_store, clock)
    saved = await move(table_store, current, succeeded(current, clock), clock)
    assert saved.etag != current.etag and await table_store.load("o-1") == saved
    with pytest.raises(ConcurrencyConflict, match="expected Processing at timeline 0"):
        await move(table_store, current, succeeded(current, clock), clock, "scheduler-2")
    assert await other.load("o-1") == saved
    assert [e.event for e in await other.get_timeline("o-1")] == ["created", "step_succeeded"]


async def test_concurrent_saves_from_one_read_exactly_one_wins(table_store, other, clock):
    current = await create(table_store, clock)
    results = await asyncio.gather(
        *(
            move(table_store, current, succeeded(current, clock), clock, f"scheduler-{n}")
            for n in range(4)
        ),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, Order)]
    lost = [r for r in results if isinstance(r, ConcurrencyConflict)]
    assert (len(won), len(lost)) == (1, 3), results
    assert await other.load("o-1") == won[0]
    assert len(await other.get_timeline("o-1")) == 2


# ------------------------------------------------------------------------------ Error index


async def test_the_error_row_holds_the_generation_and_when_it_entered(table_store, other, clock):
    errored = await to_error(table_store, clock)
    [row] = (await table_store.errors.page(10)).rows
    assert isinstance(row, ErrorRow)
    assert (row.order_id, row.generation, row.written_at) == ("o-1", 1, clock())
    assert (await other.errors.page(10)).rows == (row,)
    resubmitted = await move(table_store, errored, RESUBMIT, clock, "operator-ann")
    assert resubmitted.generation == 2 and resubmitted.state.in_flight
    assert await error_rows(table_store) == set()
    assert await table_store.index.has("o-1", 2)


async def test_error_rows_are_reaped_once_old_and_not_live(table_store, clock):
    errored = await to_error(table_store, clock)
    [row] = (await table_store.errors.page(10)).rows
    assert await table_store.errors.reap(row, errored, grace=GRACE) is False  # live
    clock.advance(GRACE + timedelta(seconds=1))
    assert await table_store.errors.reap(row, None, grace=GRACE) is True
    assert await error_rows(table_store) == set()


def refuse_deletes(table: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every delete on ``table`` is answered 503 Server Busy."""

    async def refused(*args, **kwargs):
        raise HttpResponseError(message="503 Server Busy")

    monkeypatch.setattr(table, "delete_entity", refused)


async def test_a_failed_error_row_delete_is_only_logged(table_store, clock, monkeypatch, caplog):
    await to_error(table_store, clock)
    refuse_deletes(table_store._orders, monkeypatch)
    with caplog.at_level(logging.WARNING):
        await table_store.errors.discard("o-1", 1)
    assert "could not delete error index row o-1.1" in caplog.text
    monkeypatch.undo()
    assert await error_rows(table_store) == {("o-1", 1)}


# ----------------------------------------------------------------------------- active index


async def test_active_index_put_add_due_postpone_discard(table_store, other, clock):
    index = table_store.index
    bucket = int(index_partition("o-9")[1:])
    assert not await index.has("o-9", 1)
    await index.put("o-9", 1, "order", T0 + timedelta(minutes=5))
    assert await index.has("o-9", 1) and await other.index.has("o-9", 1)
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
    assert await active_rows(table_store) == {("o-9", 2)}


async def test_a_failed_discard_is_only_logged(table_store, monkeypatch, caplog):
    await table_store.index.put("o-9", 1, "order")
    refuse_deletes(table_store._active, monkeypatch)
    with caplog.at_level(logging.WARNING):
        await table_store.index.discard("o-9", 1)
    assert "could not delete index row o-9.1" in caplog.text
    monkeypatch.undo()
    assert await table_store.index.has("o-9", 1)


async def test_list_active_and_page_after_page_through_the_index(table_store, other):
    expected = {f"o-{n}" for n in range(25)}
    for order_id in sorted(expected):
        await table_store.index.put(order_id, 1, "order")

    async def read(continuation: str | None) -> ActivePage:
        page = await table_store.list_active(7, continuation=continuation)
        assert page == await other.list_active(7, continuation=continuation)
        return page

    seen, pages = await every_page(read)
    assert sorted(seen) == sorted(expected) and pages >= 4
    assert {row.order_id async for row in table_store.all_active()} == expected
    after = None
    walked: list[str] = []
    while True:
        rows, more = await table_store.index.page_after(10, after=after)
        assert (rows, more) == await other.index.page_after(10, after=after)
        walked.extend(row.order_id for row in rows)
        if not more:
            break
        after = (rows[-1].partition_key, rows[-1].row_key)
    assert sorted(walked) == sorted(expected)


async def test_an_empty_index_pages_nothing(table_store):
    page = await table_store.list_active(10)
    assert (page.rows, page.continuation) == ((), None)
    assert await table_store.index.page_after(10) == ((), False)
    assert [row async for row in table_store.all_active()] == []


async def test_reap_active_keeps_the_current_row_and_reaps_a_lost_resubmits(table_store, clock):
    errored = await to_error(table_store, clock)
    noted = await table_store.annotate(errored, actor="operator-bob", event="acknowledged")
    with pytest.raises(ConcurrencyConflict):
        await move(table_store, errored, RESUBMIT, clock, "operator-ann")
    rows = {row.generation: row async for row in table_store.all_active()}
    assert set(rows) == {1, 2}  # 2: written ahead of the resubmit that lost
    order = await table_store.find("o-1")
    assert order == noted
    assert await table_store.reap_active(rows[2], order, grace=GRACE) is False  # too young
    clock.advance(GRACE + timedelta(seconds=1))
    assert await table_store.reap_active(rows[1], order, grace=GRACE) is False  # its current row
    assert await table_store.reap_active(rows[2], order, grace=GRACE) is True
    assert await active_rows(table_store) == {("o-1", 1)}


# ------------------------------------------------------------------------------ supervision


def lease(bucket: int, holder: str, etag: str | None = None) -> BucketLease:
    return BucketLease(bucket, holder=holder, until=T0 + timedelta(seconds=45), etag=etag)


async def test_a_lease_claim_racing_another_one_wins(table_store, other):
    roster = await table_store.supervision.read()
    assert roster.buckets == tuple(BucketLease(b) for b in range(INDEX_BUCKETS))
    rival = SupervisionTable(table_store._supervision)  # a second instance, same table

    async def claim(instance: str) -> dict[int, str]:
        until = T0 + timedelta(minutes=1)
        hold = [dataclasses.replace(b, holder=instance, until=until) for b in roster.buckets[:4]]
        table = table_store.supervision if instance == "sup-a" else rival
        return await table.claim(Member(instance, until), hold, [])

    results = await asyncio.gather(claim("sup-a"), claim("sup-b"), return_exceptions=True)
    won = [r for r in results if isinstance(r, dict)]
    lost = [r for r in results if isinstance(r, ConcurrencyConflict)]
    assert (len(won), len(lost)) == (1, 1), results
    winner = "sup-a" if isinstance(results[0], dict) else "sup-b"
    after = await table_store.supervision.read()
    assert after == await other.supervision.read()
    assert {b.holder for b in after.buckets[:4]} == {winner}
    assert [m.instance for m in after.members] == [winner]  # the loser wrote nothing
    assert {b.bucket: b.etag for b in after.buckets[:4]} == won[0]


async def test_checkpoint_records_sweeps_and_skips_a_bucket_taken_over(table_store):
    table = table_store.supervision
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


async def test_a_stale_claim_conflicts(table_store):
    table = table_store.supervision
    await table.claim(Member("sup-a", T0), [lease(0, "sup-a")], [])
    with pytest.raises(ConcurrencyConflict):
        await table.claim(Member("sup-b", T0), [lease(0, "sup-b")], [])  # no ETag: a create


# ------------------------------------------------------------------------------------ purge


async def test_purge_candidates_snapshot_and_purge(table_store, other, clock):
    done = await to_processed(table_store, clock, "o-1")
    await table_store.index.discard("o-1", 1)
    await create(table_store, clock, "o-2")  # in flight: never a candidate
    later = T0 + timedelta(days=31)
    found = [c async for c in table_store.purge_candidates(later)]
    assert [(c.order_id, c.state) for c in found] == [("o-1", ProcessState.PROCESSED)]
    assert found == [c async for c in other.purge_candidates(later)]
    snapshot = await table_store.snapshot("o-1")
    assert snapshot is not None and snapshot.process == done
    assert [e.event for e in snapshot.timeline] == ["created", "processed"]
    # Changed since the snapshot: nothing is deleted.
    noted = await table_store.annotate(done, actor="op", event="noted")
    assert await table_store.purge(snapshot) is DeleteOutcome.CHANGED
    assert await table_store.load("o-1") == noted
    fresh = await table_store.snapshot("o-1")
    assert fresh is not None
    assert await table_store.purge(fresh) is DeleteOutcome.PURGED
    assert await table_store.find("o-1") is None
    assert await table_store.purge(fresh) is DeleteOutcome.GONE
    assert await table_store.finish_purge("o-1") is False


async def test_an_interrupted_purge_is_finished(table_store, clock, service):
    done = await to_processed(table_store, clock)
    # What a purge of many rows leaves when it stops after its first transaction.
    orders = service.get_table_client(table_store.orders_table)
    await orders.delete_entity("o-1", "process")
    await orders.create_entity({"PartitionKey": "o-1", "RowKey": PURGE_MARKER_ROW, "Generation": 1})
    assert done.generation == 1
    found = [c async for c in table_store.purge_candidates(T0 + timedelta(days=31))]
    assert [(c.order_id, c.interrupted) for c in found] == [("o-1", True)]
    assert await table_store.snapshot("o-1") is None
    assert await table_store.finish_purge("o-1") is True
    assert [
        row
        async for row in table_store._orders.query_entities(
            "PartitionKey eq @pk", parameters={"pk": "o-1"}
        )
    ] == []


async def test_the_purge_log(table_store, other):
    for n in range(3):
        await table_store.purges.record(f"run-{n}", T0 + timedelta(days=n), {"purged": n})
    assert await table_store.purges.recent(2) == [{"purged": 2}, {"purged": 1}]
    assert await other.purges.recent(5) == await table_store.purges.recent(5)
    with pytest.raises(ValueError, match="limit"):
        await table_store.purges.recent(0)


# ---------------------------------------------------------------------------- the requests

REQUESTS: dict[str, dict[str, int]] = {
    "create": {"table.post": 2},
    "duplicate create": {"table.get": 2, "table.post": 2},
    "load": {"table.get": 1},
    "find missing": {"table.get": 1},
    "get_order": {"table.get": 2},
    "get_timeline": {"table.get": 1},
    "save": {"table.post": 1},
    "create o-2": {"table.post": 2},
    "save into Error": {"table.post": 2},
    "resubmit": {"table.put": 1, "table.post": 1, "table.delete": 1},
    "annotate": {"table.post": 1},
    "list_active": {"table.get": 1},
    "all_active": {"table.get": 1},
    "index.has": {"table.get": 1},
    "index.put": {"table.put": 1},
    "index.due": {"table.get": 1},
    "index.page_after": {"table.get": 1},
    "index.discard": {"table.delete": 1},
    "errors.page": {"table.get": 1},
    "create o-4": {"table.post": 2},
    "save o-4 done": {"table.post": 1},
    "purge_candidates": {"table.get": 1},
    "snapshot": {"table.get": 1},
    "purge": {"table.get": 1, "table.post": 1},
    "finish_purge": {"table.get": 1},
    "purges.record": {"table.put": 1},
    "purges.recent": {"table.get": 1},
    "supervision.read": {"table.get": 1},
    "supervision.claim": {"table.post": 1},
    "supervision.checkpoint": {"table.post": 1},
}
"""What each step of :func:`scenario` costs: the requests a step makes are the Table service's
bill and the hot path's latency, so a change to any of them is a change to review."""


async def test_requests_per_operation_step_by_step(table_store, counts, clock):
    seen: dict[str, dict[str, int]] = {}
    for name, step in scenario():
        counts.reset()
        await step(table_store, clock)
        seen[name] = counts.snapshot()
    assert seen == REQUESTS


Step = Callable[[OrderRecords, Clock], Awaitable[Any]]


def scenario() -> list[tuple[str, Step]]:
    """The store's operations, one step each, in an order in which each can run."""
    state: dict[str, Any] = {}

    def create_step(order_id: str, key: str, workflow: str = "order") -> Step:
        async def step(store: OrderRecords, clock: Clock) -> None:
            order = submitted(order_id, workflow=workflow)
            state[key] = await store.create(order, *new_order(clock, order))

        return step

    def save_step(
        key: str, event: Callable[[Order, Clock], Any], actor: str = "scheduler-1"
    ) -> Step:
        async def step(store: OrderRecords, clock: Clock) -> None:
            current = state[key]
            after, entry = decide(current, event(current, clock), clock, actor)
            state[key] = await store.save(current, after, entry)

        return step

    def call(method: str, *args: Any, **kwargs: Any) -> Step:
        async def step(store: OrderRecords, clock: Clock) -> Any:
            target: Any = store
            for part in method.split("."):
                target = getattr(target, part)
            return await target(*args, **kwargs)

        return step

    def collect(method: str, *args: Any) -> Step:
        async def step(store: OrderRecords, clock: Clock) -> list[Any]:
            return [item async for item in getattr(store, method)(*args)]

        return step

    async def annotate_step(store: OrderRecords, clock: Clock) -> None:
        await store.annotate(state["o2"], actor="op", event="n")

    async def purge_step(store: OrderRecords, clock: Clock) -> None:
        snapshot = await store.snapshot("o-4")
        assert snapshot is not None
        await store.purge(snapshot)

    async def claim_step(store: OrderRecords, clock: Clock) -> None:
        until = T0 + timedelta(minutes=1)
        hold = [lease(b, "sup-a") for b in range(INDEX_BUCKETS)]
        state["etags"] = await store.supervision.claim(Member("sup-a", until), hold, [])

    async def checkpoint_step(store: OrderRecords, clock: Clock) -> None:
        sweeps = [Sweep(lease(b, "sup-a", state["etags"][b]), T0, 0.0, 0) for b in range(4)]
        await store.supervision.checkpoint(sweeps, "sup-a")

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
        ("annotate", annotate_step),
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
        ("purge", purge_step),
        ("finish_purge", call("finish_purge", "o-4")),
        ("purges.record", call("purges.record", "run-1", T0, {"purged": 1})),
        ("purges.recent", call("purges.recent", 5)),
        ("supervision.read", call("supervision.read")),
        ("supervision.claim", claim_step),
        ("supervision.checkpoint", checkpoint_step),
    ]


# ---------------------------------------------------------------------------- lifecycle


async def test_a_store_used_as_a_context_manager_closes(azurite, tables, clock, service):
    async with OrderRecords.from_connection_string(
        azurite.connection_string, clock=clock, **tables.kwargs()
    ) as store:
        await store.ensure_tables()
        created = await create(store, clock)
        assert await store.load("o-1") == created
    try:
        assert await OrderRecords(service, **tables.kwargs()).load("o-1") == created
    finally:
        for name in (tables.orders, tables.active, tables.supervision):
            await service.delete_table(name)


# ------------------------------------------------------- writes whose outcome is unknown
# A transaction's answer can be lost after the service committed it (a read timeout, a reset,
# a 500 after the write was applied: the chaos run's storage proxy does all of these), or the
# service may fail before committing. The store reads the order's row once: if it carries the
# write's WriteId the write is ours; otherwise it raises Unconfirmed and the caller decides
# again on what is stored. Never guessed.


def lost_answer(kind: str) -> Exception:
    if kind == "timeout":
        return ServiceResponseError("the read timed out")
    error = HttpResponseError(message="500 InternalError")
    error.status_code = 500
    return error


class Flaky:
    """The orders table's transactions, made to commit (or not) and then fail as told."""

    def __init__(self, store, *, commit: bool, error: Exception) -> None:  # type: ignore[no-untyped-def]
        self.table = store._orders
        self.commit = commit
        self.error = error
        self.calls = 0
        self._submit = self.table.submit_transaction
        self.table.submit_transaction = self.submit

    async def submit(self, operations):  # type: ignore[no-untyped-def]
        self.calls += 1
        self.table.submit_transaction = self._submit  # once
        if self.commit:
            await self._submit(operations)
        raise self.error


@pytest.mark.parametrize("kind", ["timeout", "500"])
async def test_a_write_whose_answer_was_lost_after_it_landed_is_ours(
    table_store, other, clock: Clock, kind: str
) -> None:
    order = await create(table_store, clock)
    after, entry = decide(order, succeeded(order, clock), clock)
    Flaky(table_store, commit=True, error=lost_answer(kind))
    saved = await table_store.save(order, after, entry)
    stored = await other.load(order.order_id)
    assert saved.etag == stored.etag and saved.write_id == stored.write_id
    assert stored.current_step == "charge_payment" and stored.timeline_seq == order.timeline_seq + 1
    assert [e.event for e in await other.get_timeline(order.order_id)] == [
        "created",
        "step_succeeded",
    ]


@pytest.mark.parametrize("kind", ["timeout", "500"])
async def test_a_write_whose_answer_was_lost_before_it_landed_is_decided_again(
    table_store, other, clock: Clock, kind: str
) -> None:
    order = await create(table_store, clock)
    after, entry = decide(order, succeeded(order, clock), clock)
    Flaky(table_store, commit=False, error=lost_answer(kind))
    with pytest.raises(Unconfirmed, match="the write's answer was lost"):
        await table_store.save(order, after, entry)
    assert (await other.load(order.order_id)).etag == order.etag  # unchanged: decide again
    again, entry = decide(order, succeeded(order, clock), clock)
    saved = await table_store.save(order, again, entry)  # on the same ETag: it was not taken
    assert saved.current_step == "charge_payment"


async def test_a_refused_or_unsent_write_is_not_taken_for_a_lost_answer(
    table_store, clock: Clock, counts
) -> None:
    """A 4xx refused it; a connection that could not be made never carried it: the error is
    raised as it is, with no read (only a request that may have left is read for)."""
    order = await create(table_store, clock)
    after, entry = decide(order, succeeded(order, clock), clock)
    refused = HttpResponseError(message="400 InvalidInput")
    refused.status_code = 400
    flaky = Flaky(table_store, commit=False, error=refused)
    counts.reset()
    with pytest.raises(HttpResponseError, match="InvalidInput"):
        await table_store.save(order, after, entry)
    Flaky(table_store, commit=False, error=await unsent_write())
    with pytest.raises(ServiceRequestError, match="Cannot connect"):
        await table_store.save(order, after, entry)
    assert flaky.calls == 1
    assert counts.snapshot() == {}, "no read"


async def unsent_write() -> ServiceRequestError:
    """What the Table client raises for an insert to where nothing listens."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    conn = f"AccountName=a;AccountKey={'a' * 44};TableEndpoint=http://127.0.0.1:{port}/a"
    async with TableService.from_connection_string(conn) as nowhere:
        with pytest.raises(ServiceRequestError) as raised:
            await nowhere.get_table_client("t").create_entity({"PartitionKey": "p", "RowKey": "r"})
    return raised.value


# Through the storage fault proxy, in front of Azurite (tests.support.storage_faults): Azurite
# applies the write, then the proxy resets the client's connection (TCP RST) before the answer,
# or holds the answer past the client's read timeout, or answers 500 instead. aiohttp reports
# the reset as a connection error (azure-core: ServiceRequestError), though the write landed.

LOST_ANSWERS = ["reset_after_apply", "timeout_after_apply", "error_after_apply"]


@pytest.fixture
async def faulty(azurite, tables, clock):
    """The proxy, and a store over ``table_store``'s tables that reaches Azurite through it."""
    async with through_proxy(azurite, hold_s=2.0, read_timeout=1) as (proxy, service):
        yield proxy, OrderRecords(service, clock=clock, **tables.kwargs())


@pytest.mark.parametrize("fault", LOST_ANSWERS)
async def test_a_save_applied_whose_answer_was_lost_is_ours(table_store, faulty, clock, fault):
    proxy, store = faulty
    order = await create(table_store, clock)
    after, entry = decide(order, succeeded(order, clock), clock)
    proxy.arm(fault, method="POST", path="$batch")
    saved = await store.save(order, after, entry)
    assert proxy.faults == {fault: 1}, "the write was applied, and its answer lost"
    stored = await table_store.load(order.order_id)
    assert saved.etag == stored.etag and saved.write_id == stored.write_id
    assert [e.event for e in await table_store.get_timeline(order.order_id)] == [
        "created",
        "step_succeeded",
    ]


@pytest.mark.parametrize("fault", LOST_ANSWERS)
async def test_a_create_applied_whose_answer_was_lost_is_ours(table_store, faulty, clock, fault):
    proxy, store = faulty
    order = submitted("o-reset")
    proxy.arm(fault, method="POST", path="$batch")
    created = await store.create(order, *new_order(clock, order))
    assert proxy.faults == {fault: 1}
    assert isinstance(created, Order), "its own create, not a duplicate"
    assert created == await table_store.load("o-reset")


async def test_an_index_insert_applied_then_reset_is_settled_by_reading(
    table_store, faulty, tables, clock
):
    proxy, store = faulty
    order = submitted("o-index")
    proxy.arm("reset_after_apply", method="POST", path=tables.active)
    created = await store.create(order, *new_order(clock, order))
    assert proxy.faults == {"reset_after_apply": 1}
    assert isinstance(created, Order)
    assert ("o-index", 1) in await active_rows(table_store)


async def test_an_error_row_insert_applied_then_reset_is_settled_by_reading(
    table_store, faulty, tables, clock
):
    proxy, store = faulty
    order = await create(table_store, clock)
    after, entry = decide(order, declined(order, clock), clock)
    proxy.arm("reset_after_apply", method="POST", path=tables.orders)
    saved = await store.save(order, after, entry)
    assert proxy.faults == {"reset_after_apply": 1}
    assert saved.state is ProcessState.ERROR
    assert await error_rows(table_store) == {("o-1", 1)}


async def test_an_index_move_applied_then_reset_is_read_back(table_store, faulty, clock):
    proxy, store = faulty
    await create(table_store, clock)
    [row] = (await table_store.list_active()).rows
    later = clock() + timedelta(minutes=7)
    proxy.arm("reset_after_apply", method="PATCH")
    assert await store.index.postpone(row, later), "moved: the row says so"
    assert proxy.faults == {"reset_after_apply": 1}
    assert [r.due_at for r in (await table_store.list_active()).rows] == [later]


async def test_a_purge_applied_then_reset_is_settled_by_reading(table_store, faulty, clock):
    proxy, store = faulty
    await to_processed(table_store, clock)
    snapshot = await table_store.snapshot("o-1")
    assert snapshot is not None
    proxy.arm("reset_before_forward", method="POST", path="$batch")
    with pytest.raises(OutcomeUnknown):  # not applied, and the order unchanged: next run
        await store.purge(snapshot)
    proxy.arm("reset_after_apply", method="POST", path="$batch")
    assert await store.purge(snapshot) is DeleteOutcome.GONE, "deleted, as a read shows"
    assert proxy.faults == {"reset_before_forward": 1, "reset_after_apply": 1}
    assert await table_store.find("o-1") is None


async def test_a_write_whose_answer_was_lost_and_did_not_land_is_decided_again(
    table_store, faulty, clock
):
    """The proxy resets the connection before forwarding: nothing was applied, though the
    client cannot tell; the store reads, finds the order as it was, and says so."""
    proxy, store = faulty
    order = await create(table_store, clock)
    after, entry = decide(order, succeeded(order, clock), clock)
    proxy.arm("reset_before_forward", method="POST", path="$batch")
    with pytest.raises(Unconfirmed, match="the write's answer was lost"):
        await store.save(order, after, entry)
    assert await table_store.load(order.order_id) == order


async def test_a_create_whose_answer_was_lost_is_settled_by_reading(
    table_store, other, clock: Clock
) -> None:
    landed = submitted("o-landed")
    Flaky(table_store, commit=True, error=lost_answer("timeout"))
    created = await table_store.create(landed, *new_order(clock, landed))
    assert not isinstance(created, AlreadyExists)
    assert created.state is ProcessState.PROCESSING
    assert (await other.load("o-landed")).write_id == created.write_id

    lost = submitted("o-lost")
    Flaky(table_store, commit=False, error=lost_answer("500"))
    with pytest.raises(HttpResponseError):
        await table_store.create(lost, *new_order(clock, lost))  # the submission comes again
    assert await other.find("o-lost") is None
    assert isinstance(await table_store.create(lost, *new_order(clock, lost)), type(created))
