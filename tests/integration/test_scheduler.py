"""The Scheduler's shell (service.apply, service.inbound, service.intake and service.replies)
against Azurite and the development Service Bus broker, awaited on one event loop with the
Runtime the app builds (its Table client, ``azure.servicebus.aio``).

Intake creates the order and sends its first request with the order's snapshot; a duplicate
submission writes nothing and sends nothing new; bad input is alerted; a reply is applied on
its snapshot without a read, and falls back to the read after a 412; a reply for an unknown
order is alerted; a send that fails after the write leaves the outbox, which the redelivered
message sends; an unreachable reply queue is alerted once and never holds the order up; an
unsigned message is refused. Table requests are counted at the client's request hook.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage
from azure.servicebus.exceptions import ServiceBusConnectionError, ServiceBusError

from adapters import clients
from adapters.op_counts import OperationCounts
from adapters.servicebus import Bus
from adapters.settings import Settings
from adapters.store.records import OrderRecords
from devstack.host.servicebus_runner import to_function_message
from domain.events import Replied
from domain.messages import (
    AgentRequest,
    AgentResponse,
    MessageBase,
    SignedBody,
    encode,
    parse_message,
)
from domain.order import Order
from domain.states import ProcessState
from service import apply, inbound, resume
from service.apply import Parked
from service.intake import handle_submission
from service.replies import handle_response
from service.runtime import Runtime, new_instance_id
from tests.support.app import QueueReader
from tests.support.pattern import alerts_for, new_order

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


# ------------------------------------------------------------------------------- fixtures


@pytest.fixture
def counts(monkeypatch) -> OperationCounts:
    """Table requests of the runtime (its clients report to adapters.clients.COUNTS)."""
    recorder = OperationCounts()
    monkeypatch.setattr(clients, "COUNTS", recorder)
    return recorder


@pytest.fixture
async def rt(env, clock, counts) -> AsyncIterator[Runtime]:
    """The Runtime on this test's fresh tables and the session broker, its requests counted."""
    runtime = Runtime.from_settings(
        Settings.from_env(env), OrderRecords, instance_id=new_instance_id("scheduler"), clock=clock
    )
    await runtime.store.ensure_tables()
    counts.reset()
    yield runtime
    await runtime.close()


@pytest.fixture
def sender(servicebus) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        yield client


class FailingBus:
    """The real bus, but sends to ``fail_to`` raise (a connection lost mid-send) while
    ``armed``; counts what it refused."""

    def __init__(self, inner: Bus, fail_to: str) -> None:
        self.inner = inner
        self.fail_to = fail_to
        self.armed = True
        self.refused = 0

    async def send(
        self, queue: str, message: MessageBase, *, scheduled_at: datetime | None = None
    ) -> None:
        if self.armed and queue == self.fail_to:
            self.refused += 1
            raise ServiceBusConnectionError(message=f"lost the link sending to {queue}")
        await self.inner.send(queue, message, scheduled_at=scheduled_at)

    async def close(self) -> None:
        await self.inner.close()


def q(rt: Runtime, role: str) -> str:
    return rt.settings.queue(role)


def take_request(rt: Runtime, reader: QueueReader, service: str, order_id: str) -> AgentRequest:
    return parse_message(reader.expect(q(rt, service), order_id), AgentRequest)


def succeeded(request: AgentRequest) -> AgentResponse:
    """The agent's answer to ``request``: done, echoing its snapshot."""
    return AgentResponse(
        order_id=request.order_id,
        step=request.step,
        operation=request.operation,
        attempt=request.attempt,
        idempotency_key=request.idempotency_key,
        outcome="succeeded",
        resume=request.resume,
    )


def reads(counts: OperationCounts) -> int:
    return counts.snapshot().get("table.get", 0)


def writes(counts: OperationCounts) -> int:
    return sum(n for kind, n in counts.snapshot().items() if kind != "table.get")


async def submitted(rt: Runtime, reader: QueueReader, **fields: Any) -> tuple[Order, AgentRequest]:
    """A new order through the intake: the order as stored and its first request."""
    order = new_order(**fields)
    await handle_submission(encode(order), rt)
    request = take_request(rt, reader, "inventory", order.order_id)
    return await rt.store.load(order.order_id), request


def alert_with(reader: QueueReader, rt: Runtime, marker: str) -> list[dict[str, Any]]:
    """Alerts now on the alerts queue whose JSON contains ``marker`` (taken off it)."""
    found = []

    def wanted(message: ServiceBusReceivedMessage) -> bool:
        return marker in b"".join(message.body).decode()

    while (message := reader.take_message(q(rt, "alerts"), wanted, wait=1.0)) is not None:
        found.append(json.loads(b"".join(message.body)))
    return found


