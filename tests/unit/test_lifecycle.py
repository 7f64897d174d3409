"""The order lifecycle's rules, one example each: pure decisions, no I/O."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from adapters.store.rows import order_entity, order_from_entity
from domain.events import (
    DEFAULT_FLUSH_GRACE,
    DEFAULT_STALE_AFTER,
    Context,
    Decision,
    Replied,
    RepliesRefused,
    Resent,
    RetryDue,
    Swept,
)
from domain.lifecycle import (
    REPLY_HOLD_LIMIT,
    REPLY_RETRY_FIRST,
    REPLY_RETRY_MAX,
    UNREQUESTED_REASON,
    decide,
    due_at,
    submit,
)
from domain.messages import (
    EXPIRED,
    AgentRequest,
    AgentResponse,
    OperatorAlert,
    OrderSubmitted,
    SchedulerCommand,
    StatusUpdate,
    message_id_for,
)
from domain.operator_actions import Cancel, Resubmit, act
from domain.order import TERMINAL_ALERT_REASONS, Failures, Order, Requests, StepState
from domain.states import ProcessState, transition_allowed
from domain.workflows import ORDER_WORKFLOW, ORDER_WORKFLOW_V2

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FLOW = ORDER_WORKFLOW


def ctx(at: float = 0, *, jitter: float = 0.0, actor: str = "scheduler:a") -> Context:
    return Context(workflow=FLOW, now=T0 + timedelta(seconds=at), actor=actor, jitter=jitter)


def new_order(reply_to: str | None = "client-replies") -> Order:
    submitted = OrderSubmitted(
        order_id="o-1",
        customer_id="c-1",
        items=[{"sku": "SKU-1", "quantity": 2, "unit_price_cents": 250}],
        currency="EUR",
        reply_to=reply_to,
    )
    decision = submit(submitted, ctx())
    assert decision.order is not None
    return decision.order


def request_of(order: Order) -> AgentRequest:
    requests = [o.message for o in order.outbox if isinstance(o.message, AgentRequest)]
    assert len(requests) == 1, order.outbox
    return requests[0]


def answer(request: AgentRequest, outcome: str = "succeeded", **fields: object) -> AgentResponse:
    if outcome == "transient":
        fields = {"outcome": "failed", "transient": True, "error_code": "unavailable", **fields}
    elif outcome == "declined":
        fields = {"outcome": "failed", "error_code": "card_declined", **fields}
    else:
        fields = {"outcome": outcome, **fields}
    return AgentResponse(
        order_id=request.order_id,
        step=request.step,
        operation=request.operation,
        attempt=request.attempt,
        idempotency_key=request.idempotency_key,
        responded_at=T0,
        **fields,  # type: ignore[arg-type]
    )


def apply(order: Order, decision: Decision) -> Order:
    return order if decision.order is None else decision.order


def kinds(decision: Decision) -> list[str]:
    return [type(o.message).__name__ for o in decision.send]


def after_steps(n: int) -> Order:
    """An order whose first ``n`` steps succeeded (the next one is in flight)."""
    order = new_order()
    for _ in range(n):
        order = apply(order, decide(order, Replied(answer(request_of(order))), ctx(1)))
    return order


# ------------------------------------------------------------------------------ submission


def test_a_new_order_is_created_claimed_and_dispatched_in_one_write():
    decision = submit(new_order_submitted(), ctx())
    order = decision.order
    assert order is not None and decision.entry is not None
    assert order.state is ProcessState.PROCESSING and order.attempt == 1
    assert order.locked_by == "scheduler:a"
    first = FLOW.first_step
    assert order.complete_by == T0 + first.queue_budget + first.complete_by_budget
    assert order.step("reserve_inventory").state is StepState.RUNNING
    assert kinds(decision) == ["StatusUpdate", "StatusUpdate", "AgentRequest"]
    request = decision.send[-1].message
    assert isinstance(request, AgentRequest)
    assert request.complete_by == order.complete_by
    assert request.run_budget_s == first.complete_by_budget.total_seconds()
    assert order.outbox == decision.send
    assert [s.message.sequence for s in decision.send[:2]] == [0, 1]  # type: ignore[attr-defined]
    assert decision.entry.event == "created" and decision.entry.seq == 0


def new_order_submitted() -> OrderSubmitted:
    return OrderSubmitted(
        order_id="o-1",
        customer_id="c-1",
        items=[{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 1}],
        currency="EUR",
        reply_to="client-replies",
    )


def test_a_redelivered_submission_resends_what_the_order_owes_without_writing():
    order = new_order()
    decision = decide(order, Resent(), ctx(1))
    assert decision.order is None and decision.send == order.outbox


# --------------------------------------------------------------------------------- replies


def test_a_success_advances_and_its_reply_proves_the_outbox_was_delivered():
    order = new_order()
    decision = decide(order, Replied(answer(request_of(order))), ctx(1))
    after = decision.order
    assert after is not None
    assert after.step("reserve_inventory").state is StepState.SUCCEEDED
    assert after.current_step == "charge_payment" and after.attempt == 2
    # Only the new messages: the received/started statuses were provably sent.
    assert [m.message.event for m in after.outbox if isinstance(m.message, StatusUpdate)] == [
        "step_completed",
        "step_started",
    ]
    assert isinstance(after.outbox[-1].message, AgentRequest)


def test_the_last_success_finishes_the_order():
    order = after_steps(2)
    decision = decide(order, Replied(answer(request_of(order))), ctx(2))
    assert decision.order is not None and decision.order.state is ProcessState.PROCESSED
    assert decision.finished and decision.order.locked_by is None
    updates = [(m.message.event, m.message.state) for m in decision.send]  # type: ignore[attr-defined]
    # Exactly one update says the order finished: the last step's still says Processing.
    assert updates == [("step_completed", "Processing"), ("processed", "Processed")]


def test_an_event_that_proves_nothing_carries_the_outbox_forward():
    order = new_order()  # owes: status 0, status 1, the first request
    after = act(order, Cancel("operator:bob", "fraud"), ctx(1)).order
    assert after is not None
    statuses = [o.message.sequence for o in after.outbox if isinstance(o.message, StatusUpdate)]
    assert statuses == [0, 1, 2]  # the first two may never have left: sent again, in order
    requests = [o.message for o in after.outbox if isinstance(o.message, AgentRequest)]
    assert [(r.operation, r.attempt) for r in requests] == [("undo", 2)]  # stale request dropped
    assert after.outbox[-1].message == requests[0]


def test_a_late_success_after_the_step_was_released_is_applied():
    order = new_order()
    first = request_of(order)
    released = apply(order, decide(order, Replied(answer(first, "transient")), ctx(1)))
    assert released.state is ProcessState.PENDING and released.failure_count == 1
    decision = decide(released, Replied(answer(first)), ctx(2))
    after = decision.order
    assert after is not None and after.current_step == "charge_payment"
    assert after.failure_count == 0
    # The retry command is stale now: it leaves the outbox.
    assert not [o for o in after.outbox if isinstance(o.message, SchedulerCommand)]


def test_a_transient_failure_releases_for_a_delayed_retry():
    order = new_order()
    decision = decide(order, Replied(answer(request_of(order), "transient")), ctx(1, jitter=0))
    after = decision.order
    assert after is not None
    assert (after.state, after.locked_by, after.failure_count) == (ProcessState.PENDING, None, 1)
    command = after.outbox[-1]
    assert isinstance(command.message, SchedulerCommand)
    assert command.not_before == T0 + timedelta(seconds=1) + FLOW.retry.base_delay
    assert after.next_attempt_at == command.not_before


def test_a_transient_failure_of_an_earlier_attempt_counts_for_nothing():
    order = new_order()
    first = request_of(order)
    released = apply(order, decide(order, Replied(answer(first, "transient")), ctx(1)))
    command = released.outbox[-1].message
    claimed = apply(released, decide(released, RetryDue(command), ctx(10)))  # type: ignore[arg-type]
    decision = decide(claimed, Replied(answer(first, "transient")), ctx(11))
    assert decision.order is None


def test_an_open_circuit_defers_without_counting_a_failure():
    order = new_order()
    retry_at = T0 + timedelta(seconds=40)
    reply = answer(request_of(order), "deferred", retry_at=retry_at)
    after = decide(order, Replied(reply), ctx(1)).order
    assert after is not None
    assert after.failure_count == 0 and after.state is ProcessState.PENDING
    assert after.outbox[-1].not_before == retry_at


def test_a_decline_of_the_first_step_fails_at_once_with_one_alert():
    order = new_order()
    decision = decide(order, Replied(answer(request_of(order), "declined")), ctx(1))
    after = decision.order
    assert after is not None and after.state is ProcessState.ERROR
    assert after.step("reserve_inventory").state is StepState.FAILED
    alerts = [o.message for o in decision.send if isinstance(o.message, OperatorAlert)]
    assert [a.reason for a in alerts] == ["step_declined"]
    assert "nothing to undo" in after.last_error  # type: ignore[operator]


def test_a_decline_undoes_what_succeeded_naming_the_forward_key():
    order = after_steps(1)
    after = decide(order, Replied(answer(request_of(order), "declined")), ctx(2)).order
    assert after is not None and after.state is ProcessState.COMPENSATING
    undo = request_of(after)
    assert (undo.step, undo.operation, undo.action) == ("reserve_inventory", "undo", "release")
    assert undo.undoes == "o-1:reserve_inventory:do:1"


def test_at_the_threshold_the_step_in_flight_is_undone_too():
    order = after_steps(1)
    for n in range(FLOW.failure_threshold):
        request = request_of(order)
        order = apply(order, decide(order, Replied(answer(request, "transient")), ctx(10 + n)))
        if order.state is ProcessState.PENDING:
            command = order.outbox[-1].message
            order = apply(order, decide(order, RetryDue(command), ctx(20 + n)))  # type: ignore[arg-type]
    assert order.state is ProcessState.COMPENSATING
    assert order.compensation_cause == "failure_threshold"
    undo = request_of(order)
    assert (undo.step, undo.undoes) == ("charge_payment", "o-1:charge_payment:do:1")


def test_nothing_to_undo_voids_the_step_and_the_order_ends_with_one_alert():
    order = after_steps(1)
    order = apply(order, act(order, Cancel("operator:bob", "customer asked"), ctx(3)))
    first_undo = request_of(order)
    assert first_undo.step == "charge_payment"
    order = apply(order, decide(order, Replied(answer(first_undo, "nothing_to_undo")), ctx(4)))
    assert order.step("charge_payment").state is StepState.VOIDED
    decision = decide(order, Replied(answer(request_of(order))), ctx(5))
    after = decision.order
    assert after is not None and after.state is ProcessState.ERROR
    assert after.step("reserve_inventory").state is StepState.COMPENSATED
    alerts = [o.message for o in decision.send if isinstance(o.message, OperatorAlert)]
    assert [(a.reason, a.severity) for a in alerts] == [("cancelled", "warning")]
    assert "never took effect: charge_payment" in after.last_error  # type: ignore[operator]


# --------------------------------------------------------------------------- whose failure


def test_a_failure_the_agent_reports_is_counted_at_the_service_or_on_our_side():
    order = new_order()
    failed = apply(order, decide(order, Replied(answer(request_of(order), "transient")), ctx(1)))
    assert failed.step("reserve_inventory").forward_failures == Failures(at_service=1)
    expired = answer(request_of(order), "transient", error_code=EXPIRED)
    failed = apply(order, decide(order, Replied(expired), ctx(1)))
    assert failed.step("reserve_inventory").forward_failures == Failures(on_our_side=1)
    assert failed.failure_count == 1  # it failed all the same: counted toward the threshold


def test_an_attempt_given_up_on_unanswered_is_settled_by_its_late_answer():
    order = new_order()
    first = request_of(order)
    deadline = FLOW.first_step.deadline_budget.total_seconds()
    released = apply(order, decide(order, Swept(), ctx(deadline + 1, actor="supervisor:s")))
    assert released.step("reserve_inventory").forward_failures == Failures(unanswered=(1,))
    command = released.outbox[-1].message
    claimed = apply(released, decide(released, RetryDue(command), ctx(deadline + 10)))  # type: ignore[arg-type]

    late = answer(first, "transient", error_code=EXPIRED)
    decision = decide(claimed, Replied(late), ctx(deadline + 11))
    learned = decision.order
    assert learned is not None and decision.entry is not None
    assert decision.entry.event == "late_answer"
    assert "attempt 1 was given up on unanswered, and it never left our side" in (
        decision.entry.detail
    )
    assert learned.step("reserve_inventory").forward_failures == Failures(on_our_side=1)
    assert (learned.state, learned.attempt, learned.locked_by) == (
        claimed.state,
        claimed.attempt,
        claimed.locked_by,
    )
    assert decide(learned, Replied(late), ctx(deadline + 12)).order is None  # settled once

    reached = decide(claimed, Replied(answer(first, "transient")), ctx(deadline + 11)).order
    assert reached is not None
    assert reached.step("reserve_inventory").forward_failures == Failures(at_service=1)


def test_whose_failure_an_attempt_was_is_recorded_on_a_settled_order_and_nothing_else():
    """A late_answer changes no outcome: it is written on an order that has ended and settled
    (issue 32) as a record about the order, never a change of it (issue 28)."""
    order = new_order()
    first = request_of(order)
    deadline = FLOW.first_step.deadline_budget.total_seconds()
    order = apply(order, decide(order, Swept(), ctx(deadline + 1, actor="supervisor:s")))
    order = apply(order, decide(order, RetryDue(order.outbox[-1].message), ctx(deadline + 10)))  # type: ignore[arg-type]
    for _ in range(3):  # the retried reservation and the two later steps succeed
        order = apply(order, decide(order, Replied(answer(request_of(order))), ctx(deadline + 11)))
    assert order.state is ProcessState.PROCESSED and not order.settling

    expired = answer(first, "transient", error_code=EXPIRED)
    late = decide(order, Replied(expired), ctx(deadline + 60))
    assert late.order is not None and late.entry is not None
    assert (late.entry.event, late.entry.from_state, late.entry.to_state) == (
        "late_answer",
        ProcessState.PROCESSED,
        ProcessState.PROCESSED,
    )
    assert late.send == () and not late.finished
    assert late.order.step("reserve_inventory").forward_failures == Failures(on_our_side=1)
    unchanged = {"steps": order.steps, "updated_at": order.updated_at}
    assert replace(late.order, **unchanged, timeline_seq=order.timeline_seq) == order
    assert decide(late.order, Replied(expired), ctx(deadline + 61)).order is None


def test_a_retry_never_claimed_failed_on_our_side():
    order = new_order()
    released = apply(order, decide(order, Replied(answer(request_of(order), "transient")), ctx(1)))
    assert released.next_attempt_at is not None
    stale = (released.next_attempt_at - T0).total_seconds() + 121
    again = apply(released, decide(released, Swept(), ctx(stale, actor="supervisor:s")))
    assert again.failure_count == 2
    assert again.step("reserve_inventory").forward_failures == Failures(at_service=1, on_our_side=1)


def released_stale(order: Order) -> Order:
    """The Supervisor finds the released order's retry never claimed (its host was frozen)."""
    assert order.next_attempt_at is not None
    stale = (order.next_attempt_at - T0).total_seconds() + 121
    return apply(order, decide(order, Swept(), ctx(stale, actor="supervisor:s")))


