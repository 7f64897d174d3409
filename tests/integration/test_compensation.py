"""Compensation, extended-wait retries, cancel and resubmit, staged message by message against
real Azurite, the development broker and the fake remote services (see test_pattern_steps; the
cancel of a step whose call lands after its undo is in test_lifecycle_guarantees)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from adapters.op_counts import COUNTS
from domain.messages import encode
from domain.order import StepState
from domain.states import ProcessState
from service import control
from service.agent import handle_request
from service.commands import handle_command
from service.intake import handle_submission
from service.listing import list_orders
from service.replies import handle_response
from service.sweep import run_tick
from tests.support.app import UNHURRIED_TICK_S, make_runtime
from tests.support.pattern import (
    alerts_for,
    effects,
    net_effects,
    new_order,
    queue,
    run_agent_step,
    run_command,
    take_request,
    tombstoned,
)

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


async def step_states(rt, order_id: str) -> dict[str, StepState]:
    return {s.name: s.state for s in (await rt.store.get_order(order_id)).steps}


async def events(rt, order_id: str) -> list[str]:
    return [t.event for t in await rt.store.get_timeline(order_id)]


def undid(last_error: str | None) -> set[str]:
    """The steps a compensated order's last error says were undone."""
    summary = (last_error or "").rpartition("; compensated: undid ")[2]
    return set(summary.partition(";")[0].split(", "))


async def test_decline_at_step_3_undoes_steps_2_and_1_in_reverse(rt, reader, fakes):
    order = new_order()
    fakes.set_profile({"services": {"shipping": {"decline_order_ids": [order.order_id]}}})
    COUNTS.reset()
    await handle_submission(encode(order), rt)
    await run_agent_step(rt, reader, order.order_id, "inventory")
    await run_agent_step(rt, reader, order.order_id, "payment")
    await run_agent_step(rt, reader, order.order_id, "shipping")  # declined: address_invalid
    counts = Counter(COUNTS.snapshot())

    process = await rt.store.load(order.order_id)
    assert (process.state, process.current_operation) == (ProcessState.COMPENSATING, "undo")
    assert await step_states(rt, order.order_id) == {
        "reserve_inventory": StepState.SUCCEEDED,
        "charge_payment": StepState.SUCCEEDED,
        "create_shipment": StepState.FAILED,
    }
    COUNTS.reset()  # the reads above are the test's, not the app's
    refund = await run_agent_step(rt, reader, order.order_id, "payment")
    release = await run_agent_step(rt, reader, order.order_id, "inventory")
    counts.update(COUNTS.snapshot())

    assert (refund["action"], refund["idempotency_key"], refund["undoes"]) == (
        "refund",
        f"{order.order_id}:charge_payment:undo:1",
        f"{order.order_id}:charge_payment:do:1",
    )
    assert (release["action"], release["idempotency_key"], release["undoes"]) == (
        "release",
        f"{order.order_id}:reserve_inventory:undo:1",
        f"{order.order_id}:reserve_inventory:do:1",
    )
    process = await rt.store.load(order.order_id)
    assert process.state is ProcessState.ERROR and process.locked_by is None
    assert (process.last_error or "").startswith("create_shipment declined: address_invalid")
    assert undid(process.last_error) == {"charge_payment", "reserve_inventory"}
    assert await step_states(rt, order.order_id) == {
        "reserve_inventory": StepState.COMPENSATED,
        "charge_payment": StepState.COMPENSATED,
        "create_shipment": StepState.FAILED,
    }
    assert [op for _, op, _ in effects(fakes, order.order_id)] == [
        "reserve",
        "charge",
        "refund",
        "release",
    ]
    assert net_effects(fakes, order.order_id) == {"inventory": 0, "payment": 0}
    alerts = alerts_for(rt, reader, order.order_id)
    assert [(a["reason"], a["severity"]) for a in alerts] == [("step_declined", "error")]
    assert "compensated" in alerts[0]["detail"]
    timeline = await events(rt, order.order_id)
    assert timeline[-3:] == ["compensation_started", "step_compensated", "error"]
    assert order.order_id not in [r.order_id for r in (await rt.store.list_active()).rows]
    errors = await list_orders(rt.store, ProcessState.ERROR, limit=100)
    assert order.order_id in [p.order_id for p in errors.orders]
    # Every request of the compensated order, app side (scheduler + agents), counted at the SDK
    # pipeline (Table) and at Bus.send (Service Bus): 5 agent requests, 5 replies, 1 alert;
    # one batch per reply, one batch creating the order (already dispatched), the active-index
    # row inserted at intake and deleted at the end, the Error-index insert. Replies carry the
    # order's snapshot (service.resume) and need no read, but for the one entering Error: its
    # Error-index row is written before the order, so it decides on a read (service.apply).
    print("compensated order operations:", json.dumps(dict(sorted(counts.items()))))
    assert counts["servicebus.send"] == 11
    assert (counts["table.get"], counts["table.post"]) == (1, 1 + 1 + 5 + 1)
    assert (counts.get("table.put", 0), counts["table.delete"]) == (0, 1)


