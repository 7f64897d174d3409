"""The Table state store against real Azurite: atomic create, ETag races, timeline, index."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.data.tables import TableServiceClient, TableTransactionError

from core import state_store as store_module
from core.ids import InvalidId
from core.messages import MAX_TOTAL_CENTS, AgentResponse, OrderSubmitted
from core.state_store import (
    AlreadyExists,
    ConcurrencyConflict,
    CorruptOrderState,
    Created,
    OrderNotFound,
    OrderStateStore,
    ProcessRecord,
    StaleResult,
    index_partition,
)
from core.states import ProcessState, StepState
from core.workflows import ORDER_WORKFLOW, SINGLE_STEP_WORKFLOW

pytestmark = pytest.mark.integration

T0 = datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


class Requests:
    """Every HTTP request the SDK sends (including transport retries), in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, request: Any) -> None:
        http = request.http_request
        self.seen.append((http.method, http.url))

    def count_during(self, action: Callable[[], Any]) -> tuple[int, Any]:
        before = len(self.seen)
        result = action()
        return len(self.seen) - before, result


@pytest.fixture
def requests() -> Requests:
    return Requests()


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def service(azurite, requests) -> Iterator[TableServiceClient]:
    client = TableServiceClient.from_connection_string(
        azurite.connection_string, raw_request_hook=requests
    )
    yield client
    client.close()


@pytest.fixture
def store(service, unique_name, clock) -> Iterator[OrderStateStore]:
    orders, active = unique_name("orders"), unique_name("active")
    state = OrderStateStore(service, orders_table=orders, active_table=active, clock=clock)
    state.ensure_tables()
    yield state
    for name in (orders, active):
        service.delete_table(name)


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


def reply(process: ProcessRecord, **overrides: Any) -> AgentResponse:
    fields: dict[str, Any] = {
        "order_id": process.order_id,
        "step": process.current_step,
        "operation": process.current_operation,
        "attempt": process.attempt,
        "outcome": "succeeded",
        "result": {"ref": f"{process.current_step}-{process.attempt}"},
    }
    fields.update(overrides)
    return AgentResponse(**fields)


def partition(store: OrderStateStore, service: TableServiceClient, order_id: str) -> list[str]:
    table = service.get_table_client(store.orders_table)
    rows = table.query_entities("PartitionKey eq @pk", parameters={"pk": order_id})
    return sorted(row["RowKey"] for row in rows)


def index_rows(store: OrderStateStore) -> list[tuple[str, int]]:
    page = store.list_active(1000)
    return sorted((row.order_id, row.generation) for row in page.rows)


def create(store: OrderStateStore, order_id: str = "o-1", workflow=ORDER_WORKFLOW) -> ProcessRecord:
    result = store.create_order(submitted(order_id), workflow)
    assert isinstance(result, Created)
    return result.process


def claim(store: OrderStateStore, current: ProcessRecord, who: str = "sched-1") -> ProcessRecord:
    return store.claim(current, instance_id=who, complete_by=T0 + timedelta(seconds=30))


# --------------------------------------------------------------------------------- create


def test_create_writes_all_rows_in_one_transaction(store, service, requests):
    count, result = requests.count_during(lambda: store.create_order(submitted(), ORDER_WORKFLOW))
    assert isinstance(result, Created)
    assert count == 2  # index upsert + one batch
    assert partition(store, service, "o-1") == [
        "details",
        "process",
        "step-00-reserve_inventory",
        "step-01-charge_payment",
        "step-02-create_shipment",
        "timeline-00000000",
    ]
    record = store.get_order("o-1")
    assert record.details == submitted()
    assert record.payload_hash == submitted().content_hash()
    assert record.process == result.process
    process = record.process
    assert (process.state, process.locked_by, process.failure_count, process.attempt) == (
        ProcessState.PENDING,
        None,
        0,
        0,
    )
    assert process.current_step == "reserve_inventory"
    assert process.reply_to == "status-replies"
    assert process.created_at == T0 and process.next_attempt_at == T0
    assert [(s.name, s.state, s.attempt) for s in record.steps] == [
        ("reserve_inventory", StepState.PENDING, 0),
        ("charge_payment", StepState.PENDING, 0),
        ("create_shipment", StepState.PENDING, 0),
    ]
    [created] = store.get_timeline("o-1")
    assert (created.seq, created.event, created.from_state, created.to_state) == (
        0,
        "created",
        None,
        ProcessState.PENDING,
    )
    assert index_rows(store) == [("o-1", 1)]