def test_failures_that_never_left_our_side_do_not_count_toward_the_threshold():
    """As a chaos run with hosts frozen past their locks showed: retries never claimed and
    requests taken up after their deadline failed orders that no service had failed."""
    order = new_order()
    order = apply(order, decide(order, Replied(answer(request_of(order), "transient")), ctx(1)))
    for _ in range(2 * FLOW.failure_threshold):
        order = released_stale(order)
    assert (order.state, order.failure_count) == (ProcessState.PENDING, 7)
    assert order.step("reserve_inventory").forward_failures == Failures(at_service=1, on_our_side=6)
    entry = decide(order, Swept(), ctx(10_000, actor="supervisor:s")).entry
    assert entry is not None and "1 of 3 failures count, 7 never left our side" in entry.detail

    order = apply(order, decide(order, RetryDue(order.outbox[-1].message), ctx(10_000)))  # type: ignore[arg-type]
    for n in range(2):  # two more the service failed: the threshold is reached
        decision = decide(order, Replied(answer(request_of(order), "transient")), ctx(10_001 + n))
        order = apply(order, decision)
        if order.state is ProcessState.PENDING:
            order = apply(order, decide(order, RetryDue(order.outbox[-1].message), ctx(10_010)))  # type: ignore[arg-type]
    assert order.state is ProcessState.COMPENSATING
    assert order.compensation_cause == "failure_threshold"
    assert "failure threshold of 3 reached after 3 failed attempts (and 6 that never left our " + (
        "side)"
    ) in (order.compensation_reason or "")


