"""The order state store: what the Table store (on Azurite) and the in-memory store share, and
what only the Table store has to get right (one transaction per write, the WriteId rule, ids
refused before any request, requests per operation).

Orders are made and moved by the lifecycle (``core.lifecycle.submit`` / ``decide``), as the
shell does: the store is tested on the records the app really writes.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.data.tables import TableTransactionError

from core import lifecycle
from core import state_store as store_module
from core.active_index import INDEX_BUCKETS, index_partition
from core.ids import InvalidId
from core.memory import MemoryStore
from core.messages import MAX_TOTAL_CENTS, AgentRequest, AgentResponse, OrderSubmitted
from core.op_counts import OperationCounts
from core.order import Order, StepState, TimelineEntry
from core.state_models import (
    AlreadyExists,
    ConcurrencyConflict,
    CorruptOrderState,
    OrderNotFound,
)
from core.state_store import OrderStateStore
from core.states import ProcessState
from core.tablestorage import TableService
from core.workflows import get_workflow

pytestmark = pytest.mark.integration

T0 = datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)
GRACE = timedelta(minutes=10)
HOSTILE = "x' or PartitionKey ne '"

Store = MemoryStore | OrderStateStore


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

    def error_rows(self) -> set[tuple[str, int]]:
        if isinstance(self.store, MemoryStore):
            rows: Any = self.store.errors.rows()
        else:
            rows = self.store.errors.page(1000).rows
        return {(row.order_id, row.generation) for row in rows}

    def active_rows(self) -> set[tuple[str, int]]:
        return {(row.order_id, row.generation) for row in self.store.list_active(1000).rows}

    def events(self, order_id: str = "o-1") -> list[str]:
        return [entry.event for entry in self.store.get_timeline(order_id)]


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def counts() -> OperationCounts:
    """Table requests of the store under test, counted by its request hook (core.op_counts)."""
    return OperationCounts()


@pytest.fixture
def service(azurite, counts) -> Iterator[TableService]:
    client = TableService.from_connection_string(
        azurite.connection_string, request_hook=counts.request_hook("table")
    )
    yield client
    client.close()


@pytest.fixture
def table_store(service, unique_name, clock, counts) -> Iterator[OrderStateStore]:
    orders, active, supervision = (unique_name(n) for n in ("orders", "active", "supervision"))
    store = OrderStateStore(
        service,
        orders_table=orders,
        active_table=active,
        supervision_table=supervision,
        clock=clock,
    )
    store.ensure_tables()
    counts.reset()
    yield store
    for name in (orders, active, supervision):
        service.delete_table(name)


@pytest.fixture(params=["memory", "table"])
def backend(request, clock) -> Backend:
    if request.param == "memory":
        return Backend("memory", MemoryStore(clock), clock)
    return Backend("table", request.getfixturevalue("table_store"), clock)


# ------------------------------------------------------------------------------- helpers


def submitted(order_id: str = "o-1", **overrides: Any) -> OrderSubmitted:
    fields: dict[str, Any] = {
        "order_id": order_id,
        "customer_id": "c-1",
        "items": [{"sku": "SKU-1", "quantity": 3, "unit_price_cents": 500}],
        "currency": "EUR",
        "reply_to": "status-replies",
        "submitted_at": T0,
    }
    fields.update(overrides)
    return OrderSubmitted(**fields)


def context(clock: Clock, workflow: str = "order", actor: str = "scheduler-1") -> lifecycle.Context:
    return lifecycle.Context(workflow=get_workflow(workflow), now=clock(), actor=actor)


def new_order(clock: Clock, order: OrderSubmitted) -> tuple[Order, TimelineEntry]:
    decision = lifecycle.submit(order, context(clock, order.workflow))
    assert decision.order is not None and decision.entry is not None
    return decision.order, decision.entry


def create(
    store: Store, clock: Clock, order_id: str = "o-1", workflow: str = "order", **fields: Any
) -> Order:
    order = submitted(order_id, workflow=workflow, **fields)
    result = store.create(order, *new_order(clock, order))
    assert isinstance(result, Order)
    return result


def decide(
    order: Order, event: lifecycle.Event, clock: Clock, actor: str = "scheduler-1"
) -> tuple[Order, TimelineEntry]:
    decision = lifecycle.decide(order, event, context(clock, order.workflow, actor))
    assert decision.order is not None and decision.entry is not None, decision.note
    return decision.order, decision.entry


def move(
    store: Store, order: Order, event: lifecycle.Event, clock: Clock, actor: str = "scheduler-1"
) -> Order:
    """Decide on ``event`` and save the decision, as the shell does."""
    return store.save(order, *decide(order, event, clock, actor))


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
    return lifecycle.Replied(response)


def succeeded(order: Order, clock: Clock, result: dict | None = None):
    return replied(order, clock, result=result or {"ref": f"{order.current_step}-{order.attempt}"})


def declined(order: Order, clock: Clock):
    return replied(order, clock, "failed", error_code="out_of_stock", error_message="none left")


def transient(order: Order, clock: Clock):
    return replied(order, clock, "failed", transient=True, error_code="timeout")


RESUBMIT = lifecycle.Resubmit(actor="operator-ann", reason="stock arrived", outbox_delivered=True)


def to_error(store: Store, clock: Clock, order_id: str = "o-1") -> Order:
    """An order whose first step was declined: Error, nothing to undo."""
    current = create(store, clock, order_id)
    errored = move(store, current, declined(current, clock), clock)
    assert errored.state is ProcessState.ERROR
    return errored


def to_processed(store: Store, clock: Clock, order_id: str = "o-1") -> Order:
    current = create(store, clock, order_id, workflow="single_step")
    done = move(store, current, succeeded(current, clock), clock)
    assert done.state is ProcessState.PROCESSED
    return done


def bare(order: Order) -> Order:
    """``order`` without what the store adds (ETag, WriteId)."""
    return dataclasses.replace(order, etag="", write_id="")


# ============================================================ shared by both implementations

# ---------------------------------------------------------------------------------- create


def test_create_then_load_equals_the_order(backend):
    store, clock = backend.store, backend.clock
    order = submitted()
    decided, entry = new_order(clock, order)
    result = store.create(order, decided, entry)
    assert isinstance(result, Order)
    assert result.etag
    assert bare(result) == decided
    assert store.load("o-1") == result
    assert store.find("o-1") == result
    assert store.get_timeline("o-1") == [entry]
    record = store.get_order("o-1")
    assert record.details == order
    assert record.payload_hash == order.content_hash()
    assert record.process == result
    assert backend.active_rows() == {("o-1", 1)}
    assert backend.error_rows() == set()


def test_creating_the_same_id_again(backend):
    store, clock = backend.store, backend.clock
    first = create(store, clock)
    # A redelivery: the same order, submitted again with a fresh timestamp.
    again = submitted(submitted_at=T0 + timedelta(minutes=1))
    result = store.create(again, *new_order(clock, again))
    assert result == AlreadyExists(True, first_hash := submitted().content_hash(), first)
    # Another order under a taken id.
    other = submitted(items=[{"sku": "SKU-9", "quantity": 1, "unit_price_cents": 1}])
    result = store.create(other, *new_order(clock, other))
    assert isinstance(result, AlreadyExists)
    assert (result.same_payload, result.existing_payload_hash) == (False, first_hash)
    assert result.order == first
    assert store.load("o-1") == first
    assert store.get_order("o-1").details == submitted()
    assert backend.events() == ["created"]
    assert backend.active_rows() == {("o-1", 1)}


def test_a_duplicate_of_a_finished_order_leaves_no_active_row(backend):
    store, clock = backend.store, backend.clock
    done = to_processed(store, clock)
    store.index.discard("o-1", 1)  # the shell, once the final outbox was sent
    order = submitted(workflow="single_step")
    result = store.create(order, *new_order(clock, order))
    assert result == AlreadyExists(True, order.content_hash(), done)
    assert backend.active_rows() == set()


def test_a_duplicate_of_a_finished_order_keeps_the_row_of_an_outbox_still_owed(backend):
    # The write into Error committed but its alert was not sent yet (the send failed, or the
    # writer crashed): the active-index row is what tells the Supervisor to send it. A duplicate
    # submission arriving meanwhile must not remove that row - the intake sends nothing for a
    # finished order (lifecycle.Resent flushes only orders in flight).
    store, clock = backend.store, backend.clock
    errored = to_error(store, clock)
    assert any(o.to == "alerts" for o in errored.outbox)
    order = submitted()
    result = store.create(order, *new_order(clock, order))
    assert isinstance(result, AlreadyExists) and result.order == errored
    assert lifecycle.decide(errored, lifecycle.Resent(), context(clock)).send == ()
    assert backend.active_rows() == {("o-1", 1)}


# ------------------------------------------------------------------------------------ reads


def test_missing_order(backend):
    store = backend.store
    with pytest.raises(OrderNotFound, match="order nope does not exist"):
        store.load("nope")
    with pytest.raises(OrderNotFound):
        store.get_order("nope")
    assert store.find("nope") is None
    assert store.get_timeline("nope") == []


def test_orders_do_not_see_each_other(backend):
    store, clock = backend.store, backend.clock
    for order_id in ("o-1", "o-10", "o-2"):
        create(store, clock, order_id)
    o10 = store.load("o-10")
    move(store, o10, succeeded(o10, clock), clock)
    assert store.load("o-1").current_step == "reserve_inventory"
    assert store.load("o-10").current_step == "charge_payment"
    assert backend.events("o-1") == ["created"]
    assert backend.events("o-10") == ["created", "step_succeeded"]
    assert backend.active_rows() == {("o-1", 1), ("o-10", 1), ("o-2", 1)}


# ----------------------------------------------------------------------------------- writes


def test_save_with_the_current_etag_succeeds_and_appends_the_timeline_entry(backend):
    store, clock = backend.store, backend.clock
    current = create(store, clock)
    clock.advance(timedelta(seconds=2))
    after, entry = decide(current, succeeded(current, clock), clock)
    saved = store.save(current, after, entry)
    assert saved.etag and saved.etag != current.etag
    assert bare(saved) == bare(after)
    assert store.load("o-1") == saved
    assert store.get_timeline("o-1")[-1] == entry
    assert backend.events() == ["created", "step_succeeded"]
    assert (saved.state, saved.current_step) == (ProcessState.PROCESSING, "charge_payment")
    assert saved.step("reserve_inventory").result == {"ref": "reserve_inventory-1"}
    # The returned order is the one to write next with.
    again = move(store, saved, succeeded(saved, clock), clock)
    assert store.load("o-1") == again
    assert backend.events() == ["created", "step_succeeded", "step_succeeded"]


def test_save_with_a_stale_etag_raises_and_writes_nothing(backend):
    store, clock = backend.store, backend.clock
    current = create(store, clock)
    winner = move(store, current, succeeded(current, clock), clock)
    timeline = store.get_timeline("o-1")
    cancel = lifecycle.Cancel(actor="operator-ann", reason="customer called")
    with pytest.raises(ConcurrencyConflict, match="changed by someone else"):
        move(store, current, cancel, clock, actor="operator-ann")
    assert store.load("o-1") == winner
    assert store.get_timeline("o-1") == timeline
    assert backend.error_rows() == set()


def test_concurrent_writers_from_the_same_read_exactly_one_wins(backend):
    store, clock = backend.store, backend.clock
    current = create(store, clock)
    contenders = 6
    barrier = threading.Barrier(contenders)
    outcomes: dict[str, str] = {}
    lock = threading.Lock()

    def contend(n: int) -> None:
        actor = f"operator-{n}"
        after, entry = decide(current, lifecycle.Cancel(actor, "race"), clock, actor)
        barrier.wait()
        try:
            store.save(current, after, entry)
            outcome = "won"
        except ConcurrencyConflict:
            outcome = "lost"
        with lock:
            outcomes[actor] = outcome

    threads = [threading.Thread(target=contend, args=(n,)) for n in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    winners = [actor for actor, outcome in outcomes.items() if outcome == "won"]
    assert len(outcomes) == contenders and len(winners) == 1
    timeline = store.get_timeline("o-1")
    assert [e.event for e in timeline] == ["created", "compensation_started"]
    assert timeline[-1].actor == winners[0]
    stored = store.load("o-1")
    assert (stored.state, stored.locked_by) == (ProcessState.COMPENSATING, winners[0])


def test_a_full_run_to_processed(backend):
    store, clock = backend.store, backend.clock
    current = create(store, clock)
    for _ in range(3):
        clock.advance(timedelta(seconds=1))
        current = move(store, current, succeeded(current, clock), clock)
    assert store.load("o-1") == current
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
    timeline = store.get_timeline("o-1")
    assert [(e.seq, e.event, e.from_state, e.to_state) for e in timeline] == [
        (0, "created", None, ProcessState.PROCESSING),
        (1, "step_succeeded", ProcessState.PROCESSING, ProcessState.PROCESSING),
        (2, "step_succeeded", ProcessState.PROCESSING, ProcessState.PROCESSING),
        (3, "processed", ProcessState.PROCESSING, ProcessState.PROCESSED),
    ]
    assert current.timeline_seq == 3
    assert [e.seq for e in store.get_timeline("o-1", after_seq=1, limit=1)] == [2]
    assert [e.seq for e in store.get_timeline("o-1", after_seq=3)] == []
    # The final outbox is still owed: the row goes when the shell has sent it.
    assert backend.active_rows() == {("o-1", 1)}
    assert backend.error_rows() == set()


def test_save_of_a_missing_order_raises_not_found(backend):
    store, clock = backend.store, backend.clock
    current = create(store, clock)
    after, entry = decide(current, declined(current, clock), clock)
    assert after.state is ProcessState.ERROR
    ghost = dataclasses.replace(current, order_id="o-ghost")
    with pytest.raises(OrderNotFound):
        store.save(ghost, dataclasses.replace(after, order_id="o-ghost"), entry)
    assert store.find("o-ghost") is None
    assert backend.error_rows() == set()  # the row written ahead of the write is gone again


def test_annotate_records_without_changing_the_order(backend):
    store, clock = backend.store, backend.clock
    errored = to_error(store, clock)
    clock.advance(timedelta(minutes=1))
    noted = store.annotate(errored, actor="operator-ann", event="acknowledged", detail="on it")
    assert noted.etag != errored.etag
    assert store.load("o-1") == noted
    unchanged = dataclasses.replace(
        noted, updated_at=errored.updated_at, timeline_seq=errored.timeline_seq
    )
    assert bare(unchanged) == bare(errored)
    last = store.get_timeline("o-1")[-1]
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
    assert backend.error_rows() == {("o-1", 1)}
    with pytest.raises(ConcurrencyConflict):
        store.annotate(errored, actor="operator-bob", event="acknowledged")


# ---------------------------------------------------------------------- Error and resubmit


def test_entering_error_puts_an_error_row_and_a_resubmit_removes_it(backend):
    store, clock = backend.store, backend.clock
    errored = to_error(store, clock)
    assert errored.last_error and "out_of_stock" in errored.last_error
    assert backend.error_rows() == {("o-1", 1)}
    store.index.discard("o-1", 1)  # the shell, once the alert was sent
    assert backend.active_rows() == set()

    clock.advance(timedelta(hours=1))
    resubmitted = move(store, errored, RESUBMIT, clock, actor="operator-ann")
    assert resubmitted.generation == 2 and resubmitted.state.in_flight
    assert resubmitted.failure_count == 0 and resubmitted.last_error is None
    assert resubmitted.step("reserve_inventory").generation == 2
    assert store.load("o-1") == resubmitted
    assert backend.error_rows() == set()
    assert backend.active_rows() == {("o-1", 2)}
    assert backend.events() == ["created", "error", "resubmitted"]
    # The resubmitted generation can enter Error again: a row of its own.
    again = move(store, resubmitted, declined(resubmitted, clock), clock)
    assert again.state is ProcessState.ERROR
    assert backend.error_rows() == {("o-1", 2)}


def test_a_write_into_error_that_loses_its_race_removes_its_error_row(backend):
    store, clock = backend.store, backend.clock
    current = create(store, clock)
    winner = move(store, current, succeeded(current, clock), clock)
    with pytest.raises(ConcurrencyConflict):
        move(store, current, declined(current, clock), clock)
    assert backend.error_rows() == set()
    assert store.load("o-1") == winner


def test_a_resubmit_that_loses_its_race_leaves_only_garbage_the_reaper_removes(backend):
    store, clock = backend.store, backend.clock
    errored = to_error(store, clock)
    store.index.discard("o-1", 1)
    noted = store.annotate(errored, actor="operator-bob", event="acknowledged")
    with pytest.raises(ConcurrencyConflict):
        move(store, errored, RESUBMIT, clock, actor="operator-ann")
    assert store.load("o-1") == noted
    assert backend.error_rows() == {("o-1", 1)}
    # The index row was written ahead of the write that lost: garbage, reaped after the grace.
    [row] = store.list_active().rows
    assert (row.order_id, row.generation) == ("o-1", 2)
    assert store.reap_active(row, store.find("o-1"), grace=GRACE) is False
    clock.advance(GRACE + timedelta(seconds=1))
    assert store.reap_active(row, store.find("o-1"), grace=GRACE) is True
    assert backend.active_rows() == set()


# ------------------------------------------------------------------------------------ index


def test_index_has_put_discard(backend):
    index, clock = backend.store.index, backend.clock
    assert not index.has("o-9", 1)
    index.put("o-9", 1, "order")
    assert index.has("o-9", 1)
    assert not index.has("o-9", 2) and not index.has("o-90", 1)
    [row] = backend.store.list_active().rows
    assert (row.order_id, row.generation, row.workflow, row.written_at) == (
        "o-9",
        1,
        "order",
        clock(),
    )
    assert row.row_key == "o-9.1" and row.etag
    index.put("o-9", 2, "order")
    index.discard("o-9", 1)
    assert not index.has("o-9", 1) and index.has("o-9", 2)
    index.discard("o-9", 1)  # already gone: nothing to do
    assert backend.active_rows() == {("o-9", 2)}


def test_list_active_pages_with_continuation(backend):
    store = backend.store
    expected = {f"o-{n}" for n in range(25)}
    for order_id in expected:
        store.index.put(order_id, 1, "order")  # index rows alone are enough here
    seen: list[str] = []
    continuation = None
    pages = 0
    while True:
        page = store.list_active(7, continuation=continuation)
        assert len(page.rows) <= 7
        seen.extend(row.order_id for row in page.rows)
        pages += 1
        continuation = page.continuation
        if continuation is None:
            break
        assert pages < 30, "paging does not end"
    assert sorted(seen) == sorted(expected)
    assert pages >= 4
    assert store.list_active(1000).continuation is None


def test_list_active_of_an_empty_index(backend):
    page = backend.store.list_active(10)
    assert page.rows == () and page.continuation is None


def test_reap_active_deletes_only_old_garbage(backend):
    store, clock = backend.store, backend.clock
    live = create(store, clock, "o-live")
    to_processed(store, clock, "o-done")  # its row: as if the shell had not deleted it yet
    errored = to_error(store, clock, "o-old")
    move(store, errored, RESUBMIT, clock, actor="operator-ann")  # row 1 left over, row 2 live
    store.index.put("o-missing", 1, "order")  # as if create crashed after the index row
    rows = {(row.order_id, row.generation): row for row in store.list_active().rows}
    assert set(rows) == {
        ("o-live", 1),
        ("o-done", 1),
        ("o-old", 1),
        ("o-old", 2),
        ("o-missing", 1),
    }

    def reap() -> set[tuple[str, int]]:
        return {
            key
            for key, row in rows.items()
            if store.reap_active(row, store.find(row.order_id), grace=GRACE)
        }

    assert reap() == set()  # everything is younger than the grace period
    clock.advance(GRACE + timedelta(seconds=1))
    # A finished order's row of its current generation stays: it may still owe its final
    # messages (the shell or the Supervisor's flush removes it after sending them).
    assert reap() == {("o-old", 1), ("o-missing", 1)}
    assert backend.active_rows() == {("o-live", 1), ("o-done", 1), ("o-old", 2)}
    assert store.load("o-live") == live


def test_reap_keeps_a_row_rewritten_since_it_was_listed(backend):
    store, clock = backend.store, backend.clock
    store.index.put("o-gone", 1, "order")  # as if a create crashed after the index row
    [row] = store.list_active().rows
    clock.advance(timedelta(hours=1))
    store.index.put("o-gone", 1, "order")  # e.g. a submission re-wrote it meanwhile
    assert store.reap_active(row, None, grace=GRACE) is False
    assert backend.active_rows() == {("o-gone", 1)}
    [fresh] = store.list_active().rows
    clock.advance(timedelta(hours=1))
    assert store.reap_active(fresh, None, grace=GRACE) is True
    assert backend.active_rows() == set()


def test_a_finished_orders_own_row_is_never_reaped(backend):
    store, clock = backend.store, backend.clock
    errored = to_error(store, clock)
    [row] = store.list_active().rows
    clock.advance(timedelta(days=1))
    assert store.reap_active(row, errored, grace=GRACE) is False
    assert backend.active_rows() == {("o-1", 1)}


def test_reaping_a_row_already_gone_reports_it_gone(backend):
    # Two Supervisors reap the same listed row: the SDK does not tell which one deleted it.
    store, clock = backend.store, backend.clock
    store.index.put("o-gone", 1, "order")
    [row] = store.list_active().rows
    clock.advance(GRACE + timedelta(seconds=1))
    assert store.reap_active(row, None, grace=GRACE) is True
    assert store.reap_active(row, None, grace=GRACE) is True
    assert backend.active_rows() == set()


def test_due_rows_are_those_due_by_now_in_that_bucket(backend):
    store = backend.store
    ids = [f"o-{n}" for n in range(40)]
    for n, order_id in enumerate(ids):
        store.index.put(order_id, 1, "order", T0 + timedelta(seconds=n))
    now = T0 + timedelta(seconds=19.5)
    found = {
        row.order_id: row
        for bucket in range(INDEX_BUCKETS)
        for row in store.index.due(bucket, now, 1000)
    }
    assert set(found) == set(ids[:20])
    assert all(row.partition_key == index_partition(row.order_id) for row in found.values())
    bucket = int(index_partition("o-0")[1:])
    in_bucket = store.index.due(bucket, now, 1000)
    assert [r.due_at for r in in_bucket] == sorted(r.due_at for r in in_bucket)
    assert len(store.index.due(bucket, now, 1)) == 1


def test_a_row_without_a_due_time_is_due_at_once(backend):
    store, clock = backend.store, backend.clock
    store.index.put("o-1", 1, "order")
    bucket = int(index_partition("o-1")[1:])
    assert [r.order_id for r in store.index.due(bucket, clock(), 10)] == ["o-1"]


def test_postpone_moves_a_row_up_unless_it_changed_since_read(backend):
    store = backend.store
    bucket = int(index_partition("o-1")[1:])
    store.index.put("o-1", 1, "order", T0)
    [row] = store.index.due(bucket, T0, 10)
    assert store.index.postpone(row, T0 + timedelta(minutes=5)) is True
    assert store.index.due(bucket, T0 + timedelta(minutes=4), 10) == ()
    # An earlier due time written after the row was read must win over the Supervisor's move.
    [row] = store.index.due(bucket, T0 + timedelta(minutes=5), 10)
    store.index.put("o-1", 1, "order", T0 + timedelta(minutes=1))
    assert store.index.postpone(row, T0 + timedelta(hours=1)) is False
    [kept] = store.index.due(bucket, T0 + timedelta(minutes=1), 10)
    assert kept.due_at == T0 + timedelta(minutes=1)


# ======================================================================= Table store only


def raw_rows(store: OrderStateStore, service: TableService, pk: str) -> dict[str, Any]:
    table = service.get_table_client(store.orders_table)
    rows = table.query_entities("PartitionKey eq @pk", parameters={"pk": pk})
    return {row["RowKey"]: row for row in rows}


def during(counts: OperationCounts, action: Callable[[], Any]) -> tuple[dict[str, int], Any]:
    counts.reset()
    result = action()
    return counts.snapshot(), result


def transaction_error(status: int, code: str) -> TableTransactionError:
    error = TableTransactionError(message=f"0:{code}")
    error.status_code = status
    error.error_code = code  # type: ignore[assignment]
    return error


def test_create_writes_its_rows_in_one_transaction(table_store, service, clock, counts):
    order = submitted()
    decided, entry = new_order(clock, order)
    cost, result = during(counts, lambda: table_store.create(order, decided, entry))
    assert isinstance(result, Order)
    assert cost == {"table.post": 2}  # the index row (an insert), then the batch
    rows = raw_rows(table_store, service, "o-1")
    assert list(rows) == ["details", "process", "timeline-00000000"]
    assert rows["process"]["WriteId"] == result.write_id != ""
    assert rows["process"].metadata["etag"] == result.etag


def test_requests_per_operation(table_store, clock, counts):
    current = create(table_store, clock)
    assert during(counts, lambda: table_store.load("o-1"))[0] == {"table.get": 1}
    assert during(counts, lambda: table_store.find("o-1"))[0] == {"table.get": 1}
    assert during(counts, lambda: table_store.get_order("o-1"))[0] == {"table.get": 2}
    assert during(counts, lambda: table_store.get_timeline("o-1"))[0] == {"table.get": 1}
    after, entry = decide(current, succeeded(current, clock), clock)
    assert during(counts, lambda: table_store.save(current, after, entry))[0] == {"table.post": 1}
    # Into Error: the Error-index row first, then the batch.
    current = create(table_store, clock, "o-2")
    after, entry = decide(current, declined(current, clock), clock)
    cost, errored = during(counts, lambda: table_store.save(current, after, entry))
    assert errored.state is ProcessState.ERROR
    assert cost == {"table.post": 2}  # an insert: a row already there is another writer's
    # Out of Error: the new active-index row first, the batch, then the Error row deleted.
    after, entry = decide(errored, RESUBMIT, clock, "operator-ann")
    cost, resubmitted = during(counts, lambda: table_store.save(errored, after, entry))
    assert cost == {"table.put": 1, "table.post": 1, "table.delete": 1}
    note = during(counts, lambda: table_store.annotate(resubmitted, actor="op", event="noted"))
    assert note[0] == {"table.post": 1}


def test_a_writer_that_loses_the_race_into_error_keeps_the_winners_error_row(backend):
    """Two writers decide, on the same state, that the order enters Error; the second one's
    write loses on its ETag. The Error row the winner wrote stays: the loser only deletes a row
    it inserted itself."""
    store, clock = backend.store, backend.clock
    current = create(store, clock)
    after, entry = decide(current, declined(current, clock), clock)
    store.save(current, after, entry)
    late, late_entry = decide(current, declined(current, clock), clock, "scheduler-2")
    with pytest.raises(ConcurrencyConflict):
        store.save(current, late, late_entry)
    assert backend.error_rows() == {("o-1", 1)}
    assert store.load("o-1").state is ProcessState.ERROR


def test_the_error_index_is_a_partition_of_the_orders_table(table_store, service, clock):
    to_error(table_store, clock)
    [row] = raw_rows(table_store, service, "~error").values()
    assert (row["RowKey"], row["OrderID"], row["Generation"]) == ("o-1.1", "o-1", 1)
    assert row["WrittenAt"] == clock()
    assert table_store.get_timeline("o-1")[-1].event == "error"


def test_an_sdk_retry_of_a_committed_save_is_not_a_conflict(table_store, clock, monkeypatch):
    # The first try of the batch committed but its response was lost; the SDK's resend then
    # fails with 412 because of our own write. The store recognises its WriteId.
    current = create(table_store, clock)
    table = table_store._orders
    real_submit = table.submit_transaction

    def commit_then_412(operations, **kwargs):
        real_submit(list(operations), **kwargs)
        raise transaction_error(412, "UpdateConditionNotSatisfied")

    monkeypatch.setattr(table, "submit_transaction", commit_then_412)
    after, entry = decide(current, declined(current, clock), clock)
    saved = table_store.save(current, after, entry)
    assert saved == table_store.load("o-1")
    assert bare(saved) == bare(after)
    assert [e.event for e in table_store.get_timeline("o-1")] == ["created", "error"]
    assert table_store.errors.page(10).rows[0].order_id == "o-1"  # kept: the write is ours


def test_an_sdk_resend_of_a_committed_save_is_not_a_conflict(table_store, clock, monkeypatch):
    # The same, with the service's own answer to the resent batch.
    current = create(table_store, clock)
    table = table_store._orders
    real_submit = table.submit_transaction

    def commit_then_resend(operations, **kwargs):
        operations = list(operations)
        real_submit(operations, **kwargs)
        return real_submit(operations, **kwargs)

    monkeypatch.setattr(table, "submit_transaction", commit_then_resend)
    saved = move(table_store, current, succeeded(current, clock), clock)
    assert saved == table_store.load("o-1")
    assert [e.event for e in table_store.get_timeline("o-1")] == ["created", "step_succeeded"]


def test_an_sdk_resend_of_a_committed_create_is_a_duplicate_of_the_same_payload(
    table_store, clock, monkeypatch
):
    table = table_store._orders
    real_submit = table.submit_transaction

    def commit_then_resend(operations, **kwargs):
        operations = list(operations)
        real_submit(operations, **kwargs)
        return real_submit(operations, **kwargs)

    monkeypatch.setattr(table, "submit_transaction", commit_then_resend)
    order = submitted()
    decided, entry = new_order(clock, order)
    result = table_store.create(order, decided, entry)
    assert isinstance(result, AlreadyExists) and result.same_payload
    assert result.order == table_store.load("o-1")
    assert bare(result.order) == decided
    assert [row for row in table_store.list_active().rows if row.order_id == "o-1"]


@pytest.mark.parametrize(
    ("status", "code"),
    [(400, "PropertyValueTooLarge"), (409, "TableBeingDeleted"), (500, "InternalError")],
)
def test_other_transaction_errors_propagate(table_store, clock, monkeypatch, status, code):
    current = create(table_store, clock)
    table = table_store._orders

    def fail(operations, **kwargs):
        raise transaction_error(status, code)

    monkeypatch.setattr(table, "submit_transaction", fail)
    with pytest.raises(TableTransactionError) as caught:
        move(table_store, current, succeeded(current, clock), clock)
    assert caught.value.status_code == status
    order = submitted("o-2")
    with pytest.raises(TableTransactionError):
        table_store.create(order, *new_order(clock, order))
    monkeypatch.undo()
    assert table_store.load("o-1") == current
    assert table_store.find("o-2") is None


def test_a_conflict_with_another_writer_is_not_taken_for_our_retry(table_store, clock, monkeypatch):
    current = create(table_store, clock)
    table = table_store._orders
    real_submit = table.submit_transaction

    def someone_else_first(operations, **kwargs):
        # Another instance writes between our read and our batch.
        monkeypatch.setattr(table, "submit_transaction", real_submit)
        table_store.annotate(table_store.load("o-1"), actor="operator-bob", event="acknowledged")
        return real_submit(list(operations), **kwargs)

    monkeypatch.setattr(table, "submit_transaction", someone_else_first)
    with pytest.raises(ConcurrencyConflict, match="now Processing at 1"):
        move(table_store, current, succeeded(current, clock), clock)
    assert [e.event for e in table_store.get_timeline("o-1")] == ["created", "acknowledged"]


@pytest.mark.parametrize("hostile", [HOSTILE, "../x", "a/b", "", "é", "a" * 65, "~error"])
def test_hostile_ids_are_refused_before_any_request(table_store, clock, counts, hostile):
    current = create(table_store, clock)
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
            call(hostile)
    with pytest.raises(InvalidId):
        table_store.create(order, dataclasses.replace(decided, order_id=hostile), first)
    with pytest.raises(InvalidId):
        table_store.save(dataclasses.replace(current, order_id=hostile), after, entry)
    with pytest.raises(InvalidId):
        table_store.annotate(dataclasses.replace(current, order_id=hostile), actor="a", event="e")
    assert counts.snapshot() == {}


def test_a_save_cannot_move_an_order_to_another_id(table_store, clock, counts):
    current = create(table_store, clock)
    after, entry = decide(current, succeeded(current, clock), clock)
    counts.reset()
    with pytest.raises(ValueError):
        table_store.save(current, dataclasses.replace(after, order_id="o-2"), entry)
    assert counts.snapshot() == {}  # refused before any request
    assert table_store.load("o-1") == current
    assert table_store.find("o-2") is None


def test_null_fields_are_removed_by_the_replace(table_store, service, clock):
    current = create(table_store, clock)
    assert "LockedBy" in raw_rows(table_store, service, "o-1")["process"]
    released = move(table_store, current, transient(current, clock), clock)
    assert released.state is ProcessState.PENDING and released.locked_by is None
    row = raw_rows(table_store, service, "o-1")["process"]
    assert "LockedBy" not in row and "CompleteBy" not in row
    assert row["NextAttemptAt"] == released.next_attempt_at
    assert table_store.load("o-1") == released


def test_large_payloads_and_results_are_split_and_read_back(table_store, service, clock):
    order = submitted()
    decided, entry = new_order(clock, order)
    payload = {"blob": "é😀" * 12_000}  # 72 KiB of UTF-16
    created = table_store.create(order, dataclasses.replace(decided, payload=payload), entry)
    assert isinstance(created, Order)
    result = {"blob": "ü" * 40_000, "n": list(range(1000))}  # 80 KiB of UTF-16
    saved = move(table_store, created, succeeded(created, clock, result), clock)
    row = raw_rows(table_store, service, "o-1")["process"]
    assert row["AgentPayloadParts"] > 1 and row["StepsParts"] > 1
    loaded = table_store.load("o-1")
    assert loaded == saved
    assert loaded.payload == payload and loaded.step("reserve_inventory").result == result


def test_the_largest_order_fits(table_store, clock):
    items = [
        {"sku": f"{i:03d}-" + "s" * 60, "quantity": 1_000_000, "unit_price_cents": 10**7}
        for i in range(100)
    ]
    big = submitted(items=items, customer_id="c" * 64)
    created = table_store.create(big, *new_order(clock, big))
    assert isinstance(created, Order)
    record = table_store.get_order("o-1")
    assert record.details == big
    assert record.details.total_cents == MAX_TOTAL_CENTS
    assert record.process == created


def test_datetimes_round_trip_exactly(table_store, clock):
    clock.now = datetime(2031, 12, 31, 23, 59, 29, 999999, tzinfo=UTC)
    created = create(table_store, clock)
    loaded = table_store.load("o-1")
    assert loaded.created_at == clock() and loaded.complete_by == created.complete_by
    for stamp in (loaded.created_at, loaded.updated_at, loaded.complete_by):
        assert type(stamp) is datetime and stamp.tzinfo is UTC


def test_create_is_atomic_when_a_row_conflicts(table_store, service, clock):
    # A stray row at the end of the batch: the service rejects the whole transaction.
    table = service.get_table_client(table_store.orders_table)
    table.create_entity({"PartitionKey": "o-1", "RowKey": "timeline-00000000", "Stray": True})
    order = submitted()
    with pytest.raises(CorruptOrderState, match="no details row"):
        table_store.create(order, *new_order(clock, order))
    assert list(raw_rows(table_store, service, "o-1")) == ["timeline-00000000"]


def test_create_is_atomic_when_a_property_is_too_large(table_store, service, clock, monkeypatch):
    real = store_module.order_entity

    def oversized(order: Order) -> dict:
        return {**real(order), "Junk": "x" * 40_000}  # > 64 KiB as UTF-16

    monkeypatch.setattr(store_module, "order_entity", oversized)
    order = submitted()
    with pytest.raises(TableTransactionError) as caught:
        table_store.create(order, *new_order(clock, order))
    assert caught.value.status_code == 400
    assert raw_rows(table_store, service, "o-1") == {}
    with pytest.raises(OrderNotFound):
        table_store.load("o-1")


def test_an_unreadable_process_row_is_corrupt(table_store, service, clock):
    create(table_store, clock)
    table = service.get_table_client(table_store.orders_table)
    table.update_entity({"PartitionKey": "o-1", "RowKey": "process", "ProcessState": "Bogus"})
    with pytest.raises(CorruptOrderState, match="process row of o-1"):
        table_store.load("o-1")
    with pytest.raises(CorruptOrderState, match="process row of o-1"):
        table_store.get_order("o-1")


def test_an_order_without_its_details_row_is_corrupt(table_store, service, clock):
    create(table_store, clock)
    service.get_table_client(table_store.orders_table).delete_entity("o-1", "details")
    with pytest.raises(CorruptOrderState, match="details"):
        table_store.get_order("o-1")
    order = submitted()
    with pytest.raises(CorruptOrderState, match="no details row"):
        table_store.create(order, *new_order(clock, order))
