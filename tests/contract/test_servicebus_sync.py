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
    AutoLockRenewer,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import (
    MessageLockLostError,
    MessageSizeExceededError,
    ServiceBusAuthenticationError,
    ServiceBusError,
)

from tests.support.broker import ServiceBusNamespace

pytestmark = pytest.mark.contract

# LockDuration of contract-lock-renew. 10 s, not the service's minimum of 5: a renewal may be
# that late on a loaded machine (fifty messages, CI workers sharing two cores) and still hold.
LOCK_RENEW_QUEUE_LOCK_S = 10


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


def test_auto_lock_renewer_holds_fifty_locks_on_one_receiver(sb_client, queue_named):
    # AutoLockRenewer renews each message from its own worker thread: many renew-lock requests
    # in flight at once on the receiver's one $management link (the SDK also races its own
    # delivery-ids when threads share a session; Service Bus takes that in its stride).
    queue = queue_named("contract-lock-renew")
    total, hold = 50, 3 * LOCK_RENEW_QUEUE_LOCK_S + 1
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"held-{i}") for i in range(total)])
    failures: list[str] = []
    with (
        sb_client.get_queue_receiver(queue, prefetch_count=total) as receiver,
        AutoLockRenewer(max_workers=8) as renewer,
    ):
        held = []
        while len(held) < total:
            batch = receiver.receive_messages(max_message_count=total - len(held), max_wait_time=5)
            assert batch, f"only {len(held)} of {total} arrived"
            held += batch
        first_locks = {m.sequence_number: m.locked_until_utc for m in held}
        for message in held:
            renewer.register(
                receiver,
                message,
                max_lock_renewal_duration=hold + 30,
                on_lock_renew_failure=lambda m, e: failures.append(f"{m.sequence_number}: {e!r}"),
            )
        time.sleep(hold)
        assert failures == []
        assert all(m.locked_until_utc > first_locks[m.sequence_number] for m in held)
        assert receive_one(sb_client, queue, wait=1) == [], "a held lock was let go"
        for message in held:
            receiver.complete_message(message)
    assert sorted(str(m) for m in held) == sorted(f"held-{i}" for i in range(total))
    assert receive_one(sb_client, queue, wait=1) == []


def test_concurrent_management_requests_on_one_link_get_their_own_answers(sb_client, queue_named):
    queue = queue_named("contract-basic")
    with sb_client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(6)])
    with sb_client.get_queue_receiver(queue) as receiver:
        messages = receiver.receive_messages(max_message_count=6, max_wait_time=5)
        while len(messages) < 6:
            messages += receiver.receive_messages(max_message_count=6, max_wait_time=5)
        deferred, kept = messages[:3], messages[3:]
        for message in deferred:
            receiver.defer_message(message)
        seqs = [m.sequence_number for m in deferred]
        results: dict[str, object] = {}

        def run(name: str, call) -> None:
            results[name] = call()

        calls = {
            f"renew-{m.sequence_number}": lambda m=m: receiver.renew_message_lock(m) for m in kept
        }
        calls |= {
            f"deferred-{seq}": lambda seq=seq: receiver.receive_deferred_messages([seq])
            for seq in seqs
        }
        calls["peek"] = lambda: receiver.peek_messages(max_message_count=10, sequence_number=1)
        threads = [threading.Thread(target=run, args=item) for item in calls.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert set(results) == set(calls)
        for seq in seqs:
            (again,) = results[f"deferred-{seq}"]
            assert again.sequence_number == seq
            receiver.complete_message(again)
        for message in kept:
            assert results[f"renew-{message.sequence_number}"] == message.locked_until_utc
            receiver.complete_message(message)
        assert {m.sequence_number for m in results["peek"]} >= {m.sequence_number for m in kept}


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


@pytest.mark.parametrize("side", ["sender", "receiver"])
def test_unknown_queue_is_not_found(contract_ns, side):
    # Service Bus refuses the CBS token for a missing entity with 404 "could not be found"
    # before any link attaches; the Python SDK (7.x, pyamqp) raises that as an authentication
    # error with the 404 inside (and retries it, hence retry_total=0). Nothing is auto-created.
    name = "no-such-queue-" + uuid.uuid4().hex[:8]
    with (
        ServiceBusClient.from_connection_string(contract_ns.connection_string, retry_total=0) as c,
        pytest.raises(ServiceBusAuthenticationError) as caught,
    ):
        if side == "sender":
            with c.get_queue_sender(name) as sender:
                sender.send_messages(ServiceBusMessage("lost"))
        else:
            with c.get_queue_receiver(name) as receiver:
                receiver.receive_messages(max_message_count=1, max_wait_time=1)
    token_failure = caught.value.inner_exception
    assert getattr(token_failure, "status_code", None) == 404
    assert "could not be found" in str(token_failure)


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


def test_sending_to_a_dead_letter_queue_is_refused(contract_ns: ServiceBusNamespace, queue_named):
    # Service Bus: "messages can only be submitted via the dead-letter operation of the parent
    # entity" (learn.microsoft.com, Overview of Service Bus dead-letter queues). A sender to
    # `<queue>/$deadletterqueue` fails; nothing lands in the dead-letter queue or the queue,
    # and the queue itself still takes sends.
    queue = queue_named("contract-basic")
    with ServiceBusClient.from_connection_string(contract_ns.connection_string, retry_total=0) as c:
        with pytest.raises(ServiceBusError):
            with c.get_queue_sender(f"{queue}/$deadletterqueue") as sender:
                sender.send_messages(ServiceBusMessage("smuggled", message_id="smuggled-1"))
        with c.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage("still serving"))
        assert receive_one(c, queue, wait=1, sub_queue=ServiceBusSubQueue.DEAD_LETTER) == []
        # Only sends are refused: its management operations (peek) work as on any queue.
        with c.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            assert dlq.peek_messages(max_message_count=10) == []
        (message,) = receive_one(c, queue)
        assert str(message) == "still serving"