def test_an_expired_answer_that_comes_in_time_takes_its_failure_back_from_the_count():
    order = new_order()
    first = request_of(order)
    deadline = FLOW.first_step.deadline_budget.total_seconds()
    order = apply(order, decide(order, Swept(), ctx(deadline + 1, actor="supervisor:s")))
    order = released_stale(order)  # counted 1 (unanswered), 1 on our side
    late = answer(first, "transient", error_code=EXPIRED)
    order = apply(order, decide(order, Replied(late), ctx(deadline + 200)))
    assert order.step("reserve_inventory").forward_failures == Failures(on_our_side=2)
    order = released_stale(order)
    assert order.state is ProcessState.PENDING and order.failure_count == 3


# ---------------------------------------------------------------------- compensation budget


BUDGET = timedelta(hours=1)
WARN_AFTER = timedelta(minutes=10)


def undoing(at: float = 2) -> Order:
    """An order whose reservation is being released: its charge was declined at ``at``."""
    order = after_steps(1)
    order = apply(order, decide(order, Replied(answer(request_of(order), "declined")), ctx(at)))
    assert (order.state, order.current_operation) == (ProcessState.COMPENSATING, "undo")
    return order


def budgeted(at: float, *, jitter: float = 0.0) -> Context:
    return replace(
        ctx(at, jitter=jitter), compensation_budget=BUDGET, compensation_warn_after=WARN_AFTER
    )


