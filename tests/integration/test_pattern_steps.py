"""The pattern one message at a time, against real Azurite, the development broker and the fake
remote services over HTTP. Each test plays the Functions host by hand: it takes the next message
off a queue and calls the same handler the function would, so races, crashes and late replies
can be staged exactly. The happy path and the outbox, late-answer, cancel, deferral and resubmit
guarantees, over both adapter sets, are in test_lifecycle_guarantees."""

from __future__ import annotations

import asyncio
import json

import pytest

from domain.messages import AgentResponse, encode
from domain.order import Failures
from domain.states import ProcessState
from service.agent import handle_request
from service.commands import handle_command
from service.intake import handle_submission
from service.replies import handle_response
from service.sweep import run_tick
from tests.support.app import UNHURRIED_TICK_S, make_runtime
from tests.support.pattern import SERVICES, alerts_for, new_order, queue, run_agent_step

pytestmark = pytest.mark.anyio


def effects(fakes, order_id: str) -> list[tuple[str, str]]:
    return [(e["service"], e["operation"]) for e in fakes.ledger() if e["order_id"] == order_id]


async def events(rt, order_id: str) -> list[str]:
    return [t.event for t in await rt.store.get_timeline(order_id)]


async def test_four_schedulers_racing_for_one_submission_one_creates_and_dispatches(env, reader):
    order = new_order()
    body = encode(order)
    runtimes = [await make_runtime(env, f"scheduler{i}") for i in range(4)]
    await asyncio.wait_for(asyncio.gather(*(handle_submission(body, r) for r in runtimes)), 30)
    store = runtimes[0].store
    process = await store.load(order.order_id)
    # Created and claimed for its first step in one write; the others found it and resent its
    # outbox, which duplicate detection dropped.
    assert await events(runtimes[0], order.order_id) == ["created"]
    assert process.locked_by in {r.actor("scheduler") for r in runtimes}
    assert (process.state, process.attempt) == (ProcessState.PROCESSING, 1)
    request = json.loads(reader.expect(queue(runtimes[0], "inventory"), order.order_id))
    assert request["attempt"] == 1
    assert reader.take(queue(runtimes[0], "inventory"), order.order_id, wait=1) is None
    for r in runtimes:
        await r.close()


async def test_redelivered_agent_request_applies_the_effect_once(rt, reader, fakes):
    order = new_order()
    await handle_submission(encode(order), rt)
    request = reader.expect(queue(rt, "inventory"), order.order_id)
    await handle_request(request, "inventory", rt)  # the first delivery did the work...
    await handle_request(request, "inventory", rt)  # ...and its redelivery after a crash
    first = reader.expect(queue(rt, "responses"), order.order_id)
    await handle_response(first, rt)
    assert reader.take(queue(rt, "responses"), order.order_id, wait=1) is None, "deduplicated"
    assert effects(fakes, order.order_id) == [("inventory", "reserve")]
    assert (await rt.store.load(order.order_id)).current_step == "charge_payment"


async def test_deadline_expiry_is_recovered_by_the_supervisor(rt, reader, fakes, clock):
    order = new_order()
    fakes.set_profile({"services": {"inventory": {"hang_rate": 1.0, "hang_seconds": 8}}})
    await handle_submission(encode(order), rt)
    request = reader.expect(queue(rt, "inventory"), order.order_id)
    await handle_request(request, "inventory", rt)  # hangs until complete-by: reported timed out
    timed_out = reader.expect(queue(rt, "responses"), order.order_id)  # held up on our side
    assert json.loads(timed_out)["error_code"] == "timed_out"
    fakes.set_profile(None)

    clock.advance(6)  # past CompleteBy (5 s budget)
    report = await run_tick(rt, budget_s=UNHURRIED_TICK_S)
    assert report.retried == 1
    process = await rt.store.load(order.order_id)
    assert (process.state, process.failure_count, process.locked_by) == (
        ProcessState.PENDING,
        1,
        None,
    )
    assert process.next_attempt_at is not None
    assert process.step("reserve_inventory").forward_failures == Failures(unanswered=(1,))
    await handle_response(timed_out, rt)  # late: it counts for nothing, but the call was made
    process = await rt.store.load(order.order_id)
    assert (process.state, process.failure_count) == (ProcessState.PENDING, 1)
    assert process.step("reserve_inventory").forward_failures == Failures(at_service=1)

    command, due = reader.take_scheduled(queue(rt, "commands"), order.order_id)
    assert abs((due - process.next_attempt_at).total_seconds()) < 0.002
    await handle_command(command, rt)
    request = json.loads(reader.expect(queue(rt, "inventory"), order.order_id))
    assert request["attempt"] == 2
    await handle_request(json.dumps(request).encode(), "inventory", rt)
    await handle_response(reader.expect(queue(rt, "responses"), order.order_id), rt)
    for service in ("payment", "shipping"):
        await run_agent_step(rt, reader, order.order_id, service)
    assert (await rt.store.load(order.order_id)).state is ProcessState.PROCESSED
    assert effects(fakes, order.order_id).count(("inventory", "reserve")) == 1


