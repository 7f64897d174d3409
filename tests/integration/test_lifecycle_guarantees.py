"""The lifecycle's guarantees, staged message by message, each scenario written once and run over
both adapter sets: the in-memory store and bus (``devstack.memory``) and the real ones (Azurite, the
development broker), with the real handlers and the fake remote services over HTTP behind the
agents (see tests/support/pattern.py, :class:`Stage`).

- a crash between the write and the sends loses nothing, and sends nothing twice;
- a late definitive answer for the step in flight is applied, whichever attempt carried it;
- cancel acts at once and undoes the step in flight too; its forward call, landing later, is
  refused by the service;
- an open circuit (``deferred``) re-arms the step at ``retry_at`` without counting a failure;
- resubmitting an Error order does not raise its alert again.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime

import pytest

from domain.order import StepState
from domain.states import ProcessState
from service import control
from service.replies import handle_response
from tests.support.pattern import (
    SERVICES,
    Stage,
    effects,
    net_effects,
    new_order,
    tombstoned,
)

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

STEPS = ("reserve_inventory", "charge_payment", "create_shipment")


@pytest.fixture(scope="module")
def status_queue(servicebus) -> str:
    return servicebus.queue("order-status")


@pytest.fixture
async def memory_stage(env, clock, fakes, status_queue) -> AsyncIterator[Stage]:
    staged = Stage.in_memory(env, clock, fakes, status_queue)
    yield staged
    await staged.rt.close()


@pytest.fixture(params=["memory", "real"])
def stage(request, clock, fakes, reader, status_queue) -> Stage:
    if request.param == "real":
        return Stage("real", request.getfixturevalue("rt"), clock, fakes, status_queue, reader)
    return request.getfixturevalue("memory_stage")  # type: ignore[no-any-return]


async def events(stage: Stage, order_id: str) -> list[str]:
    return [t.event for t in await stage.rt.store.get_timeline(order_id)]


async def step_states(stage: Stage, order_id: str) -> dict[str, StepState]:
    return {s.name: s.state for s in (await stage.rt.store.load(order_id)).steps}


async def active(stage: Stage) -> set[str]:
    return {row.order_id for row in (await stage.rt.store.list_active()).rows}


def sequences(stage: Stage, order_id: str) -> list[int]:
    return [s["sequence"] for s in stage.all_on("status", order_id)]


def decline(stage: Stage, service: str, order_id: str) -> None:
    stage.fakes.set_profile({"services": {service: {"decline_order_ids": [order_id]}}})


async def test_happy_path_through_three_steps(stage):
    order = new_order(reply_to=stage.status_queue)
    oid = order.order_id
    await stage.submit(order)
    keys = [(await stage.step(service, oid))["idempotency_key"] for service in SERVICES]

    process = await stage.rt.store.load(oid)
    assert (process.state, process.locked_by, process.failure_count) == (
        ProcessState.PROCESSED,
        None,
        0,
    )
    assert [s.state for s in process.steps] == [StepState.SUCCEEDED] * 3
    assert keys == [f"{oid}:{step}:do:1" for step in STEPS]
    assert [(s, op) for s, op, _ in effects(stage.fakes, oid)] == [
        ("inventory", "reserve"),
        ("payment", "charge"),
        ("shipping", "create"),
    ]
    assert await events(stage, oid) == ["created", "step_succeeded", "step_succeeded", "processed"]
    assert oid not in await active(stage), "a finished order leaves the active index"
    assert sequences(stage, oid) == list(range(8)) == list(range(process.status_seq))
    assert stage.all_on("alerts", oid) == []


# ------------------------------------------------------------ (a) crash between write and sends


async def test_a_crash_after_the_intake_write_loses_nothing(stage):
    order = new_order(reply_to=stage.status_queue)
    oid = order.order_id
    # 'received' went out, then the host died
    await stage.crash(lambda: stage.submit(order), after=1)

    stored = await stage.rt.store.load(oid)
    assert (stored.state, stored.attempt) == (ProcessState.PROCESSING, 1), "written at once"
    assert [type(o.message).__name__ for o in stored.outbox] == [
        "StatusUpdate",
        "StatusUpdate",
        "AgentRequest",
    ], "what the write implies is on the record, the request last"
    assert stage.none_on("inventory", oid)

    await stage.submit(order)  # the submission is redelivered: the outbox goes out again
    request = json.loads(stage.expect("inventory", oid))
    assert (request["attempt"], request["idempotency_key"]) == (1, f"{oid}:reserve_inventory:do:1")
    # The agent first: the checks below wait for what must not come, and the step's 5 s
    # deadline runs meanwhile. It sends no request or status and writes nothing of the order.
    await stage.agent(json.dumps(request).encode(), "inventory")
    assert stage.none_on("inventory", oid), "one request on the queue"
    assert sequences(stage, oid) == [0, 1], "each status once, in order"
    assert await events(stage, oid) == ["created"]

    await stage.reply(oid)
    for service in SERVICES[1:]:
        await stage.step(service, oid)
    assert (await stage.rt.store.load(oid)).state is ProcessState.PROCESSED
    assert sequences(stage, oid) == list(range(2, 8))
    assert [op for _, op, _ in effects(stage.fakes, oid)] == ["reserve", "charge", "create"]


async def test_a_create_after_the_supervisor_saw_its_row_alone_is_not_found_late(stage):
    """The intake wrote the index row, then died before the create; the Supervisor found the
    row without its order; the redelivered submission creates the order. Its row must still be
    due no later than the order, or a lost step would wait for the garbage grace (15 min)."""
    order = new_order(reply_to=stage.status_queue)
    oid = order.order_id
    await stage.rt.store.index.add(oid, 1, order.workflow)  # what the dead intake left behind
    await stage.tick()
    await stage.submit(order)

    stored = await stage.rt.store.load(oid)
    (row,) = [r for r in (await stage.rt.store.list_active()).rows if r.order_id == oid]
    assert stored.complete_by is not None
    assert row.due_at <= stored.complete_by, "the row is never later than its order"


async def test_a_crash_after_a_reply_write_loses_nothing(stage):
    order = new_order(reply_to=stage.status_queue)
    oid = order.order_id
    await stage.submit(order)
    await stage.agent(stage.request("inventory", oid), "inventory")
    reply = stage.expect("responses", oid)
    await stage.crash(lambda: handle_response(reply, stage.rt), after=0)

    moved = await stage.rt.store.load(oid)
    assert (moved.current_step, moved.attempt) == ("charge_payment", 2)
    assert moved.step("reserve_inventory").state is StepState.SUCCEEDED
    assert stage.none_on("payment", oid), "the host died before sending"

    await handle_response(reply, stage.rt)  # the reply is redelivered
    request = json.loads(stage.expect("payment", oid))
    assert (request["step"], request["attempt"]) == ("charge_payment", 2)
    assert stage.none_on("payment", oid), "one request on the queue"
    assert await events(stage, oid) == ["created", "step_succeeded"], "the redelivery wrote nothing"

    await stage.agent(json.dumps(request).encode(), "payment")
    await stage.reply(oid)
    await stage.step("shipping", oid)
    assert (await stage.rt.store.load(oid)).state is ProcessState.PROCESSED
    assert sequences(stage, oid) == list(range(8)), "every status once, in order"
    assert [op for _, op, _ in effects(stage.fakes, oid)] == ["reserve", "charge", "create"]


async def test_a_crash_before_the_final_alert_is_made_good_by_the_supervisor(stage):
    order = new_order(reply_to=stage.status_queue)
    oid = order.order_id
    decline(stage, "payment", oid)
    await stage.submit(order)
    await stage.step("inventory", oid)
    await stage.step("payment", oid)  # declined: the reservation is released
    await stage.agent(stage.request("inventory", oid), "inventory")
    reply = stage.expect("responses", oid)
    # The Error write commits; one status goes out, then the host dies before the alert.
    await stage.crash(lambda: handle_response(reply, stage.rt), after=1)

    process = await stage.rt.store.load(oid)
    assert process.state is ProcessState.ERROR
    assert oid in await active(stage), "the index row stays until the outbox is sent"
    assert (await stage.tick()).flushed == 0, "its writer gets a moment to send"
    stage.clock.advance(11)
    assert (await stage.tick()).flushed == 1

    alerts = stage.all_on("alerts", oid)
    assert [(a["reason"], a["severity"]) for a in alerts] == [("step_declined", "error")]
    assert sequences(stage, oid) == list(range(process.status_seq)) == list(range(7))
    assert oid not in await active(stage)
    report = await stage.tick()
    assert (report.due, report.flushed) == (0, 0)
    assert stage.none_on("alerts", oid), "sent once"
    assert net_effects(stage.fakes, oid) == {"inventory": 0}


async def test_a_supervisor_crash_after_releasing_loses_no_retry(stage):
    order = new_order()
    oid = order.order_id
    await stage.submit(order)
    stage.request("inventory", oid)  # never answered
    stage.clock.advance(6)
    await stage.crash(stage.tick, after=0, raises=False)  # released; its retry never sent

    released = await stage.rt.store.load(oid)
    assert (released.state, released.locked_by, released.failure_count) == (
        ProcessState.PENDING,
        None,
        1,
    )
    assert stage.scheduled("commands", oid) == 0 and stage.none_on("commands", oid)
    assert (await stage.tick()).retried == 0, "the order waits for its retry..."
    stage.clock.advance(11)  # ...until it has waited past its retry for pending_stale_after
    assert (await stage.tick()).retried == 1

    retry = stage.expect("commands", oid)  # the lost retry is sent, now due
    assert json.loads(retry)["attempt"] == 1
    await stage.command(retry)
    request = json.loads(stage.expect("inventory", oid))
    assert request["attempt"] == 2
    await stage.agent(json.dumps(request).encode(), "inventory")
    await stage.reply(oid)
    later, _ = stage.take_scheduled("commands", oid)  # the second decision's retry: stale
    await stage.command(later)
    assert stage.none_on("inventory", oid)
    process = await stage.rt.store.load(oid)
    assert (process.current_step, process.attempt) == ("charge_payment", 3)


async def test_the_tick_after_a_supervisor_crash_sends_the_lost_retry_without_a_failure(stage):
    """FAILS (bug): service/sweep.py says of an order whose messages could not be sent that
    "its outbox is still on its record and the next tick tries again", but the lifecycle's
    sweep of a released order sends nothing while it waits for its retry (domain/lifecycle.py,
    ``_on_sweep``: ``Decision(None, (), note="waiting for its retry")``). The lost command goes
    out only once the order is stale, and that sweep counts another failure: a crash of the
    Supervisor's send costs the order one of its FailureThreshold attempts (at failure
    threshold - 1 it is compensated instead of retried). The same holds for an undo request
    the Supervisor failed to send: nothing until CompleteBy, then a failure."""
    order = new_order()
    oid = order.order_id
    await stage.submit(order)
    stage.request("inventory", oid)  # never answered
    stage.clock.advance(6)
    await stage.crash(stage.tick, after=0, raises=False)  # released (failure 1); the retry unsent
    stage.clock.advance(10.1)  # past any flush grace, before the order counts as stale
    await stage.tick()
    retry = stage.take("commands", oid, wait=2.0)
    assert retry is not None, "the next tick did not send the retry still on the record"
    await stage.command(retry)
    assert (await stage.rt.store.load(oid)).failure_count == 1


# -------------------------------------------------------------------- (b) late answers applied


async def test_a_late_success_after_the_supervisor_released_the_step_is_applied(stage):
    order = new_order()
    oid = order.order_id
    await stage.submit(order)
    request = stage.request("inventory", oid)  # the agent is slow
    stage.clock.advance(6)  # past CompleteBy (5 s budget)
    assert (await stage.tick()).retried == 1
    released = await stage.rt.store.load(oid)
    assert (released.state, released.failure_count, released.locked_by) == (
        ProcessState.PENDING,
        1,
        None,
    )

    stage.clock.advance(-6)  # the slow agent still believes it is in time...
    await stage.agent(request, "inventory")
    stage.clock.advance(6)
    await stage.reply(oid)  # ...and its success arrives after the release

    process = await stage.rt.store.load(oid)
    assert (process.state, process.current_step, process.attempt) == (
        ProcessState.PROCESSING,
        "charge_payment",
        2,
    )
    assert process.failure_count == 0, "the late success is no failure"
    assert process.step("reserve_inventory").state is StepState.SUCCEEDED
    assert await events(stage, oid) == ["created", "released", "step_succeeded"]

    retry, _ = stage.take_scheduled("commands", oid)  # the retry that was due...
    await stage.command(retry)  # ...is stale now: nothing changes, nothing is sent
    assert (await stage.rt.store.load(oid)).etag == process.etag
    assert stage.none_on("inventory", oid)

    for service in SERVICES[1:]:
        await stage.step(service, oid)
    assert (await stage.rt.store.load(oid)).state is ProcessState.PROCESSED
    assert [op for _, op, _ in effects(stage.fakes, oid)] == ["reserve", "charge", "create"]


async def test_a_late_success_while_the_retry_is_in_flight_is_applied_once(stage):
    order = new_order()
    oid = order.order_id
    await stage.submit(order)
    first = stage.request("inventory", oid)
    stage.clock.advance(6)
    assert (await stage.tick()).retried == 1
    retry, _ = stage.take_scheduled("commands", oid)
    await stage.command(retry)
    second = stage.request("inventory", oid)
    assert json.loads(second)["attempt"] == 2

    stage.clock.advance(-6)
    await stage.agent(first, "inventory")  # attempt 1 answers while attempt 2 is in flight
    stage.clock.advance(6)
    await stage.reply(oid)
    advanced = await stage.rt.store.load(oid)
    assert (advanced.current_step, advanced.attempt) == ("charge_payment", 3)

    await stage.agent(second, "inventory")  # the service replays the stored answer
    await stage.reply(oid)  # a second success for a step already done changes nothing
    assert (await stage.rt.store.load(oid)).etag == advanced.etag
    charge = json.loads(stage.expect("payment", oid))
    assert charge["attempt"] == 3
    assert stage.none_on("payment", oid)
    assert effects(stage.fakes, oid) == [("inventory", "reserve", f"{oid}:reserve_inventory:do:1")]


# --------------------------------------------------------------- (c) cancel with a step in flight


async def test_cancel_undoes_the_step_in_flight_whose_call_lands_later(stage):
    order = new_order()
    oid = order.order_id
    rt = stage.rt
    await stage.submit(order)
    await stage.step("inventory", oid)
    charge = stage.request("payment", oid)  # the charge is on its way

    result = await control.cancel(rt, oid, actor="operator:bob", reason="customer asked")
    assert (result.outcome, result.state) == ("compensating", ProcessState.COMPENSATING)
    with pytest.raises(control.Refused) as again:
        await control.cancel(rt, oid, actor="operator:bob", reason="again")
    assert again.value.code == "conflict"
    await stage.command(stage.expect("commands", oid))  # the pattern app sends what it wrote

    refund = await stage.step("payment", oid)  # the charge's outcome is unknown: undo it
    assert (refund["action"], refund["idempotency_key"], refund["undoes"]) == (
        "refund",
        f"{oid}:charge_payment:undo:1",
        f"{oid}:charge_payment:do:1",
    )
    release = await stage.step("inventory", oid)
    assert release["undoes"] == f"{oid}:reserve_inventory:do:1"

    process = await rt.store.load(oid)
    assert process.state is ProcessState.ERROR
    assert (process.last_error or "").startswith("cancelled by operator:bob: customer asked")
    assert "never took effect: charge_payment" in (process.last_error or "")
    assert await step_states(stage, oid) == {
        "reserve_inventory": StepState.COMPENSATED,
        "charge_payment": StepState.VOIDED,
        "create_shipment": StepState.PENDING,
    }

    await stage.agent(charge, "payment")  # the charge lands at last...
    late = json.loads(await stage.reply(oid))
    assert (late["outcome"], late["error_code"]) == ("failed", "undone_before_applied")
    assert (await rt.store.load(oid)).etag == process.etag, "...and changes nothing"

    assert [(s, op) for s, op, _ in effects(stage.fakes, oid)] == [
        ("inventory", "reserve"),
        ("inventory", "release"),
    ]
    assert net_effects(stage.fakes, oid) == {"inventory": 0}
    assert tombstoned(stage.fakes, oid) == {f"{oid}:charge_payment:do:1"}
    alerts = stage.all_on("alerts", oid)
    assert [(a["reason"], a["severity"]) for a in alerts] == [("cancelled", "warning")]
    assert stage.none_on("shipping", oid)


# ---------------------------------------------------------------- (d) an open circuit defers


async def test_a_deferred_reply_rearms_the_step_at_retry_at_without_a_failure(stage):
    order = new_order()
    oid = order.order_id
    await stage.submit(order)
    stage.request("inventory", oid)  # never answered
    stage.clock.advance(6)
    assert (await stage.tick()).retried == 1
    retry, _ = stage.take_scheduled("commands", oid)
    await stage.command(retry)
    breaker = stage.rt.breakers.get("inventory")
    for _ in range(breaker.settings.failure_threshold):  # other calls failed: the circuit opens
        breaker.record_failure()

    await stage.agent(stage.request("inventory", oid), "inventory")
    reply = json.loads(await stage.reply(oid))
    assert reply["outcome"] == "deferred"

    process = await stage.rt.store.load(oid)
    assert (process.state, process.locked_by, process.failure_count) == (
        ProcessState.PENDING,
        None,
        1,
    ), "FailureCount did not move"
    retry_at = process.next_attempt_at
    assert retry_at is not None
    assert abs((retry_at - datetime.fromisoformat(reply["retry_at"])).total_seconds()) < 0.002
    command, due = stage.take_scheduled("commands", oid)
    assert abs((due - retry_at).total_seconds()) < 0.002, "the retry is due at retry_at"
    assert json.loads(command)["failure_count"] == 1
    assert (await events(stage, oid))[-1] == "deferred"

    stage.rt.breakers.reset_all()  # the service is back
    await stage.command(command)
    assert (await stage.step("inventory", oid))["attempt"] == 3
    process = await stage.rt.store.load(oid)
    assert (process.current_step, process.failure_count) == ("charge_payment", 0)


# ------------------------------------------------------------------ (e) resubmit and its alert


async def _declined_at_payment(stage: Stage, oid: str) -> bytes:
    """Run the order until the release's reply is on the queue; return it (not delivered)."""
    await stage.step("inventory", oid)
    await stage.step("payment", oid)
    await stage.agent(stage.request("inventory", oid), "inventory")
    return stage.expect("responses", oid)