def undo_fails(order: Order, at: float, outcome: str = "transient") -> tuple[Order, Decision]:
    """The undo in flight fails at ``at``: answered transiently, or (``timeout``) unanswered
    until the Supervisor finds it past its CompleteBy."""
    if outcome == "timeout":
        assert order.complete_by is not None and order.complete_by <= T0 + timedelta(seconds=at)
        decision = decide(order, Swept(), budgeted(at))
    else:
        decision = decide(order, Replied(answer(request_of(order), outcome)), budgeted(at))
    return apply(order, decision), decision


def retried(order: Order) -> Order:
    """The retry command comes back when due and claims the undo again."""
    assert order.next_attempt_at is not None
    command = order.outbox[-1].message
    assert isinstance(command, SchedulerCommand)
    due = (order.next_attempt_at - T0).total_seconds()
    return apply(order, decide(order, RetryDue(command), budgeted(due)))


def test_compensation_records_when_it_started():
    order = undoing(at=2)
    assert order.compensation_started_at == T0 + timedelta(seconds=2)
    assert not order.compensation_warned


def test_an_undo_failing_past_the_failure_threshold_is_retried_with_growing_capped_backoff():
    order = undoing()
    delays = []
    at = 3.0
    for _ in range(3 * FLOW.failure_threshold):
        order, decision = undo_fails(order, at)
        assert decision.entry is not None and decision.entry.event == "released"
        assert (order.state, order.locked_by) == (ProcessState.COMPENSATING, None)
        assert order.next_attempt_at is not None
        delays.append((order.next_attempt_at - T0).total_seconds() - at)
        order = retried(order)
        assert order.current_operation == "undo" and order.locked_by == "scheduler:a"
        at = (order.updated_at - T0).total_seconds() + 1
    cap = FLOW.retry.cap.total_seconds()
    assert delays == sorted(delays) and delays[0] == FLOW.retry.base_delay.total_seconds()
    assert max(delays) == cap and delays.count(cap) >= 2
    assert order.failure_count == 3 * FLOW.failure_threshold
    assert order.step("reserve_inventory").undo_failures.at_service == 3 * FLOW.failure_threshold


def test_undo_timeouts_are_retried_too_and_counted_unanswered():
    order = undoing()
    for _ in range(FLOW.failure_threshold + 1):
        assert order.complete_by is not None
        at = (order.complete_by - T0).total_seconds() + 1
        order, decision = undo_fails(order, at, "timeout")
        assert decision.entry is not None and decision.entry.event == "released"
        assert "passed CompleteBy" in decision.entry.detail
        order = retried(order)
    assert order.state is ProcessState.COMPENSATING
    failures = order.step("reserve_inventory").undo_failures
    assert (failures.at_service, failures.on_our_side, len(failures.unanswered)) == (0, 0, 4)


def test_compensation_gives_up_once_its_budget_is_spent_with_one_critical_alert():
    order = undoing(at=2)
    order, _ = undo_fails(order, 3)
    order = retried(order)
    spent = 2 + BUDGET.total_seconds()
    order, decision = undo_fails(order, spent - 1)  # one second left: retried again
    assert order.state is ProcessState.COMPENSATING
    order = retried(order)
    order, decision = undo_fails(order, spent)
    assert order.state is ProcessState.ERROR
    alerts = [o.message for o in decision.send if isinstance(o.message, OperatorAlert)]
    assert [(a.reason, a.severity) for a in alerts] == [("compensation_incomplete", "critical")]
    assert "compensation budget of 3600s spent" in (order.last_error or "")
    assert "reserve_inventory (release at inventory)" in (order.last_error or "")
    assert order.step("reserve_inventory").state is StepState.SUCCEEDED  # left in place


def test_an_undo_the_service_refuses_ends_compensation_at_once():
    order = undoing()
    order, decision = undo_fails(order, 3, "declined")
    assert order.state is ProcessState.ERROR
    alerts = [o.message for o in decision.send if isinstance(o.message, OperatorAlert)]
    assert [(a.reason, a.severity) for a in alerts] == [("compensation_incomplete", "critical")]
    assert "undo of reserve_inventory refused: card_declined" in (order.last_error or "")


def test_a_long_compensation_warns_once_and_keeps_undoing():
    order = undoing(at=2)
    warnings: list[OperatorAlert] = []
    at = 3.0
    while at < 2 + 3 * WARN_AFTER.total_seconds():
        order, decision = undo_fails(order, at)
        warnings += [o.message for o in decision.send if isinstance(o.message, OperatorAlert)]
        order = retried(order)
        warnings += [o.message for o in order.outbox if isinstance(o.message, OperatorAlert)]
        at = (order.updated_at - T0).total_seconds() + 1
    assert order.state is ProcessState.COMPENSATING and order.compensation_warned
    assert len({(a.reason, a.timeline_seq) for a in warnings}) == 1
    # Named by the write that raised it, not by a message: each resend is the same alert.
    assert len({message_id_for(a) for a in warnings}) == 1
    (warning,) = {a.timeline_seq: a for a in warnings}.values()
    assert warning.caused_by is None
    assert (warning.reason, warning.severity) == ("compensation_delayed", "warning")
    assert "reserve_inventory failed" in warning.detail
    assert (T0 + timedelta(seconds=2) + BUDGET).isoformat() in warning.detail
    assert warning.reason not in TERMINAL_ALERT_REASONS