async def test_a_late_transient_failure_of_a_released_attempt_counts_for_nothing(rt, reader, clock):
    order = new_order()
    await handle_submission(encode(order), rt)
    request = json.loads(reader.expect(queue(rt, "inventory"), order.order_id))
    clock.advance(6)
    assert (await run_tick(rt, budget_s=UNHURRIED_TICK_S)).retried == 1
    before = await rt.store.load(order.order_id)
    # A transient failure counts only for the attempt in flight; this one was already counted
    # (released by the Supervisor, FailureCount 1).
    late = AgentResponse(
        order_id=order.order_id,
        step=request["step"],
        operation="do",
        attempt=request["attempt"],
        idempotency_key=request["idempotency_key"],
        outcome="failed",
        transient=True,
        error_code="unavailable",
    )
    await handle_response(encode(late), rt)
    after = await rt.store.load(order.order_id)
    assert (after.state, after.failure_count) == (ProcessState.PENDING, 1), "counted once"
    assert after.outbox == before.outbox and after.next_attempt_at == before.next_attempt_at
    # All it says is whose failure attempt 1 was: the service answered.
    assert after.step("reserve_inventory").forward_failures == Failures(at_service=1)
    assert (await rt.store.get_timeline(order.order_id))[-1].event == "late_answer"


async def test_failure_threshold_ends_in_error_with_an_alert(rt, reader, clock):
    order = new_order()
    await handle_submission(encode(order), rt)
    reader.expect(queue(rt, "inventory"), order.order_id)  # an agent that never answers
    delays = []
    for expected_failures in (1, 2):
        clock.advance(30)
        assert (await run_tick(rt, budget_s=UNHURRIED_TICK_S)).retried == 1
        released = await rt.store.load(order.order_id)
        command, due = reader.take_scheduled(queue(rt, "commands"), order.order_id)
        assert abs((due - released.next_attempt_at).total_seconds()) < 0.002
        delays.append((released.next_attempt_at - released.updated_at).total_seconds())
        await handle_command(command, rt)
        reader.expect(queue(rt, "inventory"), order.order_id)
        assert (await rt.store.load(order.order_id)).failure_count == expected_failures
    # RETRY_BASE_DELAY 1 s, factor 2, jitter 0.2: the second wait is longer than the first
    assert 0.7 < delays[0] <= 1.1 and 1.5 < delays[1] <= 2.1
    clock.advance(30)
    # At the threshold the step that kept timing out is undone at once (it may have taken
    # effect); the service never saw it, so there is nothing to undo.
    assert (await run_tick(rt, budget_s=UNHURRIED_TICK_S)).compensating == 1
    release = await run_agent_step(rt, reader, order.order_id, "inventory")
    assert (release["action"], release["undoes"]) == (
        "release",
        f"{order.order_id}:reserve_inventory:do:1",
    )
    process = await rt.store.load(order.order_id)
    assert process.state is ProcessState.ERROR
    assert "failure threshold of 3" in (process.last_error or "")
    assert process.step("reserve_inventory").state == "Voided"
    alerts = alerts_for(rt, reader, order.order_id)
    assert [(a["reason"], a["severity"]) for a in alerts] == [("failure_threshold", "error")]


async def test_decline_is_an_error_with_an_alert(rt, reader, fakes):
    order = new_order()
    fakes.set_profile({"services": {"payment": {"decline_order_ids": [order.order_id]}}})
    await handle_submission(encode(order), rt)
    await run_agent_step(rt, reader, order.order_id, "inventory")
    await run_agent_step(rt, reader, order.order_id, "payment")
    await run_agent_step(rt, reader, order.order_id, "inventory")  # the reservation is released
    process = await rt.store.load(order.order_id)
    assert process.state is ProcessState.ERROR
    assert "card_declined" in (process.last_error or "")
    assert [a["reason"] for a in alerts_for(rt, reader, order.order_id)] == ["step_declined"]
    assert effects(fakes, order.order_id) == [("inventory", "reserve"), ("inventory", "release")]