def test_redelivered_submission_is_recognised(store, service):
    first = create(store)
    again = store.create_order(submitted(submitted_at=T0 + timedelta(minutes=1)), ORDER_WORKFLOW)
    assert isinstance(again, AlreadyExists)
    assert again.same_payload is True
    assert again.process == first
    assert index_rows(store) == [("o-1", 1)]


def test_conflicting_payload_is_reported_and_changes_nothing(store, service):
    create(store)
    before = store.get_order("o-1")
    other = submitted(items=[{"sku": "SKU-9", "quantity": 1, "unit_price_cents": 1}])
    result = store.create_order(other, ORDER_WORKFLOW)
    assert isinstance(result, AlreadyExists)
    assert result.same_payload is False
    assert result.existing_payload_hash == submitted().content_hash()
    assert store.get_order("o-1") == before


def test_duplicate_of_a_finished_order_leaves_no_index_row(store):
    current = claim(store, create(store, workflow=SINGLE_STEP_WORKFLOW))
    store.mark_processed(current, actor="sched-1", response=reply(current))
    assert index_rows(store) == []
    store.create_order(submitted(), SINGLE_STEP_WORKFLOW)
    assert index_rows(store) == []


def test_create_is_atomic_when_a_row_conflicts(store, service):
    # A stray row at the end of the batch: the service rejects the whole transaction.
    table = service.get_table_client(store.orders_table)
    table.create_entity({"PartitionKey": "o-1", "RowKey": "timeline-00000000", "Stray": True})
    with pytest.raises(CorruptOrderState, match="no details row"):
        store.create_order(submitted(), ORDER_WORKFLOW)
    assert partition(store, service, "o-1") == ["timeline-00000000"]


def test_create_is_atomic_when_a_property_is_too_large(store, service, monkeypatch):
    real = store_module.new_step_entity

    def oversized_last_step(order_id: str, index: int, name: str, now: datetime) -> dict:
        entity = real(order_id, index, name, now)
        if index == len(ORDER_WORKFLOW.steps) - 1:
            entity["Junk"] = "x" * 40_000  # > 64 KiB as UTF-16
        return entity

    monkeypatch.setattr(store_module, "new_step_entity", oversized_last_step)
    with pytest.raises(TableTransactionError) as caught:
        store.create_order(submitted(), ORDER_WORKFLOW)
    assert caught.value.status_code == 400
    assert partition(store, service, "o-1") == []
    with pytest.raises(OrderNotFound):
        store.get_process("o-1")


def test_largest_order_fits(store):
    items = [
        {"sku": f"{i:03d}-" + "s" * 60, "quantity": 1_000_000, "unit_price_cents": 10**7}
        for i in range(100)
    ]
    big = submitted(items=items, customer_id="c" * 64)
    assert isinstance(store.create_order(big, ORDER_WORKFLOW), Created)
    assert store.get_order("o-1").details == big
    assert store.get_order("o-1").details.total_cents == MAX_TOTAL_CENTS


# -------------------------------------------------------------------------------- reads


def test_missing_order(store):
    with pytest.raises(OrderNotFound, match="order nope does not exist"):
        store.get_process("nope")
    with pytest.raises(OrderNotFound):
        store.get_order("nope")
    assert store.find_process("nope") is None
    assert store.get_timeline("nope") == []


def test_reads_are_one_request_each(store, requests):
    create(store)
    assert requests.count_during(lambda: store.get_process("o-1"))[0] == 1
    assert requests.count_during(lambda: store.get_order("o-1"))[0] == 1
    assert requests.count_during(lambda: store.get_timeline("o-1"))[0] == 1


def test_orders_do_not_see_each_other(store):
    create(store, "o-1")
    create(store, "o-10")
    create(store, "o-2")
    claim(store, store.get_process("o-10"))
    assert store.get_order("o-1").process.state is ProcessState.PENDING
    assert len(store.get_timeline("o-1")) == 1
    assert len(store.get_timeline("o-10")) == 2


@pytest.mark.parametrize("hostile", ["x' or PartitionKey ne '", "../x", "a/b", "", "é", "a" * 65])
def test_hostile_ids_are_rejected_before_any_request(store, requests, hostile):
    before = len(requests.seen)
    for call in (store.get_process, store.get_order, store.get_timeline, store.find_process):
        with pytest.raises(InvalidId):
            call(hostile)
    assert len(requests.seen) == before