def test_a_resumed_compensation_has_a_budget_and_a_warning_of_its_own():
    order, _ = undo_fails(undoing(at=2), 3, "declined")  # refused: Error, undo left
    assert order.state is ProcessState.ERROR
    at = 2 + 2 * BUDGET.total_seconds()
    resumed = act(order, Resubmit("operator:bob", "retry the release", True), budgeted(at))
    after = resumed.order
    assert after is not None and after.state is ProcessState.COMPENSATING
    assert after.compensation_started_at == T0 + timedelta(seconds=at)
    assert not after.compensation_warned


def test_a_reply_naming_an_unknown_step_is_alerted_and_changes_nothing():
    order = new_order()
    reply = AgentResponse(
        order_id="o-1",
        step="teleport",
        operation="do",
        attempt=1,
        idempotency_key="o-1:teleport:do:1",
        outcome="succeeded",
    )
    decision = decide(order, Replied(reply, "responses/m-1"), ctx(1))
    assert decision.order is None and kinds(decision) == ["OperatorAlert"]
    # Each message is its own event, however alike; the same message again is not.
    again = decide(order, Replied(reply, "responses/m-1"), ctx(9, actor="scheduler:b"))
    another = decide(order, Replied(reply, "responses/m-2"), ctx(1)).send[0].message
    ids = [message_id_for(a.message) for a in decision.send + again.send] + [
        message_id_for(another)
    ]
    assert ids[0] == ids[1] != ids[2]


def test_a_reply_for_another_generation_changes_nothing():
    order = new_order()
    old = answer(request_of(order)).model_copy(
        update={"idempotency_key": "o-1:reserve_inventory:do:2"}
    )
    assert decide(order, Replied(old), ctx(1)).order is None


# ------------------------------------------------------------- answers to requests never sent


def refusal(decision: Decision) -> str:
    """The note of an answer refused as answering no request the order sent (one alert)."""
    assert decision.order is None and kinds(decision) == ["OperatorAlert"], decision
    alert = decision.send[0].message
    assert isinstance(alert, OperatorAlert)
    assert (alert.reason, alert.severity, alert.order_id) == (UNREQUESTED_REASON, "critical", "o-1")
    assert decision.note.startswith(alert.detail)
    return decision.note


def undo_answer(
    order: Order, step: str, attempt: int, outcome: str = "succeeded", **fields: object
) -> AgentResponse:
    return AgentResponse(
        order_id=order.order_id,
        step=step,
        operation="undo",
        attempt=attempt,
        idempotency_key=order.step(step).key(order.order_id, "undo"),
        outcome=outcome,  # type: ignore[arg-type]
        responded_at=T0,
        **fields,  # type: ignore[arg-type]
    )


def test_an_undo_answer_for_a_processed_order_that_undid_nothing_changes_nothing():
    processed = after_steps(3)
    assert processed.state is ProcessState.PROCESSED
    forged = undo_answer(processed, "charge_payment", processed.attempt)
    decision = decide(processed, Replied(forged), ctx(9))
    assert refusal(decision).endswith("(charge_payment was sent: do at attempt 2 (generation 1))")
    assert decision.send[0].message.detail == (  # type: ignore[attr-defined]
        "order o-1 never sent the request this answer is for: undo charge_payment attempt 3, "
        "key o-1:charge_payment:undo:1, answered succeeded. The order was not changed; what the "
        "service did under that key stands. A signed answer to a request never sent is a bug "
        "upstream or a leaked signing key: find who sent message "
        "rsp:o-1:charge_payment:undo:1:3 to the response queue."
    )


def test_an_unrequested_answer_is_alerted_once_per_message_that_brought_it():
    """Named by the message (issue 28, item 3): the same answer in two messages is two alerts,
    one message delivered twice is one, whatever the text."""
    order = after_steps(1)
    forged = undo_answer(order, "reserve_inventory", 1)
    alerts = [
        decide(order, Replied(forged, cause), ctx(2)).send[0].message
        for cause in ("responses/m-1", "responses/m-2", "responses/m-1")
    ]
    assert [a.caused_by for a in alerts] == ["responses/m-1", "responses/m-2", "responses/m-1"]  # type: ignore[attr-defined]
    ids = [message_id_for(a) for a in alerts]
    assert ids[0] != ids[1] and ids[0] == ids[2]


def test_an_undo_answer_while_the_order_moves_forward_changes_nothing():
    order = after_steps(1)
    refusal(decide(order, Replied(undo_answer(order, "reserve_inventory", 1)), ctx(2)))


def test_an_answer_naming_an_attempt_that_carried_another_request_changes_nothing():
    order = after_steps(1)  # reserve_inventory was attempt 1; charge_payment is attempt 2
    charge = request_of(order)
    wrong = answer(charge).model_copy(update={"attempt": 1})
    refusal(decide(order, Replied(wrong), ctx(2)))
    later = answer(charge).model_copy(update={"attempt": 3})
    refusal(decide(order, Replied(later), ctx(2)))
    assert decide(order, Replied(answer(charge)), ctx(2)).order is not None


def test_a_do_answer_carrying_an_undo_attempt_changes_nothing():
    order = after_steps(1)
    cancelled = apply(order, act(order, Cancel("operator:bob", "fraud"), ctx(3)))
    undo = request_of(cancelled)
    assert (undo.step, undo.operation, undo.attempt) == ("charge_payment", "undo", 3)
    do = answer(undo).model_copy(
        update={"operation": "do", "idempotency_key": "o-1:charge_payment:do:1"}
    )
    note = refusal(decide(cancelled, Replied(do), ctx(4)))
    assert "charge_payment was sent: do at attempt 2, undo at attempt 3" in note


def test_an_answer_for_a_step_never_requested_changes_nothing():
    order = new_order()  # charge_payment is Pending: never requested in generation 1
    never = AgentResponse(
        order_id="o-1",
        step="charge_payment",
        operation="do",
        attempt=1,
        idempotency_key="o-1:charge_payment:do:1",
        outcome="succeeded",
    )
    note = refusal(decide(order, Replied(never), ctx(1)))
    assert "charge_payment was sent: nothing (generation 1)" in note