async def test_resubmit_of_an_error_order_does_not_resend_its_alert(stage):
    order = new_order()
    oid = order.order_id
    decline(stage, "payment", oid)
    await stage.submit(order)
    await handle_response(await _declined_at_payment(stage, oid), stage.rt)
    assert (await stage.rt.store.load(oid)).state is ProcessState.ERROR
    assert [a["reason"] for a in stage.all_on("alerts", oid)] == ["step_declined"]
    assert oid not in await active(stage)

    stage.fakes.set_profile(None)
    result = await control.resubmit(stage.rt, oid, actor="operator:ann", reason="card replaced")
    assert (result.outcome, result.generation, result.step) == (
        "resubmitted",
        2,
        "reserve_inventory",
    )
    await stage.command(stage.expect("commands", oid))  # the pattern app sends what it wrote
    assert stage.none_on("alerts", oid), "the alert is not raised again"
    for service in SERVICES:
        assert (await stage.step(service, oid))["idempotency_key"].endswith(":do:2")
    assert (await stage.rt.store.load(oid)).state is ProcessState.PROCESSED
    assert net_effects(stage.fakes, oid) == {"inventory": 1, "payment": 1, "shipping": 1}
    assert stage.none_on("alerts", oid)


async def test_resubmit_sends_an_alert_that_was_never_sent_once(stage):
    order = new_order()
    oid = order.order_id
    decline(stage, "payment", oid)
    await stage.submit(order)
    reply = await _declined_at_payment(stage, oid)
    await stage.crash(lambda: handle_response(reply, stage.rt), after=0)  # Error, the alert unsent
    assert (await stage.rt.store.load(oid)).state is ProcessState.ERROR

    stage.fakes.set_profile(None)
    await control.resubmit(stage.rt, oid, actor="operator:ann", reason="card replaced")
    await stage.command(stage.expect("commands", oid))  # the pattern app sends what it wrote
    assert [a["reason"] for a in stage.all_on("alerts", oid)] == ["step_declined"]
    await stage.tick()  # the first generation's index row leads the Supervisor to send nothing
    assert stage.none_on("alerts", oid)
    for service in SERVICES:
        await stage.step(service, oid)
    assert (await stage.rt.store.load(oid)).state is ProcessState.PROCESSED
    assert stage.none_on("alerts", oid), "sent once"
