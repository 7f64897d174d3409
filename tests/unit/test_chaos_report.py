"""What the chaos run reports about whose failure each failed attempt was (benchmarks.chaos),
from orders' step records: pure, no stack."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from benchmarks.chaos import all_at_service, failed_attempts, threshold_failures
from domain.events import Context
from domain.lifecycle import submit
from domain.messages import OrderSubmitted
from domain.order import NO_FAILURES, Failures, Order, StepState
from domain.workflows import ORDER_WORKFLOW

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def order(n: int, **changes: object) -> Order:
    submitted = OrderSubmitted(
        order_id=f"o-{n}",
        customer_id="c-1",
        items=[{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 100}],
        currency="EUR",
    )
    made = submit(submitted, Context(workflow=ORDER_WORKFLOW, now=T0, actor="scheduler:a")).order
    assert made is not None
    return replace(made, **changes)  # type: ignore[arg-type]


def failed_at(
    o: Order, step: str, state: StepState, failures: Failures, undo: Failures = NO_FAILURES
) -> Order:
    record = o.step(step)
    return o.with_record(
        replace(record, state=state, forward_failures=failures, undo_failures=undo)
    )


def test_failed_attempts_are_summed_by_direction_and_whose_failure():
    first = failed_at(
        order(1),
        "reserve_inventory",
        StepState.SUCCEEDED,
        Failures(at_service=2, on_our_side=1),
        Failures(unanswered=(7, 9)),
    )
    second = failed_at(order(2), "charge_payment", StepState.RUNNING, Failures(unanswered=(4,)))
    assert failed_attempts([first, second, order(3)]) == {
        "forward": {"at_service": 2, "on_our_side": 1, "unanswered": 1},
        "undo": {"at_service": 0, "on_our_side": 0, "unanswered": 2},
    }


def test_orders_failed_at_the_threshold_are_split_by_their_failing_step():
    def threshold(n: int, failures: Failures) -> Order:
        o = order(n, compensation_cause="failure_threshold")
        reserved = o.step("reserve_inventory")
        o = o.with_record(replace(reserved, state=StepState.COMPENSATED))  # succeeded, undone
        return failed_at(o, "charge_payment", StepState.VOIDED, failures)

    orders = [
        threshold(1, Failures(at_service=3)),
        threshold(2, Failures(at_service=1, on_our_side=2)),
        threshold(3, Failures(at_service=1, unanswered=(5, 6))),
        order(4, compensation_cause="step_declined"),
    ]
    assert threshold_failures(orders) == {
        "total": 3,
        "all_at_service": 1,
        "any_on_our_side": 1,
        "unknown": 1,
    }


def test_only_a_failure_not_the_services_own_makes_a_landed_call_a_wrong_failure():
    """A step that failed at the threshold although its call landed is a failure we counted
    wrongly unless every failed attempt was the service's own (it timed out each time)."""
    assert all_at_service(Failures(at_service=3))
    assert not all_at_service(Failures(at_service=2, on_our_side=1))
    assert not all_at_service(Failures(at_service=2, unanswered=(3,)))
    assert not all_at_service(NO_FAILURES), "a step that never failed did not fail at the service"
