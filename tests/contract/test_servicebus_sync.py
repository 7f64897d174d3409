"""The Service Bus behaviour the application relies on, driven through the real sync SDK.

Each test states one behaviour of Azure Service Bus. They pass against the development broker
and are meant to pass unchanged against the official emulator or a real namespace.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import (
    MessageLockLostError,
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusError,
)

from tests.support.broker import ServiceBusNamespace

pytestmark = pytest.mark.contract


def receive_one(client: ServiceBusClient, queue: str, wait: float = 5, **kwargs):
    with client.get_queue_receiver(queue, **kwargs) as receiver:
        messages = receiver.receive_messages(max_message_count=1, max_wait_time=wait)
        return messages


def test_send_receive_complete_carries_metadata(sb_client, queue_named):
    queue = queue_named("contract-basic")
    before = datetime.now(UTC) - timedelta(seconds=2)
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages(
            ServiceBusMessage(
                b'{"order": 1}',
                message_id="order-1:submitted",
                correlation_id="order-1",
                subject="OrderSubmitted",
                content_type="application/json",
                application_properties={"kind": "order", "attempt": 2},
            )
        )
    with sb_client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert b"".join(message.body) == b'{"order": 1}'
        assert message.message_id == "order-1:submitted"
        assert message.correlation_id == "order-1"
        assert message.subject == "OrderSubmitted"
        assert message.content_type == "application/json"
        props = {
            k.decode() if isinstance(k, bytes) else k: v
            for k, v in message.application_properties.items()
        }
        assert props["attempt"] == 2
        assert props["kind"] in ("order", b"order")
        assert message.delivery_count == 0
        assert message.sequence_number >= 1
        assert message.enqueued_time_utc >= before
        assert message.locked_until_utc > datetime.now(UTC)
        assert message.lock_token is not None
        receiver.complete_message(message)
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []


def test_batches_arrive_whole_and_in_order(sb_client, queue_named):
    queue = queue_named("contract-basic")
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"list-{i}") for i in range(5)])
        batch = sender.create_message_batch()
        for i in range(5):
            batch.add_message(ServiceBusMessage(f"batch-{i}"))
        sender.send_messages(batch)
    bodies = []
    with sb_client.get_queue_receiver(queue) as receiver:
        while len(bodies) < 10:
            messages = receiver.receive_messages(max_message_count=10, max_wait_time=3)
            assert messages, f"only {len(bodies)} of 10 messages arrived"
            for message in messages:
                bodies.append(str(message))
                receiver.complete_message(message)
    assert bodies == [f"list-{i}" for i in range(5)] + [f"batch-{i}" for i in range(5)]


def test_abandon_redelivers_with_delivery_count_plus_one(sb_client, queue_named):
    queue = queue_named("contract-basic")
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("again"))
    with sb_client.get_queue_receiver(queue) as receiver:
        (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.abandon_message(first)
        (second,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert second.sequence_number == first.sequence_number
        assert second.delivery_count == first.delivery_count + 1
        receiver.complete_message(second)


def test_a_locked_message_goes_to_one_receiver_only(sb_client, queue_named):
    queue = queue_named("contract-basic")
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("only-once"))
    with (
        sb_client.get_queue_receiver(queue) as first,
        sb_client.get_queue_receiver(queue) as second,
    ):
        (held,) = first.receive_messages(max_message_count=1, max_wait_time=5)
        assert second.receive_messages(max_message_count=1, max_wait_time=1) == []
        first.complete_message(held)


def test_expired_lock_redelivers_and_stale_settlement_is_refused(sb_client, queue_named):
    queue = queue_named("contract-short-lock")
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("slow consumer"))
    with sb_client.get_queue_receiver(queue) as receiver:
        (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        time.sleep(max(0.0, (first.locked_until_utc - datetime.now(UTC)).total_seconds()) + 1)
        (again,) = receiver.receive_messages(max_message_count=1, max_wait_time=10)
        assert again.sequence_number == first.sequence_number
        assert again.delivery_count == first.delivery_count + 1
        with pytest.raises(MessageLockLostError):
            receiver.complete_message(first)
        receiver.complete_message(again)


def test_renew_lock_extends_locked_until(sb_client, queue_named):
    queue = queue_named("contract-short-lock")
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("long job"))
    with sb_client.get_queue_receiver(queue) as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        first_until = message.locked_until_utc
        time.sleep(2)
        renewed = receiver.renew_message_lock(message)
        assert renewed > first_until
        assert message.locked_until_utc == renewed
        time.sleep(4)  # past the original lock: the renewal kept it
        receiver.complete_message(message)


def test_max_delivery_count_dead_letters_with_reason(sb_client, queue_named):
    queue = queue_named("contract-dead-letter")  # MaxDeliveryCount 3
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("poison", message_id="poison-1"))
    with sb_client.get_queue_receiver(queue) as receiver:
        for expected_count in range(3):
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            assert message.delivery_count == expected_count
            receiver.abandon_message(message)
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
    with sb_client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (dead,) = dlq.receive_messages(max_message_count=1, max_wait_time=5)
        assert dead.message_id == "poison-1"
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
        assert dead.dead_letter_source == queue
        dlq.complete_message(dead)


def test_explicit_dead_letter_keeps_reason_and_description(sb_client, queue_named):
    queue = queue_named("contract-basic")
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("bad", application_properties={"keep": "me"}))
    with sb_client.get_queue_receiver(queue) as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.dead_letter_message(
            message, reason="SchemaInvalid", error_description="field 'total' is missing"
        )
    with sb_client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (dead,) = dlq.receive_messages(max_message_count=1, max_wait_time=5)
        assert str(dead) == "bad"
        assert dead.dead_letter_reason == "SchemaInvalid"
        assert dead.dead_letter_error_description == "field 'total' is missing"
        assert dead.application_properties[b"keep"] in (b"me", "me")
        dlq.complete_message(dead)


def test_scheduled_message_waits_until_its_time(sb_client, queue_named):
    queue = queue_named("contract-basic")
    due = datetime.now(UTC) + timedelta(seconds=6)
    with sb_client.get_queue_sender(queue) as sender:
        (seq,) = sender.schedule_messages(ServiceBusMessage("later"), due)
        assert seq >= 1
    with sb_client.get_queue_receiver(queue) as receiver:
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=10)
        assert datetime.now(UTC) >= due - timedelta(milliseconds=200)
        assert str(message) == "later"
        assert message.scheduled_enqueue_time_utc is not None
        receiver.complete_message(message)


def test_scheduled_enqueue_time_on_a_plain_send(sb_client, queue_named):
    queue = queue_named("contract-basic")
    due = datetime.now(UTC) + timedelta(seconds=6)
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("plain later", scheduled_enqueue_time_utc=due))
    with sb_client.get_queue_receiver(queue) as receiver:
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=10)
        assert datetime.now(UTC) >= due - timedelta(milliseconds=200)
        receiver.complete_message(message)


def test_cancelled_scheduled_message_never_arrives(sb_client, queue_named):
    queue = queue_named("contract-basic")
    due = datetime.now(UTC) + timedelta(seconds=2)
    with sb_client.get_queue_sender(queue) as sender:
        (seq,) = sender.schedule_messages(ServiceBusMessage("never"), due)
        sender.cancel_scheduled_messages(seq)
    time.sleep(2.5)
    assert receive_one(sb_client, queue, wait=1) == []


def test_peek_does_not_lock_or_count(sb_client, queue_named):
    queue = queue_named("contract-basic")
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"p{i}") for i in range(3)])
    with sb_client.get_queue_receiver(queue) as receiver:
        peeked = receiver.peek_messages(max_message_count=10)
        assert [str(m) for m in peeked] == ["p0", "p1", "p2"]
        messages = receiver.receive_messages(max_message_count=3, max_wait_time=5)
        assert [m.delivery_count for m in messages] == [0, 0, 0]
        for message in messages:
            receiver.complete_message(message)
        assert receiver.peek_messages(max_message_count=10) == []


def test_duplicate_message_ids_are_dropped_within_the_window(sb_client, queue_named):
    queue = queue_named("contract-dedup")
    run = uuid.uuid4().hex
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("first", message_id=f"{run}-a"))
        sender.send_messages(ServiceBusMessage("duplicate", message_id=f"{run}-a"))
        sender.send_messages(ServiceBusMessage("other", message_id=f"{run}-b"))
    with sb_client.get_queue_receiver(queue) as receiver:
        received = []
        while batch := receiver.receive_messages(max_message_count=10, max_wait_time=1.5):
            for message in batch:
                received.append(str(message))
                receiver.complete_message(message)
    assert received == ["first", "other"]


def test_message_ttl_expiry_dead_letters_when_configured(sb_client, queue_named):
    queue = queue_named("contract-dead-letter")  # DeadLetteringOnMessageExpiration true
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("stale", time_to_live=timedelta(seconds=1)))
    time.sleep(2)
    assert receive_one(sb_client, queue, wait=1) == []
    with sb_client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        (dead,) = dlq.receive_messages(max_message_count=1, max_wait_time=5)
        assert str(dead) == "stale"
        assert dead.dead_letter_reason == "TTLExpiredException"
        dlq.complete_message(dead)


def test_message_ttl_expiry_drops_when_not_dead_lettering(sb_client, queue_named):
    queue = queue_named("contract-basic")
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("gone", time_to_live=timedelta(seconds=1)))
    time.sleep(2)
    assert receive_one(sb_client, queue, wait=1) == []
    assert receive_one(sb_client, queue, wait=1, sub_queue=ServiceBusSubQueue.DEAD_LETTER) == []


def test_receive_and_delete_removes_on_delivery(sb_client, queue_named):
    queue = queue_named("contract-basic")
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("once"))
    with sb_client.get_queue_receiver(
        queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert str(message) == "once"
    assert receive_one(sb_client, queue, wait=1) == []


def test_deferred_message_is_received_by_sequence_number(sb_client, contract_ns, queue_named):
    queue = queue_named("contract-basic")
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("park me"))
    with sb_client.get_queue_receiver(queue) as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.defer_message(message)
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
        (deferred,) = receiver.receive_deferred_messages([message.sequence_number])
        assert str(deferred) == "park me"
        receiver.complete_message(deferred)
    with (
        ServiceBusClient.from_connection_string(contract_ns.connection_string, retry_total=0) as c,
        c.get_queue_receiver(queue) as receiver,
        pytest.raises(ServiceBusError),
    ):
        receiver.receive_deferred_messages([message.sequence_number])


def test_competing_receivers_each_message_once(contract_ns: ServiceBusNamespace, queue_named):
    queue = queue_named("contract-basic")
    total = 200
    with ServiceBusClient.from_connection_string(contract_ns.connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            for start in range(0, total, 50):
                sender.send_messages([ServiceBusMessage(str(i)) for i in range(start, start + 50)])
        seen: list[str] = []
        lock = threading.Lock()

        def consume() -> None:
            with ServiceBusClient.from_connection_string(contract_ns.connection_string) as own:
                with own.get_queue_receiver(queue) as receiver:
                    while batch := receiver.receive_messages(max_message_count=10, max_wait_time=2):
                        for message in batch:
                            receiver.complete_message(message)
                            with lock:
                                seen.append(str(message))

        workers = [threading.Thread(target=consume) for _ in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=60)
    assert sorted(seen, key=int) == [str(i) for i in range(total)]


def test_oversized_message_is_refused(sb_client, queue_named):
    queue = queue_named("contract-basic")
    with sb_client.get_queue_sender(queue) as sender:
        with pytest.raises(MessageSizeExceededError):
            sender.send_messages(ServiceBusMessage(b"x" * (300 * 1024)))
        sender.send_messages(ServiceBusMessage("still serving"))
    (message,) = receive_one(sb_client, queue)
    assert str(message) == "still serving"


def test_unknown_queue_is_not_found(contract_ns):
    # Service Bus refuses the CBS token for a missing entity with 404; the Python SDK surfaces
    # that as an authentication error (7.x drops the status text). Nothing is auto-created.
    name = "no-such-queue-" + uuid.uuid4().hex[:8]
    with (
        ServiceBusClient.from_connection_string(contract_ns.connection_string, retry_total=0) as c,
        pytest.raises((ServiceBusAuthenticationError, MessagingEntityNotFoundError)),
        c.get_queue_sender(name) as sender,
    ):
        sender.send_messages(ServiceBusMessage("lost"))


def test_wrong_key_is_refused(contract_ns: ServiceBusNamespace, queue_named):
    queue = queue_named("contract-basic")
    wrong = contract_ns.connection_string.replace("SharedAccessKey=", "SharedAccessKey=x")
    with ServiceBusClient.from_connection_string(wrong, retry_total=0) as client:
        with pytest.raises(ServiceBusAuthenticationError):
            with client.get_queue_sender(queue) as sender:
                sender.send_messages(ServiceBusMessage("intruder"))
    assert (
        receive_one(
            ServiceBusClient.from_connection_string(contract_ns.connection_string), queue, wait=1
        )
        == []
    )
