"""The operations app sends to the scheduler-commands queue only (issue 40): its operator actions
and dead-letter replays, run as its HTTP function and the CLI run them, against Azurite and the
broker, put commands there and send nothing anywhere else; the pattern app's commands trigger
sends what they ask for. A forged command changes nothing and raises a security alert; a signed
replay command carrying a message the app did not sign for that queue, or naming no queue of
the app, sends nothing and raises one too."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import datetime

import pytest
from azure.servicebus import ServiceBusClient

from devstack.host.servicebus_runner import to_function_message
from domain.messages import AgentRequest, MessageBase, ReplayDeadLetter, SendOwed, encode
from domain.states import ProcessState
from orderctl.local import LocalOperations
from scheduler.functions import on_command
from service import inbound
from service.commands import handle_command
from service.intake import handle_submission
from tests.integration.test_operator_api import declined_order
from tests.integration.test_operator_workflows import REPLAY_WINDOW, dead_letter
from tests.integration.test_trusted_messages import forge, only_alert_for, take, untrusted_alerts
from tests.support.operations import OperationsApp, call, serving
from tests.support.pattern import new_order, queue

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.integration,
    pytest.mark.servicebus_config("tests/integration/replay_config.json"),
]


@pytest.fixture
def env(env, servicebus):
    """The inventory agent's queue is one whose duplicate detection window is 2 s
    (replay_config.json), so a dead letter of it can be replayed within a test."""
    return env | {"INVENTORY_REQUESTS_QUEUE": servicebus.queue("replay-inventory")}


@pytest.fixture
async def handlers(operations, rt) -> AsyncIterator[OperationsApp]:
    """The operations app on a composition root of this test's, around its Runtime."""
    async with serving(operations, rt) as app:
        yield app


class Recording:
    """A bus that notes the queue of every send in ``queues``, then sends."""

    def __init__(self, inner, queues: list[str]) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner
        self.queues = queues

    async def send(
        self, queue: str, message: MessageBase, *, scheduled_at: datetime | None = None
    ) -> None:
        self.queues.append(queue)
        await self.inner.send(queue, message, scheduled_at=scheduled_at)

    async def send_copy(self, queue: str, copy: ReplayDeadLetter) -> None:
        self.queues.append(queue)
        await self.inner.send_copy(queue, copy)


@contextmanager
def operations_sending(rt, sent: list[str]) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """While the operations app acts: note in ``sent`` the queues it sends to (its submitters'
    too)."""
    bus, status = rt.bus, rt.status_bus()
    rt.bus, rt._status_bus = Recording(bus, sent), Recording(status, sent)
    try:
        yield
    finally:
        rt.bus, rt._status_bus = bus, status


async def pattern_app_takes(rt, reader, kind: str) -> MessageBase:  # type: ignore[no-untyped-def]
    """The pattern app's commands trigger takes the next command of ``kind``."""
    found = reader.take_message(queue(rt, "commands"), lambda m: m.subject == kind)
    assert found is not None, f"no {kind} on the commands queue"
    await on_command(to_function_message(found), rt)
    return json.loads(b"".join(found.body))


async def test_operator_actions_send_only_to_the_commands_queue(rt, handlers, reader, fakes):
    errored = await declined_order(rt, reader, fakes)
    fakes.set_profile(None)
    in_flight = new_order()
    await handle_submission(encode(in_flight), rt)
    reader.expect(queue(rt, "inventory"), in_flight.order_id)  # its request, never answered

    sent: list[str] = []
    with operations_sending(rt, sent):
        status, resubmitted = await call(
            handlers, "resubmit_order", route={"order_id": errored}, body={"reason": "r"}
        )
    assert (status, resubmitted["state"]) == (202, "Processing")
    assert reader.take(queue(rt, "inventory"), errored, wait=1.0) is None, "nothing sent yet"
    await pattern_app_takes(rt, reader, "SendOwed")
    request = json.loads(reader.expect(queue(rt, "inventory"), errored))
    assert request["idempotency_key"] == f"{errored}:reserve_inventory:do:2"

    with operations_sending(rt, sent):
        status, cancelled = await call(
            handlers, "cancel_order", route={"order_id": errored}, body={"reason": "r"}
        )
        body = {"order_ids": [in_flight.order_id], "state": "Processing", "reason": "r"}
        status, bulk = await call(handlers, "bulk_cancel", body=body)
    assert (cancelled["state"], bulk["acted"]) == ("Compensating", 1)
    assert sent == [queue(rt, "commands")] * 3
    for _ in range(2):
        asked = await pattern_app_takes(rt, reader, "SendOwed")
        assert asked["requested_by"] == "operator:ops@example.com"
    undo = json.loads(reader.expect(queue(rt, "inventory"), errored))
    assert (undo["operation"], undo["undoes"]) == ("undo", request["idempotency_key"])
    other = json.loads(reader.expect(queue(rt, "inventory"), in_flight.order_id))
    assert other["operation"] == "undo"
    assert (await rt.store.load(in_flight.order_id)).state is ProcessState.COMPENSATING