# --------------------------------------------------------------------------------- intake


async def test_intake_creates_the_order_and_sends_its_first_request_with_its_snapshot(
    rt, reader, counts
):
    order = new_order()
    await handle_submission(encode(order), rt)
    spent = counts.snapshot()

    stored = await rt.store.load(order.order_id)
    assert (stored.state, stored.current_step, stored.attempt) == (
        ProcessState.PROCESSING,
        "reserve_inventory",
        1,
    )
    request = take_request(rt, reader, "inventory", order.order_id)
    assert (request.step, request.attempt) == ("reserve_inventory", 1)
    assert request.idempotency_key == f"{order.order_id}:reserve_inventory:do:1"
    assert request.resume is not None, "the request carries the order's snapshot"
    assert resume.restore(request.resume, order.order_id) == stored, "ETag included"
    assert reader.take(q(rt, "inventory"), order.order_id, wait=1.0) is None, "sent once"
    assert spent.get("table.get", 0) == 0, f"a create reads nothing: {spent}"
    assert spent == {"table.post": 2}, "the index row, then the order's one transaction"
    assert alerts_for(rt, reader, order.order_id) == []


async def test_a_duplicate_submission_writes_nothing_and_sends_nothing_new(rt, reader, counts):
    order = new_order()
    await handle_submission(encode(order), rt)
    stored = await rt.store.load(order.order_id)
    counts.reset()

    await handle_submission(encode(order), rt)  # the submission is redelivered

    # The create's batch is refused (the order exists), its index row is re-put, and the two
    # point reads (details, process) find the same payload: nothing of the order is written.
    assert counts.snapshot() == {"table.get": 2, "table.post": 2}
    assert await rt.store.load(order.order_id) == stored, "unchanged, ETag included"
    request = take_request(rt, reader, "inventory", order.order_id)
    assert request.attempt == 1
    assert reader.take(q(rt, "inventory"), order.order_id, wait=1.0) is None, (
        "the resent request is the same message: the broker drops the copy"
    )
    assert alerts_for(rt, reader, order.order_id) == []


async def test_the_same_id_with_another_payload_is_refused_and_alerted(rt, reader):
    stored, _ = await submitted(rt, reader)
    changed = new_order(order_id=stored.order_id, customer_id="c-2")

    await handle_submission(encode(changed), rt)

    assert await rt.store.load(stored.order_id) == stored
    (alert,) = alerts_for(rt, reader, stored.order_id)
    assert (alert["reason"], alert["severity"]) == ("conflicting_submission", "error")
    assert reader.take(q(rt, "inventory"), stored.order_id, wait=1.0) is None


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"items": []}, "bad_message"),
        ({"reply_to": "APP-QUEUE"}, "forbidden_reply_to"),
        ({"workflow_version": 99}, "unknown_workflow_version"),
    ],
    ids=["invalid", "reply_to an app queue", "workflow version not carried"],
)
async def test_a_submission_refused_before_anything_is_stored_is_alerted(
    rt, reader, counts, fields, reason
):
    order_id = f"o-{uuid.uuid4().hex[:12]}"
    body: dict[str, Any] = json.loads(encode(new_order(order_id=order_id)))
    if fields.get("reply_to") == "APP-QUEUE":
        fields = {"reply_to": q(rt, "responses").upper()}  # entity names ignore case
    body |= fields

    await handle_submission(json.dumps(body).encode(), rt)

    assert counts.snapshot() == {}, "no Table request"
    (alert,) = alerts_for(rt, reader, order_id)
    assert (alert["reason"], alert["severity"]) == (reason, "error")
    assert alert["raw_excerpt"], "the alert quotes what was refused"
    assert await rt.store.find(order_id) is None
    assert reader.take(q(rt, "inventory"), order_id, wait=1.0) is None


async def test_a_body_that_is_not_json_is_alerted(rt, reader, counts):
    marker = uuid.uuid4().hex
    await handle_submission(f"not json {marker}".encode(), rt)
    await handle_response(f"not json either {marker}".encode(), rt)

    assert counts.snapshot() == {}
    alerts = alert_with(reader, rt, marker)
    assert sorted(a["detail"].split(":")[0] for a in alerts) == [
        "rejected AgentResponse",
        "rejected OrderSubmitted",
    ]
    assert {(a["reason"], a["order_id"]) for a in alerts} == {("bad_message", None)}


# -------------------------------------------------------------------------------- replies


