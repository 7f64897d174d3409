"""Status replies to the submitter's queue: order, correlation, and failures that never block."""

from __future__ import annotations

import json

import pytest
from azure.servicebus import ServiceBusClient

from domain.messages import encode
from domain.states import ProcessState
from service.intake import handle_submission
from service.sweep import run_tick
from tests.support.app import UNHURRIED_TICK_S
from tests.support.pattern import (
    alerts_for,
    new_order,
    queue,
    run_agent_step,
)

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


@pytest.fixture
def env(env):
    """A step budget no test here comes near: a status reply to a missing queue is retried by
    the SDK for seconds between a step's claim and its request being taken up, and the shared
    five seconds passed that way on a loaded machine. No deadline is under test here."""
    return env | {"STEP_TIMEOUT_SECONDS": "60"}


STEPS = ("reserve_inventory", "charge_payment", "create_shipment")


@pytest.fixture(scope="module")
def status_queue(servicebus) -> str:
    return servicebus.queue("order-status")


@pytest.fixture(scope="module")
def status_client(servicebus):
    client = ServiceBusClient.from_connection_string(servicebus.connection_string)
    yield client
    client.close()


def statuses(client: ServiceBusClient, queue_name: str, order_id: str, wait: float = 2.0):
    """(body, correlation id) of every status message for ``order_id``, in arrival order."""
    found = []
    with client.get_queue_receiver(queue_name, max_wait_time=wait) as receiver:
        while batch := receiver.receive_messages(max_message_count=50, max_wait_time=wait):
            for message in batch:
                receiver.complete_message(message)
                body = json.loads(b"".join(message.body))
                if body["order_id"] == order_id:
                    found.append((body, message.correlation_id))
    return found


async def test_reply_queue_receives_the_status_sequence_in_order(
    rt, reader, status_queue, status_client
):
    order = new_order(reply_to=status_queue)
    await handle_submission(encode(order), rt)
    for service in ("inventory", "payment", "shipping"):
        await run_agent_step(rt, reader, order.order_id, service)

    received = statuses(status_client, status_queue, order.order_id)
    assert {correlation for _, correlation in received} == {order.order_id}
    updates = [body for body, _ in received]
    assert [(u["event"], u["step"]) for u in updates] == [
        ("received", None),
        ("step_started", STEPS[0]),
        ("step_completed", STEPS[0]),
        ("step_started", STEPS[1]),
        ("step_completed", STEPS[1]),
        ("step_started", STEPS[2]),
        ("step_completed", STEPS[2]),
        ("processed", None),
    ]
    assert [u["sequence"] for u in updates] == list(range(8)), "numbered 0, 1, 2, ... per order"
    assert (await rt.store.load(order.order_id)).status_seq == 8
    assert updates[0]["state"] == "Pending" and updates[-1]["state"] == "Processed"
    assert all(u["type"] == "StatusUpdate" for u in updates)


async def test_a_compensated_order_reports_compensating_then_failed(
    rt, reader, fakes, status_queue, status_client
):
    order = new_order(reply_to=status_queue)
    fakes.set_profile({"services": {"payment": {"decline_order_ids": [order.order_id]}}})
    await handle_submission(encode(order), rt)
    await run_agent_step(rt, reader, order.order_id, "inventory")
    await run_agent_step(rt, reader, order.order_id, "payment")
    await run_agent_step(rt, reader, order.order_id, "inventory")

    updates = [body for body, _ in statuses(status_client, status_queue, order.order_id)]
    assert [u["event"] for u in updates] == [
        "received",
        "step_started",
        "step_completed",
        "step_started",
        "compensating",
        "step_compensated",
        "failed",
    ]
    assert updates[4]["state"] == "Compensating" and "card_declined" in updates[4]["detail"]
    assert updates[-1]["state"] == "Error" and "compensated" in updates[-1]["detail"]
    assert [u["sequence"] for u in updates] == list(range(7))
    assert [a["reason"] for a in alerts_for(rt, reader, order.order_id)] == ["step_declined"]