async def test_a_dead_letter_of_an_agent_queue_is_sent_back_by_the_pattern_app(
    rt, servicebus, reader
):
    inventory = queue(rt, "inventory")
    order = new_order()
    await handle_submission(encode(order), rt)
    genuine = reader.take_message(inventory, lambda m: m.correlation_id == order.order_id)
    assert genuine is not None
    request = AgentRequest.model_validate_json(b"".join(genuine.body))
    await asyncio.sleep(REPLAY_WINDOW.total_seconds() + 0.2)  # the first send's window
    original = rt.bus.prepare(inventory, request)
    await dead_letter(servicebus, inventory, original)
    await asyncio.sleep(REPLAY_WINDOW.total_seconds() + 0.2)  # the dead letter's own
    ops = LocalOperations(rt, duplicate_window=REPLAY_WINDOW)
    try:
        page = await ops.list_dead_letters("inventory", limit=100)
        [number] = [i.sequence_number for i in page.items if i.message_id == original.message_id]
        sent: list[str] = []
        with operations_sending(rt, sent):
            done = await ops.replay_dead_letters(
                "inventory", operator="ann", sequence_numbers=[number], reason="service fixed"
            )
        assert [(i.outcome, i.order_id) for i in done.items] == [("replayed", order.order_id)]
        assert sent == [queue(rt, "commands")]
    finally:
        await ops.close()
    assert reader.take(inventory, order.order_id, wait=1.0) is None, (
        "not sent by the operations app"
    )

    asked = await pattern_app_takes(rt, reader, "ReplayDeadLetter")
    assert (asked["queue"], asked["sequence_number"]) == ("inventory", number)
    replayed = reader.take_message(inventory, lambda m: m.message_id == original.message_id)
    assert replayed is not None
    assert b"".join(replayed.body) == encode(request)
    delivery = inbound.Delivery(
        body=b"".join(replayed.body),
        message_id=replayed.message_id,
        properties=replayed.application_properties or {},
    )
    assert inbound.check(rt.settings.keyring, inventory, delivery) is None, "it still verifies"


def replay_of(rt, body: bytes, message_id: str, **fields) -> ReplayDeadLetter:  # type: ignore[no-untyped-def]
    return ReplayDeadLetter(
        **{
            "queue": "inventory",
            "sequence_number": 7,
            "message_id": message_id,
            "body": base64.b64encode(body).decode(),
            "properties": {},
            "requested_by": "operator:mallory",
        }
        | fields
    )


@pytest.fixture
def sender(servicebus) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        yield client


@pytest.fixture
def ghost_request() -> AgentRequest:
    return AgentRequest(
        order_id="o-ghost-1",
        step="reserve_inventory",
        operation="do",
        action="reserve",
        attempt=1,
        complete_by="2999-01-01T00:00:00Z",
        idempotency_key="o-ghost-1:reserve_inventory:do:1",
    )


async def test_forged_commands_change_nothing_and_raise_a_security_alert(
    rt, reader, sender, ghost_request
):
    commands = queue(rt, "commands")
    order = new_order()
    await handle_submission(encode(order), rt)
    reader.expect(queue(rt, "inventory"), order.order_id)
    before = await rt.store.load(order.order_id)

    owed = SendOwed(order_id=order.order_id, timeline_seq=0, requested_by="operator:mallory")
    replay = replay_of(rt, encode(ghost_request), "req:o-ghost-1:reserve_inventory:do:1:1")
    for forged in (owed, replay):
        message_id = forge(sender, commands, encode(forged))
        await on_command(to_function_message(take(reader, commands, message_id)), rt)
        alert = only_alert_for(rt, reader, commands, message_id, "unsigned")
        assert f"'{forged.MESSAGE_TYPE}'" in alert["detail"]
    assert (await rt.store.load(order.order_id)).etag == before.etag
    assert reader.take(queue(rt, "inventory"), None, wait=1.0) is None


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({}, "carries a message not signed for"),
        ({"queue": "nowhere"}, "names no queue of the app"),
    ],
)
async def test_a_signed_replay_of_a_message_the_app_did_not_sign_sends_nothing(
    rt, reader, ghost_request, change, problem
):
    """What a replay command can put on an internal queue is what the app signed for it, even
    when the command itself is signed (the operations app made to send anything)."""
    replay = replay_of(rt, encode(ghost_request), "req:o-ghost-1:reserve_inventory:do:1:1")
    cause = f"commands/replay-{uuid.uuid4().hex[:8]}"
    await handle_command(encode(replay.model_copy(update=change)), rt, caused_by=cause)
    assert reader.take(queue(rt, "inventory"), None, wait=1.0) is None
    [alert] = untrusted_alerts(rt, reader)
    assert (alert["severity"], alert["caused_by"]) == ("critical", cause)
    assert problem in alert["detail"] and "operator:mallory" in alert["detail"]