def test_a_generation_not_reached_is_refused_and_an_earlier_one_ignored_quietly():
    order = new_order()
    errored = apply(order, decide(order, Replied(answer(request_of(order), "declined")), ctx(1)))
    again = apply(errored, act(errored, Resubmit("operator:bob", "x", True), ctx(2)))
    assert again.generation == 2
    current = request_of(again)
    future = answer(current).model_copy(update={"idempotency_key": "o-1:reserve_inventory:do:3"})
    note = refusal(decide(again, Replied(future), ctx(3)))
    assert "reserve_inventory's requests are of generation 2" in note
    past = answer(current).model_copy(update={"idempotency_key": "o-1:reserve_inventory:do:1"})
    quiet = decide(again, Replied(past), ctx(3))  # it was sent, in generation 1: no longer known
    assert quiet.order is None and "OperatorAlert" not in kinds(quiet)


def test_a_transient_answer_to_a_request_never_sent_is_refused_too():
    order = after_steps(1)
    retry_at = T0 + timedelta(seconds=5)
    bogus = undo_answer(order, "reserve_inventory", 2, "deferred", retry_at=retry_at)
    refusal(decide(order, Replied(bogus), ctx(2)))


def test_an_undo_answered_by_an_earlier_attempt_of_it_is_applied():
    order = after_steps(1)
    order = apply(order, decide(order, Replied(answer(request_of(order), "declined")), ctx(2)))
    first_undo = request_of(order)  # reserve_inventory's undo, attempt 3: it times out
    order = apply(order, decide(order, Replied(answer(first_undo, "transient")), ctx(3)))
    command = order.outbox[-1].message
    order = apply(order, decide(order, RetryDue(command), ctx(30)))  # type: ignore[arg-type]
    reserve = order.step("reserve_inventory")
    assert reserve.requests == (Requests("do", 1, 1), Requests("undo", 3, 4))
    decision = decide(order, Replied(answer(first_undo)), ctx(31))  # ...yet it had landed
    assert decision.order is not None and decision.order.state is ProcessState.ERROR
    assert decision.order.step("reserve_inventory").state is StepState.COMPENSATED


def test_a_kept_step_sent_again_after_a_resubmit_is_answered_at_its_new_attempt():
    errored = v2_order_declined_at_shipment()
    scheduler = v2(10, actor="scheduler:a")
    order = apply(errored, act(errored, Resubmit("operator:ann", "x", True), v2(9)))
    for _ in range(2):  # reserve_inventory and charge_payment, afresh in generation 2
        order = apply(order, decide(order, Replied(answer(request_of(order))), scheduler))
    verify = request_of(order)
    assert (verify.step, verify.idempotency_key) == ("verify_address", "o-1:verify_address:do:1")
    assert [r.first for r in order.step("verify_address").requests or ()] == [3, verify.attempt]
    after = apply(order, decide(order, Replied(answer(verify)), scheduler))
    assert after.current_step == "create_shipment"


def recorded_before_requests(order: Order) -> Order:
    """``order`` as read from a row written before steps recorded their requests."""
    entity = order_entity(replace(order, etag="e"))
    steps = json.loads(entity["Steps"])
    for step in steps:
        del step["requests"]
    entity["Steps"] = json.dumps(steps)
    return order_from_entity(entity, "e")


def test_a_row_written_before_requests_were_recorded_loads_and_keeps_what_it_proves():
    processed = recorded_before_requests(after_steps(3))
    assert [s.requests for s in processed.steps] == [None] * 3
    refusal(decide(processed, Replied(undo_answer(processed, "charge_payment", 2)), ctx(9)))
    in_flight = recorded_before_requests(new_order())
    first = request_of(in_flight)
    refusal(decide(in_flight, Replied(answer(first).model_copy(update={"attempt": 2})), ctx(1)))
    released = apply(in_flight, decide(in_flight, Replied(answer(first, "transient")), ctx(1)))
    late = decide(released, Replied(answer(first)), ctx(2))
    assert late.order is not None and late.order.current_step == "charge_payment"
    assert late.order.step("reserve_inventory").requests is None  # still not known
    assert late.order.step("charge_payment").requests == (Requests("do", 2, 2),)


# ------------------------------------------------------------- ended: settling and settled


def incomplete_compensation() -> Order:
    """An Error order whose undo of reserve_inventory failed transiently (attempts 3 to 5) until
    its compensation budget was spent: the reservation may still be in place, and any of those
    undos may still answer."""
    order = undoing()
    for at in (3, 60, BUDGET.total_seconds() + 3):
        order, _ = undo_fails(order, at)
        if order.state.in_flight:
            command = order.outbox[-1].message
            order = apply(order, decide(order, RetryDue(command), budgeted(at + 30)))  # type: ignore[arg-type]
    assert order.state is ProcessState.ERROR
    return order


def test_an_error_order_with_an_undo_unanswered_ends_settling_and_says_so():
    order = new_order()
    order = apply(order, decide(order, Replied(answer(request_of(order))), ctx(1)))
    charge = request_of(order)
    order = apply(order, decide(order, Replied(answer(charge, "declined")), ctx(2)))
    undo = request_of(order)
    ended = decide(order, Replied(answer(undo, "failed", error_code="refund_refused")), ctx(3))
    assert ended.order is not None and ended.entry is not None
    assert ended.order.settling
    assert [s.name for s in ended.order.open_steps] == ["reserve_inventory"]
    assert ended.entry.event == "error"
    assert ended.entry.detail.endswith("; settling: an answer may still change reserve_inventory")
    assert "settling" not in (ended.order.last_error or "")  # the alert and status say the end