async def test_unanswered_undos_are_retried_past_the_threshold_until_the_budget_is_spent(
    env, reader, fakes, clock
):
    """The release is never answered: retried past the failure threshold (3) with growing
    delays, one warning once it has gone on for COMPENSATION_WARN_AFTER_SECONDS, and given up
    only when COMPENSATION_BUDGET_SECONDS are spent: Error, the reservation left in place."""
    env |= {"COMPENSATION_BUDGET_SECONDS": "200", "COMPENSATION_WARN_AFTER_SECONDS": "100"}
    rt = await make_runtime(env, "scheduler", clock)
    try:
        clock.advance(60)  # retries fall due in the (real) future: take_scheduled finds them
        order = new_order()
        oid = order.order_id
        fakes.set_profile({"services": {"payment": {"decline_order_ids": [oid]}}})
        await handle_submission(encode(order), rt)
        await run_agent_step(rt, reader, oid, "inventory")
        await run_agent_step(rt, reader, oid, "payment")  # declined: release the reservation

        delays = []
        for failures in range(1, 7):  # 6 x 30 s: within the 200 s budget
            release = take_request(rt, reader, oid, "inventory")  # its agent dies: no answer
            assert release["idempotency_key"] == f"{oid}:reserve_inventory:undo:1"
            clock.advance(30)  # past CompleteBy
            assert (await run_tick(rt, budget_s=UNHURRIED_TICK_S)).retried == 1
            released = await rt.store.load(oid)
            assert (released.state, released.locked_by) == (ProcessState.COMPENSATING, None)
            assert released.failure_count == failures
            command, due = reader.take_scheduled(queue(rt, "commands"), oid)
            assert abs((due - released.next_attempt_at).total_seconds()) < 0.002
            delays.append((released.next_attempt_at - released.updated_at).total_seconds())
            await handle_command(command, rt)  # claims the undo again
        alerts = alerts_for(rt, reader, oid)
        assert [(a["reason"], a["severity"]) for a in alerts] == [
            ("compensation_delayed", "warning")
        ]
        assert (
            "failed 4 times: 0 at the service, 0 on our side, 4 unanswered" in alerts[0]["detail"]
        )
        take_request(rt, reader, oid, "inventory")  # unanswered again, now past the budget
        clock.advance(30)
        assert (await run_tick(rt, budget_s=UNHURRIED_TICK_S)).failed == 1

        # base 1 s, factor 2, cap 4 s, up to 20 % jitter below: 1, 2, 4, 4, 4, 4
        for delay, nominal in zip(delays, (1, 2, 4, 4, 4, 4), strict=True):
            assert 0.8 * nominal - 0.01 <= delay <= nominal + 0.01, delays
        process = await rt.store.load(oid)
        assert process.state is ProcessState.ERROR
        assert (process.last_error or "").startswith("compensation incomplete")
        assert "compensation budget of 200s spent" in (process.last_error or "")
        failures = process.step("reserve_inventory").undo_failures
        assert (failures.at_service, failures.on_our_side, len(failures.unanswered)) == (0, 0, 7)
        states = await step_states(rt, oid)
        assert states["reserve_inventory"] is StepState.SUCCEEDED, "left in place"
        alerts = alerts_for(rt, reader, oid)
        assert [(a["reason"], a["severity"]) for a in alerts] == [
            ("compensation_incomplete", "critical")
        ]
        assert "reserve_inventory (release at inventory)" in alerts[0]["detail"]
        assert net_effects(fakes, oid) == {"inventory": 1}, "the reservation is left"

        # An operator resubmits: the compensation resumes with the same undo key (and, entering
        # Error again, raises that entry's alert); a second resubmission starts over with new keys.
        fakes.set_profile(None)
        result = await control.resubmit(rt, oid, actor="operator:ann", reason="inventory back")
        assert result.outcome == "compensation_resumed"
        await run_command(rt, reader, oid)  # the pattern app sends what it wrote
        release = await run_agent_step(rt, reader, oid, "inventory")
        assert release["idempotency_key"] == f"{oid}:reserve_inventory:undo:1"
        process = await rt.store.load(oid)
        assert process.state is ProcessState.ERROR
        assert (process.last_error or "").startswith("charge_payment declined: card_declined")
        assert "compensated: undid reserve_inventory" in (process.last_error or "")
        assert net_effects(fakes, oid) == {"inventory": 0}
        assert [a["reason"] for a in alerts_for(rt, reader, oid)] == ["step_declined"]

        again = await control.resubmit(rt, oid, actor="operator:ann", reason="card fixed")
        await run_command(rt, reader, oid)
        assert (again.outcome, again.generation, again.step) == (
            "resubmitted",
            2,
            "reserve_inventory",
        )
        for service in ("inventory", "payment", "shipping"):
            request = await run_agent_step(rt, reader, oid, service)
            assert request["idempotency_key"].endswith(":do:2")
        assert (await rt.store.load(oid)).state is ProcessState.PROCESSED
        assert net_effects(fakes, oid) == {"inventory": 1, "payment": 1, "shipping": 1}
        resubmits = [t for t in await rt.store.get_timeline(oid) if t.actor == "operator:ann"]
        assert [t.event for t in resubmits] == ["compensation_resumed", "resubmitted"]
        assert alerts_for(rt, reader, oid) == []
    finally:
        await rt.close()