# -------------------------------------------------------------------------- transitions


def test_claim_race_has_exactly_one_winner(store):
    pending = create(store)
    winner = claim(store, pending, "sched-a")
    with pytest.raises(ConcurrencyConflict, match="changed by someone else"):
        claim(store, pending, "sched-b")
    stored = store.get_process("o-1")
    assert stored == winner
    assert (stored.locked_by, stored.attempt, stored.state) == (
        "sched-a",
        1,
        ProcessState.PROCESSING,
    )
    assert [e.event for e in store.get_timeline("o-1")] == ["created", "claimed"]


def test_concurrent_claims_from_threads(store):
    pending = create(store)
    contenders = 6
    barrier = threading.Barrier(contenders)
    outcomes: list[str] = []
    lock = threading.Lock()

    def contend(n: int) -> None:
        barrier.wait()
        try:
            claim(store, pending, f"sched-{n}")
            outcome = f"won:sched-{n}"
        except ConcurrencyConflict:
            outcome = "conflict"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=contend, args=(n,)) for n in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(winners) == 1 and outcomes.count("conflict") == contenders - 1
    assert f"won:{store.get_process('o-1').locked_by}" == winners[0]
    assert len(store.get_timeline("o-1")) == 2


def test_transition_is_one_request_and_returns_the_new_etag(store, requests):
    pending = create(store)
    count, claimed = requests.count_during(lambda: claim(store, pending))
    assert count == 1
    assert claimed.etag != pending.etag
    assert claimed == store.get_process("o-1")
    count, released = requests.count_during(
        lambda: store.release_for_retry(
            claimed, actor="supervisor-1", reason="late", next_attempt_at=T0
        )
    )
    assert count == 1
    assert released.etag == store.get_process("o-1").etag


def test_lost_race_writes_no_timeline_row(store, service):
    pending = create(store)
    claimed = claim(store, pending)
    rows_before = partition(store, service, "o-1")
    with pytest.raises(ConcurrencyConflict):
        store.release_for_retry(pending, actor="supervisor-1", reason="x", next_attempt_at=T0)
    with pytest.raises(ConcurrencyConflict):
        store.mark_error(pending, actor="supervisor-1", reason="x")
    assert partition(store, service, "o-1") == rows_before
    assert store.get_process("o-1") == claimed


def test_sdk_retry_of_a_committed_transition_is_not_a_conflict(store, monkeypatch):
    # The transport resends a batch whose first try committed (response lost): the resend gets
    # 412. The store recognises its own WriteId and reports success.
    pending = create(store)
    table = store._orders
    real_submit = table.submit_transaction

    def commit_then_resend(operations):
        operations = list(operations)
        real_submit(operations)
        return real_submit(operations)

    monkeypatch.setattr(table, "submit_transaction", commit_then_resend)
    claimed = claim(store, pending)
    assert claimed == store.get_process("o-1")
    assert claimed.locked_by == "sched-1"
    assert [e.event for e in store.get_timeline("o-1")] == ["created", "claimed"]


def test_full_happy_path_records_steps_timeline_and_leaves_the_index(store, clock):
    current = claim(store, create(store))
    for step in ORDER_WORKFLOW.steps[1:]:
        clock.advance(timedelta(seconds=1))
        current = store.advance(
            current,
            reply(current),
            next_step=step,
            complete_by=clock.now + step.complete_by_budget,
            actor="sched-1",
        )
        assert (current.current_step, current.state) == (step.name, ProcessState.PROCESSING)
    assert index_rows(store) == [("o-1", 1)]
    done = store.mark_processed(current, actor="sched-1", response=reply(current))
    assert (done.state, done.locked_by, done.complete_by) == (ProcessState.PROCESSED, None, None)
    assert index_rows(store) == []

    record = store.get_order("o-1")
    assert [(s.state, s.attempt, s.result) for s in record.steps] == [
        (StepState.SUCCEEDED, 1, {"ref": "reserve_inventory-1"}),
        (StepState.SUCCEEDED, 2, {"ref": "charge_payment-2"}),
        (StepState.SUCCEEDED, 3, {"ref": "create_shipment-3"}),
    ]
    timeline = store.get_timeline("o-1")
    assert [(e.seq, e.event, e.from_state, e.to_state) for e in timeline] == [
        (0, "created", None, ProcessState.PENDING),
        (1, "claimed", ProcessState.PENDING, ProcessState.PROCESSING),
        (2, "step_succeeded", ProcessState.PROCESSING, ProcessState.PROCESSING),
        (3, "step_succeeded", ProcessState.PROCESSING, ProcessState.PROCESSING),
        (4, "processed", ProcessState.PROCESSING, ProcessState.PROCESSED),
    ]
    assert done.timeline_seq == 4
    assert store.get_timeline("o-1", after_seq=2, limit=1)[0].seq == 3