async def test_a_reply_is_applied_on_its_snapshot_without_a_read(rt, reader, counts):
    before, request = await submitted(rt, reader)
    counts.reset()

    await handle_response(encode(succeeded(request)), rt)

    spent = counts.snapshot()
    assert reads(counts) == 0, f"decided on the snapshot, no read: {spent}"
    assert writes(counts) == 1, f"one conditional batch: {spent}"
    after = await rt.store.load(before.order_id)
    assert (after.current_step, after.attempt) == ("charge_payment", 2)
    assert after.etag != before.etag
    payment = take_request(rt, reader, "payment", before.order_id)
    assert (payment.step, payment.attempt) == ("charge_payment", 2)
    assert resume.restore(payment.resume, before.order_id) == after, "the new snapshot"
    assert spent == {"table.post": 1}


async def test_a_reply_on_a_stale_snapshot_falls_back_to_a_read_after_the_412(rt, reader, counts):
    before, request = await submitted(rt, reader)
    reply = encode(succeeded(request))
    await handle_response(reply, rt)
    moved = await rt.store.load(before.order_id)
    assert take_request(rt, reader, "payment", before.order_id).attempt == 2
    counts.reset()

    await handle_response(reply, rt)  # redelivered: its snapshot is stale now

    spent = counts.snapshot()
    # The batch conditional on the snapshot's ETag is refused (412); the store reads the order
    # once to tell a lost race from its own retried write, and handle reads it to decide.
    assert spent == {"table.post": 1, "table.get": 2}
    assert await rt.store.load(before.order_id) == moved, "nothing written"
    assert reader.take(q(rt, "payment"), before.order_id, wait=1.0) is None, "sent once"
    assert alerts_for(rt, reader, before.order_id) == []


async def test_a_reply_whose_order_moved_on_is_decided_on_the_read(rt, reader, counts):
    """The order changed under the snapshot (another instance wrote it): the snapshot's write
    loses, the read shows the step still in flight, and the answer is applied on it."""
    before, request = await submitted(rt, reader)
    bumped = await rt.store.annotate(
        before, actor=rt.actor("operator"), event="note", detail="moved under the snapshot"
    )
    counts.reset()

    await handle_response(encode(succeeded(request)), rt)

    # 412 on the snapshot, the store's check read, handle's read, the write that wins.
    assert counts.snapshot() == {"table.post": 2, "table.get": 2}
    after = await rt.store.load(before.order_id)
    assert after.etag != bumped.etag
    assert (after.current_step, after.attempt) == ("charge_payment", 2)
    payment = take_request(rt, reader, "payment", before.order_id)
    assert resume.restore(payment.resume, before.order_id) == after


async def test_a_reply_for_an_unknown_order_is_alerted(rt, reader, counts):
    order_id = f"o-{uuid.uuid4().hex[:12]}"
    reply = AgentResponse(
        order_id=order_id,
        step="reserve_inventory",
        operation="do",
        attempt=1,
        idempotency_key=f"{order_id}:reserve_inventory:do:1",
        outcome="succeeded",
    )

    await handle_response(encode(reply), rt)

    assert counts.snapshot() == {"table.get": 1}, "one point read found nothing"
    (alert,) = alerts_for(rt, reader, order_id)
    assert (alert["reason"], alert["severity"]) == ("reply_for_unknown_order", "warning")
    assert "succeeded reply for step reserve_inventory" in alert["detail"]


async def test_a_reply_for_an_order_on_a_workflow_version_not_deployed_is_dropped(
    rt, reader, counts
):
    before, request = await submitted(rt, reader)
    rt.workflows = {}  # this deployment no longer carries the order's workflow
    counts.reset()

    await handle_response(encode(succeeded(request)), rt)  # logged and dropped, no raise

    assert writes(counts) == 0, counts.snapshot()
    assert await rt.store.load(before.order_id) == before
    (alert,) = alerts_for(rt, reader, before.order_id)
    assert (alert["reason"], alert["severity"]) == ("workflow_version_missing", "error")
    with pytest.raises(Parked):
        await apply.handle(rt, before.order_id, Replied(succeeded(request)), actor=rt.actor("t"))
    assert alerts_for(rt, reader, before.order_id) == [], (
        "the same text again within the duplicate-detection window is the same alert"
    )


# ----------------------------------------------------------------- a send fails after a write


async def test_a_send_that_fails_after_the_intake_write_is_made_good_by_the_redelivery(rt, reader):
    order = new_order()
    failing = FailingBus(rt.bus, q(rt, "inventory"))
    rt.bus = failing

    with pytest.raises(ServiceBusError):
        await handle_submission(encode(order), rt)

    stored = await rt.store.load(order.order_id)
    assert stored.state is ProcessState.PROCESSING, "written before the send"
    assert [type(o.message).__name__ for o in stored.outbox] == ["AgentRequest"]
    assert reader.take(q(rt, "inventory"), order.order_id, wait=1.0) is None

    failing.armed = False
    await handle_submission(encode(order), rt)  # the submission is redelivered

    request = take_request(rt, reader, "inventory", order.order_id)
    assert (request.attempt, request.idempotency_key) == (
        1,
        f"{order.order_id}:reserve_inventory:do:1",
    )
    assert resume.restore(request.resume, order.order_id) == stored
    assert await rt.store.load(order.order_id) == stored, "the redelivery wrote nothing"
    assert failing.refused == 1


