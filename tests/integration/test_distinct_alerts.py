"""Every distinct alert arrives; a redelivery raises none again (issue 28, item 3).

Against the development broker, whose duplicate detection drops a second message with the same
MessageId for ten minutes as Service Bus does: each message is sent to its real queue, received
as the Functions host receives it, and handed to the trigger's own code, on two hosts (two
runtimes, two instance ids) where the case needs them. The bodies are signed by the app (a
build that cannot read what another one sent), so they pass the door and are rejected as bad
messages, with identical text.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage

from agent.functions import on_request
from devstack.host.servicebus_runner import to_function_message
from domain.agents import AGENTS
from domain.lifecycle import UNREQUESTED_REASON
from domain.messages import AgentResponse, encode
from domain.signing import sign
from scheduler.functions import on_command, on_reply, on_submission
from service.intake import handle_submission
from service.runtime import Runtime
from tests.support.app import QueueReader, make_runtime
from tests.support.pattern import new_order, queue

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

AGENT = {agent.name: agent for agent in AGENTS}


@pytest.fixture
def sender(servicebus) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        yield client


@pytest.fixture
async def second_host(env, clock) -> AsyncIterator[Runtime]:
    """Another host of the same app: same settings and key, its own instance id."""
    runtime = await make_runtime(env, "second", clock)
    yield runtime
    await runtime.close()


def unreadable(order_id: str) -> bytes:
    """A request from a build this one cannot read: the same bytes wherever it is sent."""
    return json.dumps({"type": "AgentRequest", "schema_version": 2, "order_id": order_id}).encode()


def send_signed(
    rt, client: ServiceBusClient, reader: QueueReader, role: str, body: bytes
) -> ServiceBusReceivedMessage:
    """Send ``body`` to ``role``'s queue as the app does (signed for it); the message received."""
    queue_name, message_id = queue(rt, role), f"m-{uuid.uuid4().hex[:12]}"
    signature = sign(rt.settings.keyring, queue=queue_name, message_id=message_id, body=body)
    with client.get_queue_sender(queue_name) as s:
        s.send_messages(
            ServiceBusMessage(
                body, message_id=message_id, application_properties={"signature": signature}
            )
        )
    message = reader.take_message(queue_name, lambda m: m.message_id == message_id)
    assert message is not None, f"{message_id} never reached {queue_name}"
    return message


def alerts_about(rt, reader: QueueReader, order_id: str) -> list[dict]:
    found = []
    while (raw := reader.take(queue(rt, "alerts"), order_id, wait=1.0)) is not None:
        found.append(json.loads(raw))
    return found


async def test_two_agents_rejecting_identical_bodies_raise_two_alerts_and_a_redelivery_none(
    rt, second_host, reader, sender
):
    order_id = f"o-alerts-{uuid.uuid4().hex[:8]}"
    body = unreadable(order_id)
    payment = send_signed(rt, sender, reader, "payment", body)
    inventory = send_signed(rt, sender, reader, "inventory", body)
    again = send_signed(rt, sender, reader, "payment", body)  # the same bytes, another message

    await on_request(to_function_message(payment), AGENT["payment"], rt)
    await on_request(to_function_message(inventory), AGENT["inventory"], rt)
    await on_request(to_function_message(again), AGENT["payment"], rt)
    # The first message once more, on the other host: a redelivery, not a new event.
    await on_request(to_function_message(payment), AGENT["payment"], second_host)

    alerts = alerts_about(rt, reader, order_id)
    assert [a["reason"] for a in alerts] == ["bad_message"] * 3, alerts
    assert len({a["detail"] for a in alerts}) == 1, "the same text, three events"
    assert {a["caused_by"] for a in alerts} == {
        f"payment/{payment.message_id}",
        f"inventory/{inventory.message_id}",
        f"payment/{again.message_id}",
    }


async def test_identical_bad_submissions_are_two_alerts_and_a_command_redelivered_is_one(
    rt, second_host, reader, sender
):
    order_id = f"o-alerts-{uuid.uuid4().hex[:8]}"
    body = json.dumps({"type": "OrderSubmitted", "order_id": order_id}).encode()
    for _ in range(2):  # a submitter that sends the same bad order twice, as two messages
        with sender.get_queue_sender(queue(rt, "orders")) as s:
            s.send_messages(ServiceBusMessage(body))  # the SDK gives each its own MessageId
        # This order's (not a submission an earlier test left on the shared queue).
        submission = reader.take_message(
            queue(rt, "orders"), lambda m: order_id.encode() in b"".join(m.body)
        )
        assert submission is not None
        await on_submission(to_function_message(submission), rt)
    command = send_signed(rt, sender, reader, "commands", body.replace(b"OrderSubmitted", b"?"))
    await on_command(to_function_message(command), rt)
    await on_command(to_function_message(command), second_host)

    alerts = alerts_about(rt, reader, order_id)
    assert [a["reason"] for a in alerts] == ["bad_message"] * 3, alerts
    first, second = (a["caused_by"] for a in alerts[:2])
    assert first != second and first.startswith("orders/") and second.startswith("orders/")
    assert alerts[2]["caused_by"] == f"commands/{command.message_id}"


async def test_an_answer_never_asked_for_is_alerted_once_per_message_that_brought_it(
    rt, second_host, reader, sender
):
    """Issue 28's unrequested_answer under the same rule: two messages with the same forged
    answer are two alerts, a redelivery on the other host none."""
    order = new_order()
    await handle_submission(encode(order), rt)
    forged = AgentResponse(
        order_id=order.order_id,
        step="reserve_inventory",
        operation="undo",
        attempt=1,
        idempotency_key=f"{order.order_id}:reserve_inventory:undo:1",
        outcome="succeeded",
    )
    body = encode(forged)
    first = send_signed(rt, sender, reader, "responses", body)
    second = send_signed(rt, sender, reader, "responses", body)
    await on_reply(to_function_message(first), rt)
    await on_reply(to_function_message(second), rt)
    await on_reply(to_function_message(first), second_host)

    alerts = alerts_about(rt, reader, order.order_id)
    assert [a["reason"] for a in alerts] == [UNREQUESTED_REASON] * 2, alerts
    assert {a["caused_by"] for a in alerts} == {
        f"responses/{first.message_id}",
        f"responses/{second.message_id}",
    }