def test_stale_reply_changes_nothing(store, requests):
    current = claim(store, create(store))
    late = reply(current, attempt=current.attempt)
    released = store.release_for_retry(
        current, actor="supervisor-1", reason="deadline passed", next_attempt_at=T0
    )
    reclaimed = claim(store, released, "sched-2")
    before = len(requests.seen)
    with pytest.raises(StaleResult, match="awaits do reserve_inventory attempt 2"):
        store.advance(
            reclaimed, late, next_step=ORDER_WORKFLOW.steps[1], complete_by=T0, actor="sched-2"
        )
    assert len(requests.seen) == before
    assert store.get_process("o-1") == reclaimed


def test_release_for_retry_clears_the_lock(store, service):
    current = claim(store, create(store))
    due = T0 + timedelta(seconds=20)
    released = store.release_for_retry(
        current,
        actor="supervisor-1",
        reason="complete-by passed",
        next_attempt_at=due,
        complete_by=due + timedelta(minutes=1),
    )
    assert released.state is ProcessState.PENDING
    assert released.locked_by is None
    assert released.failure_count == 1
    assert released.next_attempt_at == due
    assert released.complete_by == due + timedelta(minutes=1)
    assert released.last_error == "complete-by passed"
    raw = service.get_table_client(store.orders_table).get_entity("o-1", "process")
    assert "LockedBy" not in raw  # REPLACE removed it: null, as in the pattern
    assert released == store.get_process("o-1")
    assert claim(store, released).attempt == 2


def test_failed_step_then_error_then_resubmit(store, clock):
    current = claim(store, create(store))
    failed = reply(
        current, outcome="failed", result={}, error_code="out_of_stock", error_message="gone"
    )
    errored = store.mark_error(current, actor="sched-1", reason="out of stock", response=failed)
    assert errored.state is ProcessState.ERROR and errored.locked_by is None
    assert store.get_order("o-1").step("reserve_inventory").state is StepState.FAILED
    assert index_rows(store) == []

    resubmitted = store.resubmit(errored, actor="operator-ann", reason="stock arrived")
    assert (resubmitted.state, resubmitted.generation, resubmitted.failure_count) == (
        ProcessState.PENDING,
        2,
        0,
    )
    assert resubmitted.current_step == "reserve_inventory"
    assert index_rows(store) == [("o-1", 2)]
    again = claim(store, resubmitted)
    assert again.attempt == 2  # attempts never restart, so replies of generation 1 stay stale


def test_compensation_path_through_generic_transition(store):
    current = claim(store, create(store))
    current = store.advance(
        current,
        reply(current),
        next_step=ORDER_WORKFLOW.steps[1],
        complete_by=T0,
        actor="sched-1",
    )
    declined = reply(current, outcome="failed", result={}, error_code="card_declined")
    compensating = store.record_step_result(
        current,
        declined,
        {
            "state": ProcessState.COMPENSATING,
            "current_step": "reserve_inventory",
            "current_operation": "undo",
            "attempt": current.attempt + 1,
            "complete_by": T0 + timedelta(seconds=30),
        },
        actor="sched-1",
        event="compensation_started",
    )
    undone = store.record_step_result(
        compensating,
        reply(compensating),
        {"state": ProcessState.ERROR, "locked_by": None, "complete_by": None},
        actor="sched-1",
        event="compensated",
    )
    steps = {s.name: s for s in store.get_order("o-1").steps}
    assert steps["charge_payment"].state is StepState.FAILED
    assert steps["reserve_inventory"].state is StepState.COMPENSATED
    assert steps["reserve_inventory"].result == {"ref": "reserve_inventory-1"}  # kept
    assert steps["reserve_inventory"].compensated_at is not None
    assert undone.state is ProcessState.ERROR
    assert index_rows(store) == []