async def test_a_hang_backs_off_as_configured_then_compensates(env, reader, fakes, clock):
    env |= {"RETRY_BASE_DELAY_SECONDS": "2", "RETRY_MAX_DELAY_SECONDS": "5"}
    env["FAILURE_THRESHOLD"] = "5"
    rt = await make_runtime(env, "scheduler", clock)
    try:
        order = new_order()
        await handle_submission(encode(order), rt)
        await run_agent_step(rt, reader, order.order_id, "inventory")
        take_request(rt, reader, order.order_id, "payment")  # the charge hangs: no reply
        delays = []
        for failures in range(1, 5):
            clock.advance(30)  # past CompleteBy
            assert (await run_tick(rt, budget_s=UNHURRIED_TICK_S)).retried == 1
            released = await rt.store.load(order.order_id)
            command, due = reader.take_scheduled(queue(rt, "commands"), order.order_id)
            assert abs((due - released.next_attempt_at).total_seconds()) < 0.002
            assert json.loads(command)["failure_count"] == failures
            delays.append((released.next_attempt_at - released.updated_at).total_seconds())
            await handle_command(command, rt)
            take_request(rt, reader, order.order_id, "payment")  # hangs again
        # base 2 s, factor 2, cap 5 s, up to 20 % jitter below: 2, 4, 5, 5
        for delay, nominal in zip(delays, (2, 4, 5, 5), strict=True):
            assert 0.8 * nominal - 0.01 <= delay <= nominal + 0.01, delays
        assert delays[1] > delays[0]

        clock.advance(30)
        assert (
            await run_tick(rt, budget_s=UNHURRIED_TICK_S)
        ).compensating == 1  # 5th failure: undo the charge and reservation
        refund = await run_agent_step(rt, reader, order.order_id, "payment")
        assert refund["action"] == "refund"  # the hung charge may have taken effect
        await run_agent_step(rt, reader, order.order_id, "inventory")
        process = await rt.store.load(order.order_id)
        assert process.state is ProcessState.ERROR
        assert "failure threshold of 5" in (process.last_error or "")
        assert (await step_states(rt, order.order_id))["charge_payment"] is StepState.VOIDED
        alerts = alerts_for(rt, reader, order.order_id)
        assert [a["reason"] for a in alerts] == ["failure_threshold"]
        assert net_effects(fakes, order.order_id) == {"inventory": 0}
    finally:
        await rt.close()


