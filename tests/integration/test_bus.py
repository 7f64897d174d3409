"""The Bus (adapters.servicebus) against the development Service Bus broker, on one event loop.

Each message arrives with its MessageId, CorrelationId, Subject, schema_version and signature;
a scheduled one is held until its time; one sender per queue is reused, a sender whose send
failed is closed and forgotten, the least recently used one is closed past ``max_senders``, and
``close`` closes every sender and the client. A Runtime built from the app settings alerts and
replies through it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessageBatch, ServiceBusReceivedMessage
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.exceptions import ServiceBusError

from adapters.remote_http import CallFailed
from adapters.servicebus import Bus
from adapters.settings import Settings
from domain import signing
from domain.messages import (
    MessageBase,
    OperatorAlert,
    OrderSubmitted,
    StatusUpdate,
    encode,
    message_id_for,
    parse_message,
    utc_now,
)
from service.runtime import Runtime
from tests.support.app import app_settings
from tests.support.azurite import StorageAccount
from tests.support.broker import ServiceBusNamespace
from tests.support.keys import new_key_text

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

KEYRING = signing.parse_keyring(new_key_text("bus"))


def order(order_id: str) -> OrderSubmitted:
    return OrderSubmitted.model_validate(
        {
            "order_id": order_id,
            "customer_id": "c-1",
            "items": [{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 100}],
            "currency": "EUR",
        }
    )


def status(order_id: str, sequence: int = 0) -> StatusUpdate:
    return StatusUpdate(order_id=order_id, sequence=sequence, state="Processing")


def new_order_id() -> str:
    return f"o-bus-{uuid.uuid4().hex[:12]}"


class SpySender:
    """A real sender that records its sends (a batch counts its messages) and send calls, and
    whether it was closed."""

    def __init__(self, queue: str, sender: Any) -> None:
        self.queue = queue
        self.sender = sender
        self.sent = 0
        self.calls = 0
        self.closed = False

    async def create_message_batch(self) -> ServiceBusMessageBatch:
        return await self.sender.create_message_batch()

    async def send_messages(self, message: Any) -> None:
        self.calls += 1
        self.sent += len(message) if isinstance(message, ServiceBusMessageBatch) else 1
        await self.sender.send_messages(message)

    async def close(self) -> None:
        self.closed = True
        await self.sender.close()


class SpyClient:
    """A real client that records the senders it opened and whether it was closed."""

    def __init__(self, connection_string: str, **options: Any) -> None:
        self.client = ServiceBusClient.from_connection_string(connection_string, **options)
        self.senders: list[SpySender] = []
        self.closed = False

    def get_queue_sender(self, queue: str, **options: Any) -> SpySender:
        sender = SpySender(queue, self.client.get_queue_sender(queue, **options))
        self.senders.append(sender)
        return sender

    def opened(self, queue: str) -> list[SpySender]:
        return [s for s in self.senders if s.queue == queue]

    async def close(self) -> None:
        self.closed = True
        await self.client.close()


@pytest.fixture
def spies(servicebus: ServiceBusNamespace) -> Callable[..., tuple[Callable[[], Any], list]]:
    """``factory, made = spies(**client_options)``: a client factory and the clients it made."""

    def make(**options: Any) -> tuple[Callable[[], Any], list[SpyClient]]:
        made: list[SpyClient] = []

        def factory() -> SpyClient:
            made.append(SpyClient(servicebus.connection_string, **options))
            return made[-1]

        return factory, made

    return make


@pytest.fixture
async def receiving(servicebus: ServiceBusNamespace) -> AsyncIterator[ServiceBusClient]:
    async with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        yield client


async def take(
    client: ServiceBusClient, queue: str, message_ids: set[str], wait: float = 15.0
) -> dict[str, ServiceBusReceivedMessage]:
    """The messages of ``queue`` with these MessageIds, completed; others are discarded."""
    found: dict[str, ServiceBusReceivedMessage] = {}
    deadline = asyncio.get_running_loop().time() + wait
    async with client.get_queue_receiver(queue) as receiver:
        while set(found) != message_ids:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            for message in await receiver.receive_messages(
                max_message_count=20, max_wait_time=left
            ):
                await receiver.complete_message(message)
                if message.message_id in message_ids:
                    found[message.message_id] = message
    missing = message_ids - set(found)
    assert not missing, f"{sorted(missing)} never reached {queue}"
    return found


def prop(message: ServiceBusReceivedMessage, name: str) -> Any:
    return (message.application_properties or {}).get(name.encode())


async def test_a_message_arrives_with_its_ids_subject_version_and_signature(
    servicebus: ServiceBusNamespace, receiving: ServiceBusClient, spies: Callable[..., Any]
) -> None:
    queue = servicebus.queue("orders")
    factory, _ = spies()
    bus = Bus(factory, keyring=KEYRING)
    submitted = order(new_order_id())
    try:
        await bus.send(queue, submitted)
    finally:
        await bus.close()

    message_id = message_id_for(submitted)
    received = (await take(receiving, queue, {message_id}))[message_id]
    body = b"".join(received.body)
    assert body == encode(submitted)
    assert parse_message(body, OrderSubmitted) == submitted
    assert received.correlation_id == submitted.order_id
    assert received.subject == "OrderSubmitted"
    assert received.content_type == "application/json"
    assert prop(received, "schema_version") == 1
    verdict = signing.verify(
        KEYRING,
        signing.signature_of(received.application_properties),
        queue=queue,
        message_id=message_id,
        body=body,
    )
    assert verdict == signing.Verified("bus")


async def test_an_unsigned_bus_sends_no_signature(
    servicebus: ServiceBusNamespace, receiving: ServiceBusClient, spies: Callable[..., Any]
) -> None:
    queue = servicebus.queue("order-status")
    factory, _ = spies()
    bus = Bus(factory)
    update = status(new_order_id())
    try:
        await bus.send(queue, update)
    finally:
        await bus.close()
    message_id = message_id_for(update)
    received = (await take(receiving, queue, {message_id}))[message_id]
    assert signing.signature_of(received.application_properties) is None
    assert received.correlation_id == update.order_id


async def test_a_scheduled_message_is_held_until_its_time(
    servicebus: ServiceBusNamespace, receiving: ServiceBusClient, spies: Callable[..., Any]
) -> None:
    queue = servicebus.queue("order-status")
    factory, _ = spies()
    bus = Bus(factory, keyring=KEYRING)
    update = status(new_order_id())
    due = (utc_now() + timedelta(seconds=3)).replace(microsecond=0)
    try:
        await bus.send(queue, update, scheduled_at=due)
    finally:
        await bus.close()
    message_id = message_id_for(update)
    async with receiving.get_queue_receiver(queue) as receiver:
        peeked = await receiver.peek_messages(max_message_count=250)
    held = [m for m in peeked if m.message_id == message_id]
    assert held and held[0].scheduled_enqueue_time_utc == due
    received = (await take(receiving, queue, {message_id}))[message_id]
    assert received.scheduled_enqueue_time_utc == due
    assert utc_now() >= due


async def test_one_sender_per_queue_is_reused_and_sends_that_wait_go_as_one_batch(
    servicebus: ServiceBusNamespace, receiving: ServiceBusClient, spies: Callable[..., Any]
) -> None:
    queue = servicebus.queue("order-status")
    factory, made = spies()
    bus = Bus(factory, keyring=KEYRING)
    order_id = new_order_id()
    updates = [status(order_id, n) for n in range(12)]
    try:
        await bus.send(queue, updates[0])
        await asyncio.gather(*(bus.send(queue, u) for u in updates[1:]))
        # No keep-alive reads the link's connection on its own (servicebus.NO_KEEP_ALIVE).
        (open_sender,) = made[0].opened(queue)
        assert open_sender.sender._handler._keep_alive_thread is None
    finally:
        await bus.close()
    assert len(made) == 1
    (sender,) = made[0].opened(queue)
    assert sender.sent == len(updates)
    # The first of the eleven goes alone; the ten that waited for it, in one batch.
    assert sender.calls == 3
    received = await take(receiving, queue, {message_id_for(u) for u in updates})
    for update in updates:  # each arrives as a message of its own, as it was sent
        message = received[message_id_for(update)]
        body = b"".join(message.body)
        assert parse_message(body, StatusUpdate) == update
        assert message.correlation_id == order_id
        verdict = signing.verify(
            KEYRING,
            signing.signature_of(message.application_properties),
            queue=queue,
            message_id=message.message_id,
            body=body,
        )
        assert verdict == signing.Verified("bus")


async def test_sends_that_do_not_fit_one_batch_go_in_several(
    servicebus: ServiceBusNamespace, receiving: ServiceBusClient, spies: Callable[..., Any]
) -> None:
    queue = servicebus.queue("operator-alerts")
    factory, made = spies()
    bus = Bus(factory)
    order_id = new_order_id()
    # About 6.5 KB each: the 59 that wait for the first do not fit one 256 KiB batch.
    alerts = [
        OperatorAlert(
            order_id=order_id,
            severity="warning",
            reason="big",
            detail=f"{n} " + "x" * 4000,
            raw_excerpt="y" * 2000,
            source="test-bus",
        )
        for n in range(60)
    ]
    try:
        await bus.send(queue, alerts[0])
        await asyncio.gather(*(bus.send(queue, a) for a in alerts[1:]))
    finally:
        await bus.close()
    (sender,) = made[0].opened(queue)
    assert sender.sent == len(alerts) and sender.calls >= 4
    await take(receiving, queue, {message_id_for(a) for a in alerts})


async def test_a_failed_send_raises_and_forgets_its_sender(
    servicebus: ServiceBusNamespace, receiving: ServiceBusClient, spies: Callable[..., Any]
) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    queue = servicebus.queue("order-status")
    factory, made = spies(retry_total=0)
    bus = Bus(factory)
    try:
        with pytest.raises(ServiceBusError):
            await bus.send(missing, status(new_order_id()))
        (failed,) = made[0].opened(missing)
        assert failed.closed
        with pytest.raises(ServiceBusError):
            await bus.send(missing, status(new_order_id()))
        first, second = made[0].opened(missing)
        assert first is failed and second is not failed and second.closed
        # The bus itself is fine: the next send elsewhere goes through on the same client.
        update = status(new_order_id())
        await bus.send(queue, update)
    finally:
        await bus.close()
    assert len(made) == 1
    await take(receiving, queue, {message_id_for(update)})


async def test_past_max_senders_the_least_recently_used_sender_is_closed(
    servicebus: ServiceBusNamespace, receiving: ServiceBusClient, spies: Callable[..., Any]
) -> None:
    first, second, third = (
        servicebus.queue(name) for name in ("order-status", "operator-alerts", "orders")
    )
    factory, made = spies()
    bus = Bus(factory, max_senders=2)
    sent: dict[str, set[str]] = {first: set(), second: set(), third: set()}

    async def send(queue: str, message: MessageBase) -> None:
        await bus.send(queue, message)
        sent[queue].add(message_id_for(message))

    try:
        await send(first, status(new_order_id()))
        await send(second, status(new_order_id()))
        await send(first, status(new_order_id()))  # first is now the most recently used
        await send(third, order(new_order_id()))
        client = made[0]
        assert client.opened(second)[0].closed
        assert not client.opened(first)[0].closed and not client.opened(third)[0].closed
        await send(second, status(new_order_id()))  # a fresh sender; first goes now
        assert len(client.opened(second)) == 2 and not client.opened(second)[1].closed
        assert client.opened(first)[0].closed
        assert not client.opened(third)[0].closed
    finally:
        await bus.close()
    assert len(made) == 1
    for queue, message_ids in sent.items():
        await take(receiving, queue, message_ids)


async def test_close_closes_every_sender_and_the_client_and_a_later_send_reopens(
    servicebus: ServiceBusNamespace, receiving: ServiceBusClient, spies: Callable[..., Any]
) -> None:
    queues = [servicebus.queue(name) for name in ("order-status", "operator-alerts")]
    factory, made = spies()
    bus = Bus(factory)
    first = {queue: status(new_order_id()) for queue in queues}
    for queue, message in first.items():
        await bus.send(queue, message)
    await bus.close()
    (client,) = made
    assert client.closed
    assert [s.closed for s in client.senders] == [True, True]

    update = status(new_order_id())
    try:
        await bus.send(queues[0], update)
    finally:
        await bus.close()
    assert len(made) == 2 and made[1].closed and made[1].senders[0].closed
    await take(receiving, queues[0], {message_id_for(first[queues[0]]), message_id_for(update)})
    await take(receiving, queues[1], {message_id_for(first[queues[1]])})


async def test_a_runtime_from_settings_alerts_and_replies_through_the_broker(
    servicebus: ServiceBusNamespace,
    azurite: StorageAccount,
    receiving: ServiceBusClient,
    unique_name: Callable[[str], str],
) -> None:
    env = app_settings(
        servicebus,
        azurite.connection_string,
        lambda service: f"http://127.0.0.1:9/{service}",
        unique_name("t"),
    )
    rt = Runtime.from_settings(Settings.from_env(env))
    order_id = new_order_id()
    raised = OperatorAlert(
        order_id=order_id,
        severity="error",
        reason="step_failed",
        detail="the payment service refused",
        source=rt.actor("scheduler"),
    )
    update = status(order_id)
    reply_queue = servicebus.queue("order-status")
    try:
        await rt.store.ensure_tables()  # the store reaches Azurite
        await rt.alert(raised)
        await rt.status_bus().send(reply_queue, update)
        with pytest.raises(CallFailed):  # nothing listens there; the session is open now
            await rt.remote_http.post("payment", "charge", b"{}", {}, timeout=5)
        session = rt.remote_http._session
    finally:
        await rt.close()
    assert session is not None and session.closed

    alerts = rt.settings.queue("alerts")
    received = (await take(receiving, alerts, {message_id_for(raised)}))[message_id_for(raised)]
    assert parse_message(b"".join(received.body), OperatorAlert) == raised
    verdict = signing.verify(
        rt.settings.keyring,
        signing.signature_of(received.application_properties),
        queue=alerts,
        message_id=received.message_id,
        body=b"".join(received.body),
    )
    assert isinstance(verdict, signing.Verified)
    reply = (await take(receiving, reply_queue, {message_id_for(update)}))[message_id_for(update)]
    assert signing.signature_of(reply.application_properties) is None
