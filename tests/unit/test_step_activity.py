"""What each step went through, read from the timeline the lifecycle writes (pure)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from domain.events import Context, Replied, RetryDue, Swept
from domain.lifecycle import decide, submit
from domain.messages import (
    EXPIRED,
    AgentRequest,
    AgentResponse,
    OrderSubmitted,
    SchedulerCommand,
)
from domain.operator_actions import Action, Restart, act
from domain.order import Order, TimelineEntry
from domain.workflows import ORDER_WORKFLOW
from service.operations.step_activity import MAX_REASONS, step_activity

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> Context:
    return Context(workflow=ORDER_WORKFLOW, now=T0 + timedelta(seconds=seconds), actor="s:a")


class Run:
    """An order driven through the lifecycle, its timeline kept."""

    def __init__(self) -> None:
        submitted = OrderSubmitted(
            order_id="o-1",
            customer_id="c-1",
            items=[{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 100}],
            currency="EUR",
        )
        decision = submit(submitted, at(0))
        assert decision.order is not None and decision.entry is not None
        self.order: Order = decision.order
        self.timeline: list[TimelineEntry] = [decision.entry]

    def event(self, event, seconds: float) -> None:
        if isinstance(event, Action):
            decision = act(self.order, event, at(seconds))
        else:
            decision = decide(self.order, event, at(seconds))
        assert decision.order is not None and decision.entry is not None, decision.note
        self.order = decision.order
        self.timeline.append(decision.entry)

    def reply(self, seconds: float, outcome: str = "succeeded", **fields) -> None:
        [request] = [o.message for o in self.order.outbox if isinstance(o.message, AgentRequest)]
        if outcome == "transient":
            fields = {"outcome": "failed", "transient": True, "error_code": "unavailable"}
        elif outcome == "declined":
            fields = {"outcome": "failed", "error_code": "card_declined"}
        else:
            fields = {"outcome": outcome, **fields}
        response = AgentResponse(
            order_id="o-1",
            step=request.step,
            operation=request.operation,
            attempt=request.attempt,
            idempotency_key=request.idempotency_key,
            responded_at=T0 + timedelta(seconds=seconds),
            **fields,
        )
        self.event(Replied(response), seconds)

    def retry(self, seconds: float) -> None:
        command = self.order.outbox[-1].message
        assert isinstance(command, SchedulerCommand)
        self.event(RetryDue(command), seconds)

    def activity(self, seconds: float):
        return step_activity(self.order.steps, self.timeline, T0 + timedelta(seconds=seconds))


def test_each_step_has_its_start_duration_requests_and_failures():
    run = Run()
    run.reply(2)  # reserve_inventory succeeded after 2 s
    run.reply(3, "transient")  # charge_payment failed once...
    run.retry(8)
    run.reply(9)  # ...then succeeded
    activity = run.activity(60)
    reserve, charge, ship = (activity[s] for s in ORDER_WORKFLOW.step_names)
    assert (reserve.started_at, reserve.duration_s, reserve.requests) == (T0, 2.0, 1)
    assert reserve.failures == 0 and reserve.reasons == ()
    assert charge.started_at == T0 + timedelta(seconds=2)
    assert (charge.duration_s, charge.requests, charge.failures) == (7.0, 2, 1)
    assert len(charge.reasons) == 1 and "unavailable" in charge.reasons[0]
    assert ship.started_at == T0 + timedelta(seconds=9)
    assert (ship.duration_s, ship.requests) == (51.0, 1), "running: counted up to now"


def test_a_declined_step_ends_at_its_answer_and_untouched_steps_have_no_activity():
    run = Run()
    run.reply(4, "declined")
    activity = run.activity(60)
    assert activity["reserve_inventory"].duration_s == 4.0
    assert activity["charge_payment"].started_at is None
    assert activity["charge_payment"].duration_s is None


def test_an_open_circuit_is_a_deferral_not_a_failure():
    run = Run()
    run.reply(1, "deferred", retry_at=T0 + timedelta(seconds=30))
    reserve = run.activity(5)["reserve_inventory"]
    assert (reserve.failures, reserve.deferrals) == (0, 1)
    assert "circuit open" in reserve.reasons[0]


def test_a_restart_starts_the_redone_steps_afresh_and_keeps_their_history():
    run = Run()
    run.reply(1, "transient")
    run.retry(5)
    run.reply(6, "declined")  # Error: reserve_inventory refused, nothing to undo
    run.event(Restart("operator:ann", "r", "reserve_inventory", True), 100)
    reserve = run.activity(103)["reserve_inventory"]
    assert reserve.started_at == T0 + timedelta(seconds=100)
    assert (reserve.requests, reserve.duration_s) == (1, 3.0)
    assert reserve.failures == 1, "failures of earlier runs stay counted"


def test_only_the_latest_reasons_are_kept():
    run = Run()
    entries = [
        replace(run.timeline[0], seq=n, event="released", detail=f"failure {n}", attempt=1)
        for n in range(1, MAX_REASONS + 5)
    ]
    reserve = step_activity(run.order.steps, run.timeline + entries, T0)["reserve_inventory"]
    assert reserve.failures == MAX_REASONS + 4
    assert reserve.reasons == tuple(f"failure {n}" for n in range(5, MAX_REASONS + 5))


def test_an_answer_recorded_after_the_order_ended_is_a_reason_of_its_step():
    run = Run()
    run.reply(1)
    run.reply(2, "declined")  # compensating: reserve_inventory is released
    [undo] = [o.message for o in run.order.outbox if isinstance(o.message, AgentRequest)]
    run.reply(3, "failed", error_code="release_refused")  # Error, settling
    late = AgentResponse(
        order_id="o-1",
        step=undo.step,
        operation=undo.operation,
        attempt=undo.attempt,
        idempotency_key=undo.idempotency_key,
        outcome="succeeded",
        responded_at=T0 + timedelta(seconds=50),
    )
    run.event(Replied(late), 50)
    assert run.timeline[-1].event == "settled"
    reserve = run.activity(60)["reserve_inventory"]
    assert reserve.reasons[-1] == (
        "reserve_inventory: Compensated (after the end; nothing is open now)"
    )


def test_a_late_answer_that_says_whose_failure_it_was_is_one_of_the_reasons():
    run = Run()
    [first] = [o.message for o in run.order.outbox if isinstance(o.message, AgentRequest)]
    deadline = ORDER_WORKFLOW.first_step.deadline_budget.total_seconds()
    run.event(Swept(), deadline + 1)  # no answer: released past CompleteBy
    run.retry(deadline + 10)
    expired = AgentResponse(
        order_id="o-1",
        step=first.step,
        operation="do",
        attempt=first.attempt,
        idempotency_key=first.idempotency_key,
        outcome="failed",
        transient=True,
        error_code=EXPIRED,
    )
    run.event(Replied(expired), deadline + 11)
    reserve = run.activity(deadline + 12)["reserve_inventory"]
    assert reserve.failures == 1, "the late answer is not another failure"
    assert "never left our side" in reserve.reasons[-1]
