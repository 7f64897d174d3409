"""Operators' actions on an order, one example each: pure decisions, no I/O
(:mod:`domain.operator_actions`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from domain.events import Context, Replied
from domain.lifecycle import decide
from domain.messages import OperatorAlert
from domain.operator_actions import Cancel, Migrate, Refused, Restart, Resubmit, act
from domain.order import StepState
from domain.states import ProcessState
from domain.workflows import ORDER_WORKFLOW, ORDER_WORKFLOW_V2, SINGLE_STEP_WORKFLOW
from tests.unit.test_lifecycle import (
    T0,
    after_steps,
    answer,
    apply,
    ctx,
    kinds,
    new_order,
    request_of,
    undo_fails,
    undoing,
    v2,
    v2_order_declined_at_shipment,
)


def test_cancel_acts_at_once_and_undoes_the_step_in_flight():
    order = after_steps(1)
    after = act(order, Cancel("operator:bob", "fraud"), ctx(3)).order
    assert after is not None and after.state is ProcessState.COMPENSATING
    assert request_of(after).undoes == "o-1:charge_payment:do:1"


@pytest.mark.parametrize("state", [ProcessState.PROCESSED, ProcessState.ERROR])
def test_cancel_of_a_finished_order_is_refused(state):
    order = replace(new_order(), state=state)
    with pytest.raises(Refused, match="only orders in flight"):
        act(order, Cancel("operator:bob", "x"), ctx(1))


def test_resubmit_after_a_full_compensation_starts_over_with_new_keys():
    order = new_order()
    errored = apply(order, decide(order, Replied(answer(request_of(order), "declined")), ctx(1)))
    again = act(errored, Resubmit("operator:bob", "fixed", outbox_delivered=True), ctx(9))
    after = again.order
    assert after is not None and after.generation == 2
    assert request_of(after).idempotency_key == "o-1:reserve_inventory:do:2"
    assert not [o for o in again.send if isinstance(o.message, OperatorAlert)]


def test_resubmit_resends_an_alert_that_was_never_delivered():
    order = new_order()
    errored = apply(order, decide(order, Replied(answer(request_of(order), "declined")), ctx(1)))
    again = act(errored, Resubmit("operator:bob", "fixed", outbox_delivered=False), ctx(9))
    assert [o.message.reason for o in again.send if isinstance(o.message, OperatorAlert)] == [
        "step_declined"
    ]


def test_resubmit_of_an_order_in_flight_is_refused():
    with pytest.raises(Refused, match="only Error orders"):
        act(new_order(), Resubmit("operator:bob", "x", outbox_delivered=True), ctx(1))


def test_restart_redoes_the_named_step_and_later_ones_even_a_kept_result():
    errored = v2_order_declined_at_shipment()
    restart = Restart("operator:ann", "address fixed", "verify_address", outbox_delivered=True)
    decision = act(errored, restart, v2(9))
    after = decision.order
    assert after is not None and decision.entry is not None
    assert (decision.entry.event, decision.entry.actor) == ("restarted", "operator:ann")
    assert decision.entry.detail == (
        "address fixed; restart from verify_address: redo verify_address, create_shipment; "
        "resumes at reserve_inventory"
    )
    assert after.state is ProcessState.PROCESSING and after.generation == 2
    assert [s.state for s in after.steps] == [StepState.RUNNING] + [StepState.PENDING] * 3
    assert request_of(after).idempotency_key == "o-1:reserve_inventory:do:2"
    # A resubmit keeps verify_address's result instead:
    resubmitted = act(errored, Resubmit("operator:ann", "x", outbox_delivered=True), v2(9))
    assert resubmitted.order is not None
    assert resubmitted.order.step("verify_address").state is StepState.SUCCEEDED
    assert "kept: verify_address" in resubmitted.entry.detail  # type: ignore[union-attr]


def test_restart_keeps_succeeded_steps_before_the_named_one():
    errored = v2_order_declined_at_shipment()
    decision = act(errored, Restart("operator:ann", "retry", "create_shipment", True), v2(9))
    after = decision.order
    assert after is not None
    assert after.step("verify_address").state is StepState.SUCCEEDED
    assert after.current_step == "reserve_inventory"  # undone before: redone first
    assert decision.entry is not None and decision.entry.detail.endswith("kept: verify_address")


def test_restart_from_the_first_step_redoes_everything():
    order = new_order()
    errored = apply(order, decide(order, Replied(answer(request_of(order), "declined")), ctx(1)))
    decision = act(errored, Restart("operator:bob", "r", "reserve_inventory", False), ctx(9))
    assert decision.order is not None and decision.order.generation == 2
    assert request_of(decision.order).idempotency_key == "o-1:reserve_inventory:do:2"
    # The alert was never known delivered: it is sent again, once.
    assert kinds(decision).count("OperatorAlert") == 1


def test_restart_from_a_step_the_workflow_lacks_is_refused_naming_its_steps():
    order = new_order()
    errored = apply(order, decide(order, Replied(answer(request_of(order), "declined")), ctx(1)))
    with pytest.raises(Refused, match="has no step 'teleport'") as refused:
        act(errored, Restart("operator:bob", "r", "teleport", True), ctx(9))
    assert refused.value.code == "invalid"
    assert "reserve_inventory, charge_payment, create_shipment" in refused.value.message


def test_restart_of_an_order_not_in_error_is_refused():
    with pytest.raises(Refused, match="only Error orders can be restarted") as refused:
        act(new_order(), Restart("operator:bob", "r", "charge_payment", True), ctx(1))
    assert refused.value.code == "conflict"


def test_restart_of_an_incomplete_compensation_is_refused():
    order, _ = undo_fails(undoing(), 3, "declined")  # the release refused: left in place
    assert order.state is ProcessState.ERROR
    with pytest.raises(Refused, match="still has undos left"):
        act(order, Restart("operator:bob", "r", "reserve_inventory", True), ctx(99))


# ------------------------------------------------------------------------------ migration


def test_an_order_at_a_step_the_new_version_keeps_moves_and_goes_on_by_it():
    order = new_order()  # at reserve_inventory, which order@2 keeps as its first step
    decision = act(order, Migrate(ORDER_WORKFLOW_V2, "operator:ann", "switch"), ctx(1))
    moved = decision.order
    assert moved is not None and decision.entry is not None
    assert decision.entry.event == "migrated"
    assert "order@1 -> order@2 by operator:ann" in decision.entry.detail
    assert moved.workflow == "order@2"
    assert [s.name for s in moved.steps] == list(ORDER_WORKFLOW_V2.step_names)
    assert moved.steps[0] == order.steps[0]  # what it did and has in flight is kept
    assert moved.outbox == order.outbox and moved.locked_by == order.locked_by
    v2 = Context(workflow=ORDER_WORKFLOW_V2, now=T0 + timedelta(seconds=2), actor="scheduler:a")
    after = apply(moved, decide(moved, Replied(answer(request_of(moved))), v2))
    assert after.current_step == "charge_payment"
    charge = request_of(after)
    assert charge.step == "charge_payment"
    # ... and the charge is undone by a void now: version 2's definition decides.
    declined = apply(after, decide(after, Replied(answer(charge, "declined")), v2))
    assert declined.state is ProcessState.COMPENSATING


def test_an_order_past_a_step_the_new_version_changed_is_refused_and_unchanged():
    order = new_order()
    charged = apply(order, decide(order, Replied(answer(request_of(order))), ctx(1)))
    assert charged.current_step == "charge_payment"  # order@2 undoes it by a void, not a refund
    with pytest.raises(Refused, match="does not keep order@1's step charge_payment"):
        act(charged, Migrate(ORDER_WORKFLOW_V2, "operator:ann", "switch"), ctx(2))


def test_only_orders_moving_forward_on_another_version_of_their_workflow_migrate():
    order = new_order()
    with pytest.raises(Refused, match="order@1 already"):
        act(order, Migrate(ORDER_WORKFLOW, "operator:ann", "x"), ctx(1))
    with pytest.raises(Refused, match="another workflow"):
        act(order, Migrate(SINGLE_STEP_WORKFLOW, "operator:ann", "x"), ctx(1))
    cancelled = apply(order, act(order, Cancel("operator:ann", "x"), ctx(1)))
    with pytest.raises(Refused, match="only orders moving forward"):
        act(cancelled, Migrate(ORDER_WORKFLOW_V2, "operator:ann", "x"), ctx(2))