async def test_a_missing_reply_queue_never_blocks_the_order_and_is_alerted_once(rt, reader, clock):
    order = new_order(reply_to="no-such-reply-queue")
    await handle_submission(encode(order), rt)
    for service in ("inventory", "payment", "shipping"):
        await run_agent_step(rt, reader, order.order_id, service)

    process = await rt.store.load(order.order_id)
    assert process.state is ProcessState.PROCESSED, "the order carried on"
    assert process.status_seq == 8, "its updates were numbered all the same"
    # None is lost: the order holds all eight for a retry, and its row waits for it.
    held = [o for o in process.outbox if o.to == "reply"]
    assert [o.message.sequence for o in held] == list(range(8))
    assert all(o.not_before is not None for o in held)
    timeline = await rt.store.get_timeline(order.order_id)
    assert [e.event for e in timeline].count("replies_held") == 1
    assert await rt.store.index.has(order.order_id, process.generation)
    alerts = alerts_for(rt, reader, order.order_id)
    assert [(a["reason"], a["severity"]) for a in alerts] == [
        ("reply_queue_unavailable", "warning")
    ]
    assert "no-such-reply-queue" in alerts[0]["detail"]

    second = new_order(reply_to="NO-SUCH-REPLY-QUEUE")  # entity names are case-insensitive
    await handle_submission(encode(second), rt)  # the failure is remembered: not tried, not alerted
    await run_agent_step(rt, reader, second.order_id, "inventory")
    assert (await rt.store.load(second.order_id)).current_step == "charge_payment"
    assert alerts_for(rt, reader, second.order_id) == []

    clock.advance(301)  # the failure is forgotten after five minutes: tried and alerted again
    third = new_order(reply_to="no-such-reply-queue")
    await handle_submission(encode(third), rt)
    assert [a["reason"] for a in alerts_for(rt, reader, third.order_id)] == [
        "reply_queue_unavailable"
    ]
    assert (await rt.store.load(third.order_id)).state is ProcessState.PROCESSING


async def test_held_updates_reach_the_queue_in_order_once_it_takes_them(
    rt, reader, clock, status_queue, status_client
):
    # The process saw the queue refuse moments ago (disabled, say): it does not try it now.
    rt.refusing_queues.put(status_queue, "MessagingEntityDisabledError: disabled", clock())
    order = new_order(reply_to=status_queue)
    await handle_submission(encode(order), rt)
    for service in ("inventory", "payment", "shipping"):
        await run_agent_step(rt, reader, order.order_id, service)
    assert (await rt.store.load(order.order_id)).state is ProcessState.PROCESSED
    assert statuses(status_client, status_queue, order.order_id, wait=1.0) == []

    clock.advance(301)  # the retry is due, and the process tries the queue again
    await run_tick(rt, budget_s=UNHURRIED_TICK_S)
    updates = [body for body, _ in statuses(status_client, status_queue, order.order_id)]
    assert [u["sequence"] for u in updates] == list(range(8))
    assert [u["state"] for u in updates if u["state"] in ("Processed", "Error")] == ["Processed"]
    generation = (await rt.store.load(order.order_id)).generation
    assert not await rt.store.index.has(order.order_id, generation)


@pytest.mark.parametrize("role", ["responses", "commands", "inventory"])
@pytest.mark.parametrize("case", [str.lower, str.upper])
async def test_a_reply_to_naming_an_app_queue_is_refused(rt, reader, role, case):
    order = new_order(reply_to=case(queue(rt, role)))
    await handle_submission(encode(order), rt)
    assert await rt.store.find(order.order_id) is None, "nothing is stored"
    alerts = alerts_for(rt, reader, order.order_id)
    assert [a["reason"] for a in alerts] == ["forbidden_reply_to"]
    assert reader.take(queue(rt, "inventory"), order.order_id, wait=0.5) is None