async def test_duplicate_submission_carries_on_conflicting_one_is_rejected(rt, reader):
    order = new_order()
    await handle_submission(encode(order), rt)
    await handle_submission(encode(order), rt)  # redelivered: nothing new
    changed = order.model_copy(update={"currency": "USD"})
    await handle_submission(encode(changed), rt)
    alert = json.loads(reader.expect(queue(rt, "alerts"), order.order_id))
    assert alert["reason"] == "conflicting_submission"
    record = await rt.store.get_order(order.order_id)
    assert record.details.currency == "EUR"
    assert await events(rt, order.order_id) == ["created"]
    reader.expect(queue(rt, "inventory"), order.order_id)
    assert reader.take(queue(rt, "inventory"), order.order_id, wait=1) is None


async def test_two_supervisors_recover_an_order_once(env, rt, reader, clock):
    order = new_order()
    await handle_submission(encode(order), rt)
    reader.expect(queue(rt, "inventory"), order.order_id)
    clock.advance(6)
    supervisors = [await make_runtime(env, f"supervisor{i}", clock) for i in range(3)]
    reports = await asyncio.wait_for(asyncio.gather(*(run_tick(s) for s in supervisors)), 30)
    assert sum(r.retried for r in reports) == 1
    assert sum(r.conflicts for r in reports) <= 2
    assert (await rt.store.load(order.order_id)).failure_count == 1
    assert await events(rt, order.order_id) == ["created", "released"]
    assert len(reader.peek_scheduled(queue(rt, "commands"), order.order_id)) == 1
    for s in supervisors:
        await s.close()


HOSTILE_ID = "x' or PartitionKey ne '"


@pytest.mark.parametrize(
    ("handler", "body"),
    [
        ("intake", b"{not json"),
        ("intake", b"\xff\xfe not utf-8"),
        ("intake", json.dumps({"type": "OrderSubmitted", "order_id": "o-1"}).encode()),
        (
            "intake",
            json.dumps(
                {
                    "type": "OrderSubmitted",
                    "order_id": HOSTILE_ID,
                    "customer_id": "c",
                    "currency": "EUR",
                    "items": [{"sku": "S", "quantity": 1, "unit_price_cents": 1}],
                }
            ).encode(),
        ),
        ("intake", b'{"type": "OrderSubmitted", "pad": "' + b"x" * (300 * 1024) + b'"}'),
        ("replies", json.dumps({"type": "AgentResponse", "order_id": HOSTILE_ID}).encode()),
        ("commands", b"[]"),
        ("agent", b'{"type": "AgentRequest"}'),
    ],
    ids=[
        "malformed-json",
        "not-utf8",
        "wrong-schema",
        "hostile-id",
        "oversized",
        "hostile-reply",
        "not-an-object",
        "agent-schema",
    ],
)
async def test_bad_messages_are_settled_with_an_alert(rt, reader, handler, body):
    handlers = {
        "intake": lambda b: handle_submission(b, rt),
        "replies": lambda b: handle_response(b, rt),
        "commands": lambda b: handle_command(b, rt),
        "agent": lambda b: handle_request(b, "inventory", rt),
    }
    await handlers[handler](body)  # returns normally: the message is completed, not retried
    # An alert an earlier test left about an order of its own may still be on the queue: the
    # next bad_message alert is this one (none within the wait fails the test).
    message = reader.take_message(
        queue(rt, "alerts"), lambda m: json.loads(b"".join(m.body))["reason"] == "bad_message"
    )
    assert message is not None, "no bad_message alert"
    alert = json.loads(b"".join(message.body))
    assert alert["detail"]
    assert alert["order_id"] is None or alert["order_id"] != HOSTILE_ID


async def test_a_bad_message_does_not_touch_other_orders(rt, reader, fakes):
    good = new_order()
    await handle_submission(encode(good), rt)
    await handle_submission(b"{broken", rt)
    reader.expect(queue(rt, "alerts"), None)
    for service in SERVICES:
        await run_agent_step(rt, reader, good.order_id, service)
    assert (await rt.store.load(good.order_id)).state is ProcessState.PROCESSED


async def test_reply_for_a_step_the_workflow_lacks_is_not_applied(rt, reader):
    order = new_order()
    await handle_submission(encode(order), rt)
    reader.expect(queue(rt, "inventory"), order.order_id)
    before = await rt.store.load(order.order_id)
    bogus = AgentResponse(
        order_id=order.order_id,
        step="teleport",
        operation="do",
        attempt=before.attempt,
        idempotency_key=f"{order.order_id}:teleport:do:1",
        outcome="succeeded",
    )
    await handle_response(encode(bogus), rt)
    assert (await rt.store.load(order.order_id)).etag == before.etag
    alert = json.loads(reader.expect(queue(rt, "alerts"), order.order_id))
    assert alert["reason"] == "bad_message" and "teleport" in alert["detail"]