def test_a_fully_compensated_error_order_ends_settled():
    order = after_steps(1)
    order = apply(order, decide(order, Replied(answer(request_of(order), "declined")), ctx(2)))
    decision = decide(order, Replied(answer(request_of(order))), ctx(3))
    assert decision.order is not None and decision.entry is not None
    assert decision.order.state is ProcessState.ERROR and not decision.order.settling
    assert "settling" not in decision.entry.detail
    again = decide(decision.order, Replied(answer(request_of(order))), ctx(4))
    assert again.order is None and again.send == ()  # an answer again: nothing to write


def test_an_answer_that_leaves_nothing_open_settles_the_ended_order():
    order = incomplete_compensation()
    first_undo = AgentResponse(
        order_id="o-1",
        step="reserve_inventory",
        operation="undo",
        attempt=3,
        idempotency_key="o-1:reserve_inventory:undo:1",
        outcome="succeeded",
        responded_at=T0,
    )
    decision = decide(order, Replied(first_undo), ctx(60))
    after, entry = decision.order, decision.entry
    assert after is not None and entry is not None
    assert (entry.event, entry.from_state, entry.to_state) == (
        "settled",
        ProcessState.ERROR,
        ProcessState.ERROR,
    )
    assert entry.detail == "reserve_inventory: Compensated (after the end; nothing is open now)"
    assert after.step("reserve_inventory").state is StepState.COMPENSATED
    assert not after.settling and decision.send == () and not decision.finished


def test_while_steps_stay_open_each_answer_after_the_end_is_a_settling_row():
    flow = ORDER_WORKFLOW_V2  # verify_address has no undo: nothing undoes it if it hangs
    scheduler = v2(1, actor="scheduler:a")
    order = submit(new_order_submitted(), scheduler).order
    assert order is not None
    for _ in range(2):
        order = apply(order, decide(order, Replied(answer(request_of(order))), scheduler))
    verify = request_of(order)
    for n in range(flow.failure_threshold):  # verify_address times out at the threshold
        order = apply(order, decide(order, Replied(answer(verify, "transient")), v2(2 + n)))
        if order.state.in_flight and order.locked_by is None:
            command = order.outbox[-1].message
            order = apply(order, decide(order, RetryDue(command), v2(20 + n)))  # type: ignore[arg-type]
            verify = request_of(order)
    void = request_of(order)
    assert (void.step, void.operation) == ("charge_payment", "undo")
    refused = answer(void, "failed", error_code="void_refused")
    order = apply(order, decide(order, Replied(refused), scheduler))
    assert order.state is ProcessState.ERROR
    assert [s.name for s in order.open_steps] == ["charge_payment", "verify_address"]

    landed = decide(order, Replied(answer(verify)), v2(90))
    assert landed.order is not None and landed.entry is not None
    assert landed.entry.event == "settling"
    assert landed.entry.detail.endswith("(after the end; open: charge_payment)")
    assert landed.order.step("verify_address").state is StepState.SUCCEEDED
    voided = decide(landed.order, Replied(answer(void)), v2(91))
    assert voided.entry is not None and voided.entry.event == "settled"
    assert voided.order is not None and not voided.order.settling


def test_a_processed_order_is_settled_and_no_answer_writes_to_it():
    processed = after_steps(3)
    assert processed.state is ProcessState.PROCESSED and not processed.settling
    assert not transition_allowed(ProcessState.PROCESSED, ProcessState.PROCESSED)
    again = answer(request_of(new_order()))  # reserve_inventory succeeded, heard again
    assert decide(processed, Replied(again), ctx(9)).order is None


# ------------------------------------------------------------------------- retries, sweeps


def test_a_stale_retry_command_changes_nothing():
    order = new_order()
    command = SchedulerCommand(
        order_id="o-1", command="retry", attempt=0, failure_count=0, reason="x", requested_by="s:a"
    )
    assert decide(order, RetryDue(command), ctx(1)).order is None


def test_the_supervisor_leaves_an_order_within_its_deadline_alone():
    assert decide(new_order(), Swept(), ctx(29)).order is None


def test_the_supervisor_releases_an_order_past_its_deadline():
    deadline = FLOW.first_step.deadline_budget.total_seconds()
    early = decide(new_order(), Swept(), ctx(deadline - 1, actor="supervisor:s"))
    assert early.order is None and early.note == "in flight, within its deadline"
    after = decide(new_order(), Swept(), ctx(deadline + 1, actor="supervisor:s")).order
    assert after is not None and after.state is ProcessState.PENDING
    assert after.failure_count == 1 and "passed CompleteBy" in (after.last_error or "")
    # The statuses of the write that dispatched are carried along: they may never have left.
    assert [type(o.message).__name__ for o in after.outbox] == [
        "StatusUpdate",
        "StatusUpdate",
        "SchedulerCommand",
    ]


def test_the_supervisor_resends_what_a_finished_order_owes_after_a_grace():
    order = new_order()
    done = apply(order, decide(order, Replied(answer(request_of(order), "declined")), ctx(1)))
    assert decide(done, Swept(), ctx(2)).send == ()
    flushed = decide(done, Swept(), ctx(60))
    assert flushed.order is None and flushed.finished and flushed.send == done.outbox


# ------------------------------------------------------------------ order@2 examples


def v2_order_declined_at_shipment() -> Order:
    """An order@2 in Error: the shipment was declined, the charge voided and the reservation
    released; verify_address (no undo) keeps its result."""
    scheduler = v2(0, actor="scheduler:a")
    order = submit(new_order_submitted(), scheduler).order
    assert order is not None
    for _ in range(3):
        order = apply(order, decide(order, Replied(answer(request_of(order))), scheduler))
    order = apply(order, decide(order, Replied(answer(request_of(order), "declined")), scheduler))
    for _ in range(2):
        order = apply(order, decide(order, Replied(answer(request_of(order))), scheduler))
    assert order.state is ProcessState.ERROR
    assert [s.state for s in order.steps] == [
        StepState.COMPENSATED, StepState.COMPENSATED, StepState.SUCCEEDED, StepState.FAILED,
    ]  # fmt: skip
    return order


def v2(at: float, actor: str = "operator:ann") -> Context:
    return replace(ctx(at, actor=actor), workflow=ORDER_WORKFLOW_V2)