async def test_cancel_while_step_2_is_in_flight_undoes_its_charge_that_lands_first(
    rt, reader, fakes
):
    order = new_order()
    oid = order.order_id
    await handle_submission(encode(order), rt)
    await run_agent_step(rt, reader, oid, "inventory")
    charge = reader.expect(queue(rt, "payment"), oid)  # step 2 in flight

    result = await control.cancel(rt, oid, actor="operator:bob", reason="customer asked")
    assert (result.outcome, result.state) == ("compensating", ProcessState.COMPENSATING)
    await run_command(rt, reader, oid)  # the pattern app sends what it wrote

    await handle_request(charge, "payment", rt)  # the charge goes through before its refund...
    await handle_response(reader.expect(queue(rt, "responses"), oid), rt)
    assert (await step_states(rt, oid))["charge_payment"] is StepState.SUCCEEDED, "recorded"
    assert (await events(rt, oid))[-1] == "late_success"
    assert reader.take(queue(rt, "shipping"), oid, wait=1) is None, "no step 3"
    refund = await run_agent_step(rt, reader, oid, "payment")  # ...and the refund undoes it
    assert refund["undoes"] == f"{oid}:charge_payment:do:1"
    await run_agent_step(rt, reader, oid, "inventory")

    process = await rt.store.load(oid)
    assert process.state is ProcessState.ERROR
    assert (process.last_error or "").startswith("cancelled by operator:bob: customer asked")
    assert undid(process.last_error) == {"charge_payment", "reserve_inventory"}
    assert net_effects(fakes, oid) == {"inventory": 0, "payment": 0}
    assert tombstoned(fakes, oid) == set()
    assert [a["reason"] for a in alerts_for(rt, reader, oid)] == ["cancelled"]
    cancelled = [t for t in await rt.store.get_timeline(oid) if t.actor == "operator:bob"]
    assert [t.event for t in cancelled] == ["compensation_started"]
    with pytest.raises(control.Refused) as refused:
        await control.cancel(rt, oid, actor="operator:bob", reason="late")
    assert refused.value.code == "conflict"


async def test_cancel_with_a_hung_step_compensates_without_waiting_for_its_deadline(
    rt, reader, fakes, clock
):
    order = new_order()
    oid = order.order_id
    await handle_submission(encode(order), rt)
    await run_agent_step(rt, reader, oid, "inventory")
    take_request(rt, reader, oid, "payment")  # never answers
    await control.cancel(rt, oid, actor="operator:bob", reason="stuck")
    await run_command(rt, reader, oid)  # the pattern app sends what it wrote
    await run_agent_step(
        rt, reader, oid, "payment"
    )  # refund of the unknown charge: nothing to undo
    await run_agent_step(rt, reader, oid, "inventory")
    process = await rt.store.load(oid)
    assert process.state is ProcessState.ERROR and "cancelled" in (process.last_error or "")
    assert net_effects(fakes, oid) == {"inventory": 0}
    assert tombstoned(fakes, oid) == {f"{oid}:charge_payment:do:1"}
    clock.advance(30)
    assert (await run_tick(rt)).due == 0, "nothing left for the Supervisor"
    assert [a["reason"] for a in alerts_for(rt, reader, oid)] == ["cancelled"]


async def test_a_cancel_command_is_not_the_pattern_apps_to_take(rt, reader):
    """Operators act through the operations app (service.control); a cancel on the commands
    queue is refused as a bad message, and the order is not changed."""
    order = new_order()
    await handle_submission(encode(order), rt)
    before = await rt.store.load(order.order_id)
    command = {
        "type": "SchedulerCommand", "order_id": order.order_id, "command": "cancel",
        "attempt": 1, "failure_count": 0, "reason": "r", "requested_by": "operator:bob",
    }  # fmt: skip
    await handle_command(json.dumps(command), rt)
    alerts = alerts_for(rt, reader, order.order_id)
    assert [a["reason"] for a in alerts] == ["bad_message"]
    assert "command: Input should be 'retry'" in alerts[0]["detail"]
    assert (await rt.store.load(order.order_id)).etag == before.etag


async def test_cancel_of_a_released_order_undoes_the_step_that_timed_out(rt, reader, fakes, clock):
    order = new_order()
    await handle_submission(encode(order), rt)
    take_request(rt, reader, order.order_id, "inventory")  # never answers
    clock.advance(30)
    assert (await run_tick(rt, budget_s=UNHURRIED_TICK_S)).retried == 1  # Pending, retry scheduled
    retry, _ = reader.take_scheduled(queue(rt, "commands"), order.order_id)

    result = await control.cancel(
        rt, order.order_id, actor="operator:bob", reason="duplicate order"
    )
    assert (result.outcome, result.state) == ("compensating", ProcessState.COMPENSATING)
    await run_command(rt, reader, order.order_id)  # the pattern app sends what it wrote
    release = await run_agent_step(rt, reader, order.order_id, "inventory")
    assert release["action"] == "release"  # the reservation may have been made
    await handle_command(retry, rt)  # the retry that was due is stale now: nothing happens
    assert reader.take(queue(rt, "inventory"), order.order_id, wait=1) is None
    process = await rt.store.load(order.order_id)
    assert process.state is ProcessState.ERROR
    assert process.last_error == (
        "cancelled by operator:bob: duplicate order; compensated: undid nothing; "
        "never took effect: reserve_inventory"
    )
    assert effects(fakes, order.order_id) == []