def test_large_step_result_is_split_and_read_back(store):
    current = claim(store, create(store, workflow=SINGLE_STEP_WORKFLOW))
    result = {"blob": "é" * 100_000, "n": list(range(1000))}
    store.mark_processed(current, actor="sched-1", response=reply(current, result=result))
    assert store.get_order("o-1").steps[0].result == result


def test_deleted_order_is_not_found_on_transition(store, service):
    current = create(store)
    table = service.get_table_client(store.orders_table)
    for key in partition(store, service, "o-1"):
        table.delete_entity("o-1", key)
    with pytest.raises(OrderNotFound):
        claim(store, current)


def test_missing_step_row_is_reported_as_corrupt_and_nothing_is_written(store, service):
    current = claim(store, create(store))
    service.get_table_client(store.orders_table).delete_entity("o-1", "step-00-reserve_inventory")
    with pytest.raises(CorruptOrderState, match="lacks the step row"):
        store.mark_processed(current, actor="sched-1", response=reply(current))
    assert store.get_process("o-1") == current


# -------------------------------------------------------------------------------- index


def test_index_holds_only_orders_in_flight(store):
    for n in range(5):
        create(store, f"o-{n}")
    done = claim(store, store.get_process("o-0"))
    store.mark_processed(done, actor="sched-1")
    store.mark_error(store.get_process("o-1"), actor="supervisor-1", reason="x")
    assert index_rows(store) == [("o-2", 1), ("o-3", 1), ("o-4", 1)]
    rows = store.list_active().rows
    assert {row.partition_key for row in rows} == {index_partition(r.order_id) for r in rows}


def test_list_active_pages_with_continuation(store):
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
    assert sorted(seen) == sorted(expected) and len(seen) == 25
    assert pages >= 4


def test_reap_deletes_only_old_garbage(store, clock):
    live = create(store, "o-live")
    finished = claim(store, create(store, "o-done"))
    store.mark_processed(finished, actor="sched-1")
    store.index.put("o-done", 1, "order")  # as if the post-terminal delete had failed
    store.index.put("o-missing", 1, "order")  # as if create crashed after the index row
    rows = {row.order_id: row for row in store.list_active().rows}
    assert set(rows) == {"o-live", "o-done", "o-missing"}

    def reap(grace: timedelta) -> set[str]:
        reaped = set()
        for order_id, row in rows.items():
            if store.reap_active(row, store.find_process(order_id), grace=grace):
                reaped.add(order_id)
        return reaped

    assert reap(timedelta(minutes=10)) == set()  # everything is younger than the grace period
    clock.advance(timedelta(minutes=11))
    assert reap(timedelta(minutes=10)) == {"o-done", "o-missing"}
    assert index_rows(store) == [("o-live", 1)]
    assert store.get_process("o-live") == live


def test_reap_keeps_a_row_rewritten_since_it_was_listed(store, clock):
    errored = store.mark_error(create(store), actor="supervisor-1", reason="x")
    store.index.put("o-1", 1, "order")
    [row] = store.list_active().rows
    clock.advance(timedelta(hours=1))
    store.index.put("o-1", 1, "order")  # e.g. a concurrent operator action re-wrote it
    assert store.reap_active(row, errored, grace=timedelta(minutes=1)) is False
    assert index_rows(store) == [("o-1", 1)]


def test_reap_keeps_the_row_of_another_generation_in_flight(store, clock):
    errored = store.mark_error(create(store), actor="supervisor-1", reason="x")
    resubmitted = store.resubmit(errored, actor="operator-ann", reason="retry")
    store.index.put("o-1", 1, "order")  # stale generation-1 row
    clock.advance(timedelta(hours=1))
    rows = {row.generation: row for row in store.list_active().rows}
    assert store.reap_active(rows[2], resubmitted, grace=timedelta(minutes=1)) is False
    assert store.reap_active(rows[1], resubmitted, grace=timedelta(minutes=1)) is True
    assert index_rows(store) == [("o-1", 2)]


def test_datetimes_round_trip_exactly(store):
    deadline = datetime(2031, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    claimed = store.claim(create(store), instance_id="sched-1", complete_by=deadline)
    stored = store.get_process("o-1")
    assert stored.complete_by == deadline == claimed.complete_by
    assert stored.complete_by.tzinfo is UTC