# --------------------------------------------------------------- status updates refused


GONE = "MessagingEntityNotFoundError: the queue is gone"


def refused(order: Order, sequence: int, at: float, sent: frozenset[str] = frozenset()) -> Order:
    decision = decide(order, RepliesRefused(sequence, GONE, sent), ctx(at, actor="status:a"))
    assert decision.order is not None and decision.entry is not None
    assert decision.entry.event == "replies_held" and not decision.finished
    assert decision.send == decision.order.outbox, "the shell skips what is held, sends the rest"
    return decision.order


def replies(order: Order) -> list[tuple[int, datetime | None]]:
    return [(o.message.sequence, o.not_before) for o in order.outbox if o.to == "reply"]  # type: ignore[attr-defined]


def test_a_refused_update_and_those_after_it_are_held_and_the_order_goes_on():
    order = new_order()  # owes received (0), step_started (1) and the first request
    received = frozenset({message_id_for(order.outbox[0].message)})
    held = refused(order, 1, at=2, sent=received)
    retry = T0 + timedelta(seconds=2) + REPLY_RETRY_FIRST
    assert replies(held) == [(1, retry)], "what went before is owed no longer"
    assert held.outbox[-1].message == request_of(order), "the request still goes, last"
    assert (held.state, held.locked_by, held.status_seq) == (
        order.state,
        order.locked_by,
        order.status_seq,
    )

    # The request's answer proves it was sent, not the held update: that stays, and the next
    # updates wait behind it, so they arrive in order.
    after = apply(held, decide(held, Replied(answer(request_of(held))), ctx(3)))
    assert replies(after) == [(1, retry), (2, retry), (3, retry)]

    # The first write after that time owes them again, before the next request.
    later = apply(after, decide(after, Replied(answer(request_of(after))), ctx(303)))
    assert replies(later) == [(n, None) for n in range(1, 6)]
    assert isinstance(later.outbox[-1].message, AgentRequest)


def test_an_answer_to_a_message_sent_while_updates_were_held_proves_nothing_of_them():
    order = new_order()
    held = refused(order, 0, at=0)
    deferred = Replied(answer(request_of(held), "deferred", retry_at=T0 + timedelta(seconds=7)))
    waiting = apply(held, decide(held, deferred, ctx(1)))  # its retry command left, not them
    (command,) = [o.message for o in waiting.outbox if isinstance(o.message, SchedulerCommand)]
    # Past their time, the Supervisor releases the order again: the first command is still
    # owed, so the updates are not owed again yet (that command's return would "prove" them).
    released = apply(waiting, decide(waiting, Swept(), ctx(400, actor="supervisor:s")))
    assert [at is not None for _, at in replies(released)] == [True, True]
    claimed = apply(released, decide(released, RetryDue(command), ctx(401)))
    assert replies(claimed) == [(0, None), (1, None), (2, None)], "owed before the new request"
    assert isinstance(claimed.outbox[-1].message, AgentRequest)


def test_held_updates_are_tried_again_later_the_longer_they_wait():
    order = new_order()  # its updates were made at T0
    for waited, delay in [
        (timedelta(seconds=60), REPLY_RETRY_FIRST),
        (timedelta(minutes=40), timedelta(minutes=40)),
        (timedelta(hours=5), REPLY_RETRY_MAX),
    ]:
        held = refused(order, 0, at=waited.total_seconds())
        assert {at for _, at in replies(held)} == {T0 + waited + delay}


def test_a_finished_order_s_held_updates_are_sent_again_by_the_supervisor_then_given_up():
    order = after_steps(3)
    assert order.state is ProcessState.PROCESSED
    held = refused(order, order.status_seq - 2, at=4)
    retry = T0 + timedelta(seconds=4) + REPLY_RETRY_FIRST
    assert replies(held) == [(6, retry), (7, retry)]
    assert due_at(held, DEFAULT_STALE_AFTER, DEFAULT_FLUSH_GRACE) == retry
    supervisor = "supervisor:s"

    waiting = decide(held, Swept(), ctx(60, actor=supervisor))
    assert (waiting.order, waiting.send, waiting.finished) == (None, (), False)

    resent = decide(held, Swept(), ctx(4 + 300, actor=supervisor))
    assert resent.order is not None and resent.entry is not None
    assert resent.entry.event == "replies_resent" and resent.finished
    assert replies(resent.order) == [(6, None), (7, None)]
    assert resent.send == resent.order.outbox

    # Refused again and again: given up once they have waited a day, saying so.
    last = refused(order, 6, at=REPLY_HOLD_LIMIT.total_seconds())
    dropped = decide(last, Swept(), ctx(REPLY_HOLD_LIMIT.total_seconds() + 3600, actor=supervisor))
    assert dropped.order is not None and dropped.entry is not None
    assert dropped.entry.event == "replies_dropped" and "given up" in dropped.entry.detail
    assert dropped.finished and dropped.send == () and replies(dropped.order) == []


def test_a_settled_error_order_holds_and_resends_its_updates_and_changes_no_other_way():
    order = after_steps(1)
    order = apply(order, decide(order, Replied(answer(request_of(order), "declined")), ctx(2)))
    ended = apply(order, decide(order, Replied(answer(request_of(order))), ctx(3)))
    assert ended.state is ProcessState.ERROR and not ended.settling  # all undone: settled
    held = refused(ended, ended.status_seq - 1, at=4)
    unchanged = {"outbox": ended.outbox, "updated_at": ended.updated_at}
    assert replace(held, **unchanged, timeline_seq=ended.timeline_seq) == ended
    resent = decide(held, Swept(), ctx(4 + 300, actor="supervisor:s"))
    assert resent.order is not None and resent.entry is not None
    assert (resent.entry.event, resent.entry.from_state, resent.entry.to_state) == (
        "replies_resent",
        ProcessState.ERROR,
        ProcessState.ERROR,
    )
    assert replace(resent.order, **unchanged, timeline_seq=ended.timeline_seq) == ended