async def test_a_send_that_fails_after_a_reply_write_is_made_good_by_the_redelivery(rt, reader):
    before, request = await submitted(rt, reader)
    failing = FailingBus(rt.bus, q(rt, "payment"))
    rt.bus = failing
    reply = encode(succeeded(request))

    with pytest.raises(ServiceBusError):
        await handle_response(reply, rt)

    moved = await rt.store.load(before.order_id)
    assert (moved.current_step, moved.attempt) == ("charge_payment", 2), "written"
    assert reader.take(q(rt, "payment"), before.order_id, wait=1.0) is None

    failing.armed = False
    await handle_response(reply, rt)  # redelivered: stale snapshot, 412, read, outbox resent

    payment = take_request(rt, reader, "payment", before.order_id)
    assert (payment.step, payment.attempt) == ("charge_payment", 2)
    assert resume.restore(payment.resume, before.order_id) == moved
    assert await rt.store.load(before.order_id) == moved, "the redelivery wrote nothing"
    assert reader.take(q(rt, "payment"), before.order_id, wait=1.0) is None


# ---------------------------------------------------------------------- the reply queue


async def test_an_unreachable_reply_queue_is_alerted_once_and_never_holds_the_order_up(rt, reader):
    missing = f"no-such-reply-{uuid.uuid4().hex[:8]}"
    first, request = await submitted(rt, reader, reply_to=missing)

    assert first.state is ProcessState.PROCESSING and request.attempt == 1, "the order went on"
    alerts = alerts_for(rt, reader, first.order_id)
    assert [(a["reason"], a["severity"]) for a in alerts] == [
        ("reply_queue_unavailable", "warning")
    ]
    assert missing in alerts[0]["detail"]

    # Remembered for the process: not tried again, not alerted.
    assert rt.refusing_queues.get(missing, rt.clock()) is not None
    second, first_request = await submitted(rt, reader, reply_to=missing.upper())
    await handle_response(encode(succeeded(first_request)), rt)
    assert (await rt.store.load(second.order_id)).current_step == "charge_payment"
    assert alerts_for(rt, reader, second.order_id) == []

    rt.refusing_queues.clear()
    assert rt.refusing_queues.get(missing, rt.clock()) is None


async def test_status_updates_reach_a_reply_queue_that_exists(rt, reader, servicebus):
    status_queue = servicebus.queue("order-status")
    stored, request = await submitted(rt, reader, reply_to=status_queue)
    await handle_response(encode(succeeded(request)), rt)

    found = []
    while (raw := reader.take(status_queue, stored.order_id, wait=2.0)) is not None:
        found.append(json.loads(raw))
    assert [(u["event"], u["sequence"]) for u in found] == [
        ("received", 0),
        ("step_started", 1),
        ("step_completed", 2),
        ("step_started", 3),
    ]
    assert alerts_for(rt, reader, stored.order_id) == []


# ------------------------------------------------------------------------------- inbound


async def test_only_a_message_the_app_signed_for_the_queue_is_handled(rt, reader, sender, counts):
    _, request = await submitted(rt, reader)
    queue = q(rt, "responses")
    await rt.bus.send(queue, succeeded(request))
    signed = reader.take_message(queue, lambda m: m.correlation_id == request.order_id)
    assert signed is not None
    genuine = inbound.Delivery.of(to_function_message(signed))

    trusted = await inbound.trusted_body(rt, genuine, "responses", "replies")
    assert trusted == genuine.body and isinstance(trusted, SignedBody)

    message_id = f"forged-{uuid.uuid4().hex[:12]}"
    with sender.get_queue_sender(queue) as s:
        s.send_messages(ServiceBusMessage(genuine.body, message_id=message_id))
    forged = reader.take_message(queue, lambda m: m.message_id == message_id)
    assert forged is not None
    counts.reset()

    delivery = inbound.Delivery.of(to_function_message(forged))
    assert await inbound.trusted_body(rt, delivery, "responses", "replies") is None

    assert counts.snapshot() == {}
    alerts = alert_with(reader, rt, message_id)
    assert [(a["reason"], a["severity"], a["order_id"]) for a in alerts] == [
        (inbound.UNTRUSTED_REASON, "critical", None)
    ]
    assert queue in alerts[0]["detail"]
