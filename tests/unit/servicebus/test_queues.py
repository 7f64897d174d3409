"""Service Bus queue semantics of the development broker, on a fake clock: locks, redelivery,
dead-lettering, scheduling, expiry, duplicate detection, deferral, rendering, persistence."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from proton import Message, symbol, timestamp

from devstack.servicebus import codec
from devstack.servicebus.auth import SharedAccessPolicy
from devstack.servicebus.broker import Broker
from devstack.servicebus.codec import Symbol
from devstack.servicebus.config import QueueSettings
from devstack.servicebus.persistence import SqlitePersistence
from devstack.servicebus.queues import (
    ACTIVE,
    DEFERRED,
    HOLDER_CLOSED,
    HOLDER_CLOSED_BY_BROKER,
    HOLDER_DROPPED,
    MAX_DELIVERY_COUNT_EXCEEDED,
    SCHEDULED,
    TTL_EXPIRED,
    Incoming,
    LockHolder,
    LockLost,
    NotFound,
    Queue,
    StoredMessage,
    parse_incoming,
)

T0 = 1_700_000_000.0
LOCK = 30.0

SETTINGS = QueueSettings(
    name="Orders",
    lock_duration=timedelta(seconds=LOCK),
    max_delivery_count=3,
    default_ttl=timedelta(hours=1),
    dead_letter_on_expiration=False,
    requires_duplicate_detection=True,
    duplicate_detection_window=timedelta(minutes=10),
)


def incoming(
    body: str = "hello",
    *,
    message_id: str | None = None,
    properties: dict[str, Any] | None = None,
    ttl: float | None = None,
    scheduled_at: float | None = None,
    durable: bool = False,
    priority: int | None = None,
) -> Incoming:
    """A message as a client encodes it, parsed the way the broker parses sends."""
    message = Message(body=body, id=message_id, properties=properties, durable=durable)
    if ttl is not None:
        message.ttl = ttl
    if priority is not None:
        message.priority = priority
    if scheduled_at is not None:
        message.annotations = {
            symbol("x-opt-scheduled-enqueue-time"): timestamp(int(scheduled_at * 1000))
        }
    return parse_incoming(message.encode())


def new_queue(**overrides: Any) -> Queue:
    return Queue.with_dead_letter_queue(replace(SETTINGS, **overrides))


def dlq(queue: Queue) -> Queue:
    assert queue.dead_letter_queue is not None
    return queue.dead_letter_queue


def lock(queue: Queue, now: float) -> tuple[StoredMessage, uuid.UUID, float]:
    locked = queue.lock_next(now)
    assert locked is not None, "expected a message to be available"
    return locked


def decoded(
    queue: Queue,
    message: StoredMessage,
    token: uuid.UUID | None = None,
    locked_until: float | None = None,
) -> Message:
    out = Message()
    out.decode(queue.render(message, token, locked_until))
    return out


def body_of(queue: Queue, message: StoredMessage) -> object:
    return decoded(queue, message).body


def app_properties(queue: Queue, message: StoredMessage) -> dict[str, Any]:
    """The application-properties section of the rendered message, decoded by our codec."""
    sections = codec.split_sections(queue.render(message))
    (section,) = [s for s in sections if s.code == codec.APPLICATION_PROPERTIES]
    return codec.section_value(section)


def drain_bodies(queue: Queue, now: float) -> list[object]:
    bodies = []
    while (locked := queue.lock_next(now)) is not None:
        message, token, _ = locked
        bodies.append(body_of(queue, message))
        queue.complete(token, now)
    return bodies


# --- parsing --------------------------------------------------------------------------------


def test_parse_incoming_reads_id_header_ttl_and_schedule() -> None:
    parsed = incoming(
        "x", message_id="m-1", ttl=12.5, durable=True, priority=9, scheduled_at=T0 + 60
    )
    assert parsed.message_id == "m-1"
    assert parsed.durable is True and parsed.priority == 9
    assert parsed.ttl_seconds == 12.5
    assert parsed.scheduled_at == T0 + 60
    sections = codec.split_sections(parsed.body)
    assert [s.code for s in sections] == [codec.PROPERTIES, codec.AMQP_VALUE]


@pytest.mark.parametrize(
    "raw",
    [
        codec.encode_header(False, 4, 0),
        codec.encode_header(False, 4, 0)
        + codec.described_section(codec.MESSAGE_ANNOTATIONS, codec.encode({Symbol("x"): 1})),
    ],
    ids=["header-only", "header-and-annotations"],
)
def test_parse_incoming_refuses_a_message_without_a_body_section(raw: bytes) -> None:
    """AMQP 1.0 (3.2) requires a body section. Accepting a message with none leaves it with an
    empty stored body, which dead-lettering cannot split: at MaxDeliveryCount, tick() raises
    CodecError and the message stays in `messages`, never delivered and never dead-lettered."""
    with pytest.raises(codec.CodecError):
        parse_incoming(raw)


# --- lock, complete, abandon ----------------------------------------------------------------


def test_lock_next_then_complete_removes_the_message() -> None:
    queue = new_queue()
    seq = queue.enqueue(incoming("a"), T0)
    assert seq == 1
    message, token, locked_until = lock(queue, T0)
    assert message.seq == 1 and locked_until == T0 + LOCK
    assert queue.lock_next(T0) is None, "a locked message is not handed out twice"
    queue.complete(token, T0 + 1)
    assert queue.messages == {}
    assert queue.lock_next(T0 + 1000) is None


def test_messages_are_handed_out_in_sequence_order() -> None:
    queue = new_queue()
    for body in "abc":
        queue.enqueue(incoming(body), T0)
    assert drain_bodies(queue, T0) == ["a", "b", "c"]


def test_abandon_increments_delivery_count_and_redelivers() -> None:
    queue = new_queue()
    queue.enqueue(incoming("a"), T0)
    _, token, _ = lock(queue, T0)
    queue.abandon(token, T0 + 1)
    message, token2, _ = lock(queue, T0 + 1)
    assert message.delivery_count == 1
    assert token2 != token
    assert decoded(queue, message, token2, T0 + 31).delivery_count == 1


def test_release_does_not_increment_delivery_count() -> None:
    queue = new_queue()
    queue.enqueue(incoming("a"), T0)
    _, token, _ = lock(queue, T0)
    queue.release(token, T0)
    message, _, _ = lock(queue, T0)
    assert message.delivery_count == 0


def test_lock_expiry_on_tick_redelivers_with_count_plus_one() -> None:
    queue = new_queue()
    queue.enqueue(incoming("a"), T0)
    _, token, _ = lock(queue, T0)
    queue.tick(T0 + LOCK - 0.001)
    assert queue.lock_next(T0 + LOCK - 0.001) is None, "still locked just before expiry"
    queue.tick(T0 + LOCK)
    message, _, _ = lock(queue, T0 + LOCK)
    assert message.delivery_count == 1
    with pytest.raises(LockLost):
        queue.complete(token, T0 + LOCK)


def test_renew_extends_the_lock() -> None:
    queue = new_queue()
    queue.enqueue(incoming("a"), T0)
    _, token, _ = lock(queue, T0)
    assert queue.renew(token, T0 + 20) == T0 + 20 + LOCK
    queue.tick(T0 + LOCK + 1)  # the original expiry has passed
    assert queue.lock_next(T0 + LOCK + 1) is None
    queue.complete(token, T0 + LOCK + 1)
    assert queue.messages == {}


@pytest.mark.parametrize("settle", ["complete", "abandon", "defer", "release", "renew"])
def test_stale_tokens_raise_lock_lost(settle: str) -> None:
    queue = new_queue()
    queue.enqueue(incoming("a"), T0)
    _, token, _ = lock(queue, T0)
    queue.complete(token, T0)
    with pytest.raises(LockLost, match="not held"):
        getattr(queue, settle)(token, T0)
    with pytest.raises(LockLost):
        getattr(queue, settle)(uuid.uuid4(), T0)


def test_settling_after_lock_expiry_raises_lock_lost_and_requeues() -> None:
    queue = new_queue()
    queue.enqueue(incoming("a"), T0)
    _, token, _ = lock(queue, T0)
    with pytest.raises(LockLost, match="expired"):
        queue.complete(token, T0 + LOCK)
    message, _, _ = lock(queue, T0 + LOCK)
    assert message.delivery_count == 1


# --- lock accounting -----------------------------------------------------------------------


def test_a_lock_that_expires_under_an_attached_holder_is_lost() -> None:
    queue = new_queue()
    queue.enqueue(incoming("a"), T0)
    holder = LockHolder("host-1/receiver")
    queue.lock_next(T0, holder)
    queue.tick(T0 + LOCK)
    assert (queue.stats.lock_lost, queue.stats.expired_after_crash) == (1, 0)
    lock(queue, T0 + LOCK)
    assert queue.stats.redelivered_after == {"lock_lost": 1}
    assert queue.stats.delivered == 2


def test_a_lock_whose_holder_dropped_expires_as_a_crash() -> None:
    queue = new_queue()
    queue.enqueue(incoming("a"), T0)
    holder = LockHolder("host-1/receiver")
    queue.lock_next(T0, holder)
    holder.leave(HOLDER_DROPPED)
    holder.leave(HOLDER_CLOSED)  # the first way it went stands
    queue.tick(T0 + LOCK)
    assert (queue.stats.lock_lost, queue.stats.expired_after_crash) == (0, 1)
    lock(queue, T0 + LOCK)
    assert queue.stats.redelivered_after == {"holder_crashed": 1}


@pytest.mark.parametrize("how", [HOLDER_CLOSED, HOLDER_CLOSED_BY_BROKER])
def test_a_lock_whose_holder_closed_alive_is_lost(how: str) -> None:
    """A receiver that detached (or was detached by the broker) while holding a message was
    alive: nobody could settle or renew the message any more, and that is lock loss."""
    queue = new_queue()
    queue.enqueue(incoming("a"), T0)
    holder = LockHolder("host-1/receiver")
    queue.lock_next(T0, holder)
    holder.leave(how)
    queue.tick(T0 + LOCK)
    assert (queue.stats.lock_lost, queue.stats.expired_after_crash) == (1, 0)


def test_a_settlement_after_expiry_is_a_lost_lock_and_a_refusal() -> None:
    queue = new_queue()
    queue.enqueue(incoming("a"), T0)
    _, token, _ = lock(queue, T0)
    with pytest.raises(LockLost):
        queue.complete(token, T0 + LOCK)
    with pytest.raises(LockLost):
        queue.renew(token, T0 + LOCK)
    assert (queue.stats.lock_lost, queue.stats.refused_lock_lost) == (1, 2)


def test_renewed_and_settled_locks_are_never_lost() -> None:
    queue = new_queue()
    queue.enqueue(incoming("a"), T0)
    _, token, _ = lock(queue, T0)
    for n in range(1, 4):
        queue.renew(token, T0 + n * (LOCK - 1))
        queue.tick(T0 + n * (LOCK - 1))
    queue.complete(token, T0 + 3 * LOCK)
    queue.tick(T0 + 10 * LOCK)
    assert queue.stats.as_dict() == {
        "delivered": 1,
        "completed": 1,
        "abandoned": 0,
        "lock_lost": 0,
        "expired_after_crash": 0,
        "refused_lock_lost": 0,
        "redelivered_after": {},
    }


def test_redeliveries_are_counted_by_what_ended_the_delivery_before() -> None:
    queue = new_queue(max_delivery_count=10)
    queue.enqueue(incoming("a"), T0)
    _, token, _ = lock(queue, T0)
    queue.abandon(token, T0)
    _, token, _ = lock(queue, T0)
    queue.release(token, T0)
    _, token, _ = lock(queue, T0)
    queue.defer(token, T0)
    ((_, token),) = queue.lock_deferred([1], T0)
    queue.complete(token, T0)
    assert queue.stats.redelivered_after == {"abandoned": 1, "deferred": 1, "released": 1}
    assert (queue.stats.delivered, queue.stats.completed, queue.stats.abandoned) == (4, 1, 1)
    assert queue._ended == {}, "nothing is remembered about a message that is gone"


def test_a_message_dead_lettered_at_its_last_lost_lock_leaves_no_cause_behind() -> None:
    queue = new_queue()
    queue.enqueue(incoming("slow"), T0)
    now = T0
    for _ in range(SETTINGS.max_delivery_count):
        lock(queue, now)
        now += LOCK
        queue.tick(now)
    assert queue.stats.lock_lost == SETTINGS.max_delivery_count
    assert queue.stats.redelivered_after == {"lock_lost": SETTINGS.max_delivery_count - 1}
    assert queue._ended == {}


# --- dead-lettering -------------------------------------------------------------------------


def test_max_delivery_count_moves_the_message_to_the_dead_letter_queue() -> None:
    queue = new_queue()
    queue.enqueue(incoming("poison", message_id="p-1", properties={"kind": "order"}), T0)
    for attempt in range(SETTINGS.max_delivery_count):
        message, token, _ = lock(queue, T0 + attempt)
        assert message.delivery_count == attempt
        queue.abandon(token, T0 + attempt)
    assert queue.messages == {}
    assert queue.lock_next(T0 + 10) is None
    (dead,) = dlq(queue).messages.values()
    assert dead.delivery_count == SETTINGS.max_delivery_count
    assert dead.message_id == "p-1"
    props = app_properties(dlq(queue), dead)
    assert props["DeadLetterReason"] == MAX_DELIVERY_COUNT_EXCEEDED
    assert "3 delivery attempts" in props["DeadLetterErrorDescription"]
    assert props["kind"] == "order", "the sender's properties are kept"
    rendered = decoded(dlq(queue), dead)
    assert rendered.body == "poison"
    assert rendered.annotations[symbol("x-opt-deadletter-source")] == "Orders"
    assert rendered.properties["DeadLetterReason"] == MAX_DELIVERY_COUNT_EXCEEDED


def test_lock_expiries_count_towards_max_delivery_count() -> None:
    queue = new_queue()
    queue.enqueue(incoming("slow"), T0)
    now = T0
    for _ in range(SETTINGS.max_delivery_count):
        lock(queue, now)
        now += LOCK
        queue.tick(now)
    assert queue.messages == {}
    (dead,) = dlq(queue).messages.values()
    assert app_properties(dlq(queue), dead)["DeadLetterReason"] == MAX_DELIVERY_COUNT_EXCEEDED


def test_explicit_dead_letter_keeps_reason_description_and_properties() -> None:
    queue = new_queue()
    queue.enqueue(incoming("bad", properties={"attempt": 2, "DeadLetterReason": "old"}), T0)
    _, token, _ = lock(queue, T0)
    queue.dead_letter(token, T0, "Operator", "parked for review")
    (dead,) = dlq(queue).messages.values()
    assert dead.delivery_count == 0
    assert app_properties(dlq(queue), dead) == {
        "attempt": 2,
        "DeadLetterReason": "Operator",
        "DeadLetterErrorDescription": "parked for review",
    }
    assert decoded(dlq(queue), dead).body == "bad"


def test_dead_letter_adds_application_properties_when_the_message_had_none() -> None:
    queue = new_queue()
    queue.enqueue(incoming("plain"), T0)
    _, token, _ = lock(queue, T0)
    queue.dead_letter(token, T0, "R", "D")
    (dead,) = dlq(queue).messages.values()
    codes = [s.code for s in codec.split_sections(dead.body)]
    assert codes == [codec.PROPERTIES, codec.APPLICATION_PROPERTIES, codec.AMQP_VALUE]
    assert app_properties(dlq(queue), dead)["DeadLetterReason"] == "R"


def test_dead_letter_queue_messages_can_be_received_and_never_re_dead_lettered() -> None:
    queue = new_queue()
    queue.enqueue(incoming("x"), T0)
    _, token, _ = lock(queue, T0)
    queue.dead_letter(token, T0, "R", "D")
    dead_queue = dlq(queue)
    for attempt in range(SETTINGS.max_delivery_count + 2):
        _, token, _ = lock(dead_queue, T0 + attempt)
        dead_queue.abandon(token, T0 + attempt)
    assert len(dead_queue.messages) == 1, "abandoning in the DLQ never drops the message"
    _, token, _ = lock(dead_queue, T0 + 100)
    dead_queue.complete(token, T0 + 100)
    assert dead_queue.messages == {}


# --- scheduling -----------------------------------------------------------------------------


def test_scheduled_message_is_invisible_until_due() -> None:
    queue = new_queue()
    seq = queue.enqueue(incoming("later", scheduled_at=T0 + 60), T0)
    assert seq is not None
    assert queue.messages[seq].state == SCHEDULED
    queue.tick(T0 + 59.9)
    assert queue.lock_next(T0 + 59.9) is None
    queue.tick(T0 + 60)
    message, token, until = lock(queue, T0 + 60)
    assert message.seq == seq
    rendered = decoded(queue, message, token, until)
    assert rendered.annotations[symbol("x-opt-enqueued-time")] == int((T0 + 60) * 1000)
    assert rendered.annotations[symbol("x-opt-scheduled-enqueue-time")] == int((T0 + 60) * 1000)


def test_schedule_in_the_past_is_available_at_once() -> None:
    queue = new_queue()
    queue.enqueue(incoming("now", scheduled_at=T0 - 5), T0)
    assert drain_bodies(queue, T0) == ["now"]


def test_schedule_and_cancel_scheduled() -> None:
    queue = new_queue()
    keep = queue.schedule(incoming("keep"), T0 + 10, T0)
    drop = queue.schedule(incoming("drop"), T0 + 10, T0)
    queue.cancel_scheduled([drop])
    assert drop not in queue.messages
    with pytest.raises(NotFound):
        queue.cancel_scheduled([drop])
    queue.tick(T0 + 10)
    assert drain_bodies(queue, T0 + 10) == ["keep"]
    with pytest.raises(NotFound):
        queue.cancel_scheduled([keep])


def test_cancel_scheduled_refuses_an_active_message() -> None:
    queue = new_queue()
    seq = queue.enqueue(incoming("active"), T0)
    assert seq is not None
    with pytest.raises(NotFound):
        queue.cancel_scheduled([seq])
    assert seq in queue.messages


# --- time to live ---------------------------------------------------------------------------


def test_expired_messages_are_dropped_without_dead_lettering() -> None:
    queue = new_queue(dead_letter_on_expiration=False)
    queue.enqueue(incoming("short", ttl=5), T0)
    queue.enqueue(incoming("default"), T0)
    queue.tick(T0 + 5)
    assert [m.seq for m in queue.messages.values()] == [2]
    assert dlq(queue).messages == {}
    queue.tick(T0 + 3600)
    assert queue.messages == {} and dlq(queue).messages == {}


def test_expired_messages_are_dead_lettered_when_configured() -> None:
    queue = new_queue(dead_letter_on_expiration=True)
    queue.enqueue(incoming("short", ttl=5, properties={"p": 1}), T0)
    queue.tick(T0 + 5)
    assert queue.messages == {}
    (dead,) = dlq(queue).messages.values()
    assert app_properties(dlq(queue), dead) == {
        "p": 1,
        "DeadLetterReason": TTL_EXPIRED,
        "DeadLetterErrorDescription": "The message expired and was dead lettered.",
    }
    dlq(queue).tick(T0 + 10**9)
    assert len(dlq(queue).messages) == 1, "dead letters never expire"


def test_expiry_is_noticed_on_receive_between_ticks() -> None:
    queue = new_queue(dead_letter_on_expiration=True)
    queue.enqueue(incoming("short", ttl=5), T0)
    assert queue.lock_next(T0 + 6) is None
    assert len(dlq(queue).messages) == 1


def test_message_ttl_cannot_exceed_the_queue_default() -> None:
    queue = new_queue(default_ttl=timedelta(seconds=10))
    seq = queue.enqueue(incoming("long", ttl=3600), T0)
    assert seq is not None
    assert queue.messages[seq].expires_at == T0 + 10


def test_a_locked_message_is_not_expired_under_its_holder() -> None:
    queue = new_queue(dead_letter_on_expiration=True)
    queue.enqueue(incoming("short", ttl=5), T0)
    _, token, _ = lock(queue, T0)
    queue.tick(T0 + 6)
    queue.complete(token, T0 + 7)
    assert queue.messages == {} and dlq(queue).messages == {}


def test_scheduled_message_ttl_counts_from_its_enqueue_time() -> None:
    queue = new_queue()
    queue.enqueue(incoming("later", ttl=5, scheduled_at=T0 + 100), T0)
    queue.tick(T0 + 100)
    queue.tick(T0 + 104)
    assert drain_bodies(queue, T0 + 104) == ["later"]


# --- duplicate detection --------------------------------------------------------------------


def test_duplicates_within_the_window_are_dropped() -> None:
    queue = new_queue()
    assert queue.enqueue(incoming("first", message_id="d-1"), T0) == 1
    assert queue.enqueue(incoming("again", message_id="d-1"), T0 + 599) is None
    assert queue.enqueue(incoming("other", message_id="d-2"), T0 + 599) == 2
    assert queue.enqueue(incoming("no id"), T0 + 599) == 3
    assert queue.enqueue(incoming("no id"), T0 + 599) == 4, "messages without an id are kept"
    assert drain_bodies(queue, T0 + 600) == ["first", "other", "no id", "no id"]


def test_duplicate_ids_are_forgotten_after_the_window() -> None:
    queue = new_queue()
    queue.enqueue(incoming("first", message_id="d-1"), T0)
    _, token, _ = lock(queue, T0)
    queue.complete(token, T0)
    assert queue.enqueue(incoming("dup", message_id="d-1"), T0 + 600) is None, "window inclusive"
    assert queue.enqueue(incoming("new", message_id="d-1"), T0 + 600.5) is not None
    assert drain_bodies(queue, T0 + 601) == ["new"]


def test_duplicate_detection_off_keeps_every_copy() -> None:
    queue = new_queue(requires_duplicate_detection=False)
    queue.enqueue(incoming("a", message_id="same"), T0)
    queue.enqueue(incoming("b", message_id="same"), T0)
    assert drain_bodies(queue, T0) == ["a", "b"]


def test_scheduling_a_duplicate_returns_zero() -> None:
    queue = new_queue()
    assert queue.schedule(incoming("a", message_id="s-1"), T0 + 5, T0) == 1
    assert queue.schedule(incoming("b", message_id="s-1"), T0 + 5, T0) == 0
    assert len(queue.messages) == 1


# --- deferral -------------------------------------------------------------------------------


def test_defer_then_receive_by_sequence_number() -> None:
    queue = new_queue()
    queue.enqueue(incoming("later"), T0)
    queue.enqueue(incoming("next"), T0)
    message, token, _ = lock(queue, T0)
    queue.defer(token, T0)
    assert queue.messages[message.seq].state == DEFERRED
    assert body_of(queue, lock(queue, T0)[0]) == "next", "deferred messages are skipped"
    assert queue.lock_next(T0) is None
    ((again, token2),) = queue.lock_deferred([message.seq], T0 + 1)
    assert again.seq == message.seq and body_of(queue, again) == "later"
    queue.complete(token2, T0 + 1)
    assert message.seq not in queue.messages


def test_lock_deferred_refuses_messages_that_are_not_deferred() -> None:
    queue = new_queue()
    seq = queue.enqueue(incoming("active"), T0)
    assert seq is not None
    with pytest.raises(NotFound):
        queue.lock_deferred([seq], T0)
    with pytest.raises(NotFound):
        queue.lock_deferred([999], T0)
    assert queue.messages[seq].state == ACTIVE


def test_abandoned_deferred_message_stays_deferred() -> None:
    """Service Bus keeps a deferred message deferred when its receiver abandons it (the
    delivery count goes up; it is still only receivable by sequence number)."""
    queue = new_queue()
    queue.enqueue(incoming("deferred"), T0)
    message, token, _ = lock(queue, T0)
    queue.defer(token, T0)
    ((_, token2),) = queue.lock_deferred([message.seq], T0)
    queue.abandon(token2, T0)
    assert queue.messages[message.seq].delivery_count == 1
    assert queue.lock_next(T0) is None, "an abandoned deferred message must not become active"
    assert queue.messages[message.seq].state == DEFERRED
    ((again, _),) = queue.lock_deferred([message.seq], T0)
    assert again.seq == message.seq


def test_lock_expiry_on_a_deferred_message_leaves_it_deferred() -> None:
    queue = new_queue()
    queue.enqueue(incoming("deferred"), T0)
    message, token, _ = lock(queue, T0)
    queue.defer(token, T0)
    queue.lock_deferred([message.seq], T0)
    queue.tick(T0 + LOCK)
    assert queue.lock_next(T0 + LOCK) is None, "a deferred message must not become active"
    assert queue.messages[message.seq].state == DEFERRED


def test_receiving_an_expired_deferred_message_dead_letters_it() -> None:
    """Deferred messages are not expired by the clock, but receiving one by sequence number
    after its TTL moves it to the dead-letter queue (when the queue dead-letters on expiry)."""
    queue = new_queue(dead_letter_on_expiration=True)
    queue.enqueue(incoming("deferred", ttl=10), T0)
    message, token, _ = lock(queue, T0)
    queue.defer(token, T0)
    queue.tick(T0 + 60)
    assert queue.messages[message.seq].state == DEFERRED, "the clock alone does not expire it"
    with pytest.raises(NotFound):
        queue.lock_deferred([message.seq], T0 + 60)
    (dead,) = dlq(queue).messages.values()
    assert app_properties(dlq(queue), dead)["DeadLetterReason"] == TTL_EXPIRED


# --- peek -----------------------------------------------------------------------------------


def test_peek_does_not_lock_and_sees_every_state() -> None:
    queue = new_queue()
    queue.enqueue(incoming("a"), T0)
    queue.enqueue(incoming("b"), T0)
    queue.enqueue(incoming("c", scheduled_at=T0 + 100), T0)
    peeked = queue.peek(1, 10)
    assert [m.seq for m in peeked] == [1, 2, 3]
    assert queue.locks == {}
    assert [m.seq for m in queue.peek(2, 1)] == [2]
    assert queue.peek(4, 10) == []
    message, _, _ = lock(queue, T0)
    assert message.seq == 1, "peek left the first message available"
    assert [m.seq for m in queue.peek(1, 10)] == [1, 2, 3], "peek shows locked messages too"
    rendered = decoded(queue, queue.peek(1, 1)[0])
    assert symbol("x-opt-lock-token") not in rendered.annotations


# --- rendering ------------------------------------------------------------------------------


def test_render_header_and_annotations_decode_through_proton() -> None:
    queue = new_queue()
    client_annotations = {symbol("x-opt-partition-key"): "pk"}
    raw = Message(body="payload", id="r-1", durable=True, priority=6)
    raw.annotations = client_annotations
    queue.enqueue(parse_incoming(raw.encode()), T0 + 0.25)
    _, token, _ = lock(queue, T0 + 0.25)
    queue.abandon(token, T0 + 1)
    message, token, locked_until = lock(queue, T0 + 2)
    out = decoded(queue, message, token, locked_until)
    assert out.durable is True and out.priority == 6
    assert out.delivery_count == 1
    assert out.body == "payload" and out.id == "r-1"
    annotations = out.annotations
    assert annotations[symbol("x-opt-sequence-number")] == message.seq
    assert annotations[symbol("x-opt-enqueued-time")] == int((T0 + 0.25) * 1000)
    assert isinstance(annotations[symbol("x-opt-enqueued-time")], timestamp)
    assert annotations[symbol("x-opt-locked-until")] == int((T0 + 2 + LOCK) * 1000)
    assert isinstance(annotations[symbol("x-opt-locked-until")], timestamp)
    assert annotations[symbol("x-opt-lock-token")] == token
    assert isinstance(annotations[symbol("x-opt-lock-token")], uuid.UUID)
    assert annotations[symbol("x-opt-partition-key")] == "pk", "client annotations are kept"


def test_render_keeps_the_client_body_bytes() -> None:
    queue = new_queue()
    parsed = incoming("exact", properties={"n": 1})
    queue.enqueue(parsed, T0)
    message, token, until = lock(queue, T0)
    assert queue.render(message, token, until).endswith(parsed.body)


# --- persistence ----------------------------------------------------------------------------


@dataclass
class RecordingPersistence:
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def save(self, queue: str, message: StoredMessage, next_seq: int) -> None:
        self.calls.append(("save", queue, message.seq, message.state, next_seq))

    def delete(self, queue: str, seq: int) -> None:
        self.calls.append(("delete", queue, seq))

    def update(self, queue: str, message: StoredMessage) -> None:
        self.calls.append(("update", queue, message.seq, message.state, message.delivery_count))

    def remember_id(self, queue: str, message_id: str, at: float) -> None:
        self.calls.append(("remember_id", queue, message_id, at))

    def forget_ids_before(self, queue: str, cutoff: float) -> None:
        self.calls.append(("forget_ids_before", queue, cutoff))

    def take(self) -> list[tuple[Any, ...]]:
        calls, self.calls = self.calls, []
        return calls


def test_every_change_is_written_through() -> None:
    store = RecordingPersistence()
    queue = Queue.with_dead_letter_queue(SETTINGS, store)
    dead = "Orders/$deadletterqueue"

    queue.enqueue(incoming("a", message_id="id-a"), T0)
    assert store.take() == [("remember_id", "Orders", "id-a", T0), ("save", "Orders", 1, ACTIVE, 2)]
    assert queue.enqueue(incoming("a", message_id="id-a"), T0) is None
    assert store.take() == [], "a dropped duplicate writes nothing"

    _, token, _ = lock(queue, T0)
    assert store.take() == [], "locks are not persisted"
    queue.abandon(token, T0)
    assert store.take() == [("update", "Orders", 1, ACTIVE, 1)]
    _, token, _ = lock(queue, T0)
    queue.release(token, T0)
    assert store.take() == []
    _, token, _ = lock(queue, T0)
    queue.defer(token, T0)
    assert store.take() == [("update", "Orders", 1, DEFERRED, 1)]
    ((_, token),) = queue.lock_deferred([1], T0)
    queue.complete(token, T0)
    assert store.take() == [("delete", "Orders", 1)]

    queue.schedule(incoming("s"), T0 + 5, T0)
    assert store.take() == [("save", "Orders", 2, SCHEDULED, 3)]
    queue.tick(T0 + 5)
    assert store.take() == [("update", "Orders", 2, ACTIVE, 0)]
    _, token, _ = lock(queue, T0 + 5)
    queue.dead_letter(token, T0 + 5, "R", "D")
    assert store.take() == [("save", dead, 1, ACTIVE, 2), ("delete", "Orders", 2)]

    queue.enqueue(incoming("late", message_id="id-b"), T0 + 601)
    assert store.take() == [
        ("forget_ids_before", "Orders", T0 + 1),
        ("remember_id", "Orders", "id-b", T0 + 601),
        ("save", "Orders", 3, ACTIVE, 4),
    ]


def _snapshot(queue: Queue) -> dict[str, Any]:
    return {
        "next_seq": queue.next_seq,
        "messages": {seq: asdict(m) for seq, m in sorted(queue.messages.items())},
        "seen_ids": dict(queue._seen_ids),
    }


def _reload(data_dir: Path) -> tuple[Broker, SqlitePersistence]:
    """Restore the way the broker does at start-up."""
    store = SqlitePersistence(data_dir)
    broker = Broker({SETTINGS.key: SETTINGS}, SharedAccessPolicy("k", "v"), persistence=store)
    return broker, store


def test_sqlite_state_after_reload_equals_state_before(tmp_path: Path) -> None:
    store = SqlitePersistence(tmp_path)
    queue = Queue.with_dead_letter_queue(SETTINGS, store)
    with store.atomic():
        for i in range(6):
            queue.enqueue(incoming(f"m{i}", message_id=f"id-{i}", ttl=600 + i), T0 + i)
    queue.enqueue(incoming("m0 again", message_id="id-0"), T0 + 10)  # duplicate
    queue.schedule(incoming("scheduled", message_id="sch"), T0 + 3600, T0 + 10)
    _, token, _ = lock(queue, T0 + 11)  # m0
    queue.abandon(token, T0 + 11)
    _, token, _ = lock(queue, T0 + 12)  # m0 again (delivery count 1)
    queue.defer(token, T0 + 12)
    _, token, _ = lock(queue, T0 + 13)  # m1
    queue.dead_letter(token, T0 + 13, "Operator", "parked")
    _, token, _ = lock(queue, T0 + 14)  # m2
    queue.complete(token, T0 + 14)
    lock(queue, T0 + 15)  # m3 stays locked: locks do not survive a restart
    before = {q.name: _snapshot(q) for q in (queue, dlq(queue))}
    store.close()

    broker, reloaded_store = _reload(tmp_path)
    try:
        reloaded = broker.queues[SETTINGS.key]
        after = {q.name: _snapshot(q) for q in (reloaded, dlq(reloaded))}
        assert after == before
        assert reloaded.locks == {}
        # and it behaves the same: order, counts, dedup, sequence numbers continue
        assert drain_bodies(reloaded, T0 + 20) == ["m3", "m4", "m5"]
        assert reloaded.enqueue(incoming("dup", message_id="id-5"), T0 + 21) is None
        assert reloaded.enqueue(incoming("fresh"), T0 + 21) == before["Orders"]["next_seq"]
        assert drain_bodies(dlq(reloaded), T0 + 22) == ["m1"]
        ((deferred, _),) = reloaded.lock_deferred([1], T0 + 23)
        assert deferred.delivery_count == 1
        reloaded.tick(T0 + 3600)
        assert "scheduled" in drain_bodies(reloaded, T0 + 3600)
    finally:
        reloaded_store.close()


def test_sqlite_keeps_dead_letters_that_never_expire(tmp_path: Path) -> None:
    store = SqlitePersistence(tmp_path)
    queue = Queue.with_dead_letter_queue(SETTINGS, store)
    queue.enqueue(incoming("x"), T0)
    _, token, _ = lock(queue, T0)
    queue.dead_letter(token, T0, "R", "D")
    store.close()
    broker, reloaded_store = _reload(tmp_path)
    try:
        (dead,) = dlq(broker.queues[SETTINGS.key]).messages.values()
        assert dead.expires_at == float("inf")
        assert dead.dead_letter_source == "Orders"
    finally:
        reloaded_store.close()
