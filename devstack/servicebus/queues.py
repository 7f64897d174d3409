"""Queue semantics of Service Bus, independent of the wire: locks, redelivery, dead-lettering,
scheduling, expiry, deferral and duplicate detection.

Every method takes `now` (epoch seconds) so behaviour is deterministic under test. Messages are
kept as the client's encoded sections (see codec.py); a delivery is rendered on demand with a
fresh header and annotations.

Lock accounting (`Queue.stats`): every lock is given to a `LockHolder`, the receiver link the
message went out on, which the broker marks when it goes away. A lock that expires is *lost*
unless its holder's connection had dropped without an AMQP close (the receiving process died,
e.g. SIGKILL: the expiry is how Service Bus recovers its messages, and is expected). Each
redelivery is counted by what ended the delivery before it: abandon, release, deferral, lock
loss or a crashed holder.
"""

from __future__ import annotations

import heapq
import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from devstack.servicebus import codec
from devstack.servicebus.codec import Symbol
from devstack.servicebus.config import DEAD_LETTER_SUFFIX, QueueSettings

log = logging.getLogger("servicebus.queues")

ACTIVE = "active"
SCHEDULED = "scheduled"
DEFERRED = "deferred"

MAX_DELIVERY_COUNT_EXCEEDED = "MaxDeliveryCountExceeded"
TTL_EXPIRED = "TTLExpiredException"

# How a lock holder went away (LockHolder.gone).
HOLDER_CLOSED = "closed"  # the client detached the link or closed its connection
HOLDER_CLOSED_BY_BROKER = "closed_by_broker"  # the broker closed it (an error)
HOLDER_DROPPED = "dropped"  # the connection ended without an AMQP close: the process died

# What ended a delivery, as LockStats.redelivered_after counts the next one.
ENDED_ABANDONED = "abandoned"
ENDED_RELEASED = "released"
ENDED_DEFERRED = "deferred"
ENDED_LOCK_LOST = "lock_lost"
ENDED_HOLDER_CRASHED = "holder_crashed"


class LockLost(Exception):
    """The lock token is unknown, already settled, or its lock expired."""


class NotFound(Exception):
    """A sequence number that names no message in the expected state."""


@dataclass(slots=True)
class StoredMessage:
    seq: int
    message_id: str | None
    enqueued_at: float
    expires_at: float
    durable: bool
    priority: int
    annotations: bytes | None  # the client's message-annotations map, encoded
    body: bytes  # the client's sections from properties onward, encoded
    delivery_count: int = 0
    state: str = ACTIVE
    scheduled_at: float | None = None
    dead_letter_source: str | None = None

    @property
    def size(self) -> int:
        return len(self.body) + len(self.annotations or b"")


@dataclass(slots=True, eq=False)
class LockHolder:
    """Who a lock was given to: one receiver link. ``gone`` is None while it is attached, then
    how it went away (HOLDER_*); the first way recorded stands."""

    name: str
    gone: str | None = None

    def leave(self, how: str) -> None:
        if self.gone is None:
            self.gone = how

    @property
    def crashed(self) -> bool:
        return self.gone == HOLDER_DROPPED


@dataclass(slots=True)
class LockStats:
    """Counters of one queue's peek-lock deliveries (see the module docstring)."""

    delivered: int = 0  # locks taken: receives and receive-by-sequence-number
    completed: int = 0
    abandoned: int = 0
    lock_lost: int = 0  # locks that expired while their holder was alive
    expired_after_crash: int = 0  # locks that expired after their holder's process died
    refused_lock_lost: int = 0  # settlements and renewals refused: lock expired or unknown
    redelivered_after: dict[str, int] = field(default_factory=dict)  # by ENDED_*

    def redelivered(self, cause: str) -> None:
        self.redelivered_after[cause] = self.redelivered_after.get(cause, 0) + 1

    def as_dict(self) -> dict[str, object]:
        return {
            "delivered": self.delivered,
            "completed": self.completed,
            "abandoned": self.abandoned,
            "lock_lost": self.lock_lost,
            "expired_after_crash": self.expired_after_crash,
            "refused_lock_lost": self.refused_lock_lost,
            "redelivered_after": dict(sorted(self.redelivered_after.items())),
        }


@dataclass(slots=True)
class Lock:
    seq: int
    locked_until: float
    holder: LockHolder | None = None


class Persistence(Protocol):
    """Write-through store; every change is durable before the client hears about it."""

    def save(self, queue: str, message: StoredMessage, next_seq: int) -> None: ...

    def delete(self, queue: str, seq: int) -> None: ...

    def update(self, queue: str, message: StoredMessage) -> None: ...

    def remember_id(self, queue: str, message_id: str, at: float) -> None: ...

    def forget_ids_before(self, queue: str, cutoff: float) -> None: ...


@dataclass(slots=True)
class Incoming:
    """A message as a client sent it, split for storage."""

    message_id: str | None
    durable: bool
    priority: int
    ttl_seconds: float | None
    scheduled_at: float | None
    annotations: bytes | None
    body: bytes


def parse_incoming(raw: bytes) -> Incoming:
    """Split and inspect an encoded message from a client (raises codec.CodecError)."""
    return parse_sections(codec.split_sections(raw))


def parse_sections(sections: list[codec.Section]) -> Incoming:
    """:func:`parse_incoming` of a message already split into its sections."""
    message_id = None
    durable, priority, ttl = False, 4, None
    scheduled_at = None
    annotations = None
    body_parts = []
    for section in sections:
        if section.code == codec.HEADER:
            header = codec.section_value(section)
            durable = bool(_at(header, 0, False))
            priority = int(_at(header, 1, 4) or 4)
            ttl_ms = _at(header, 2, None)
            ttl = ttl_ms / 1000 if ttl_ms else None
        elif section.code == codec.DELIVERY_ANNOTATIONS:
            continue
        elif section.code == codec.MESSAGE_ANNOTATIONS:
            annotations = codec.section_map_bytes(section)
            when = codec.decode(annotations)[0].get("x-opt-scheduled-enqueue-time")
            scheduled_at = when / 1000 if when else None
        else:
            if section.code == codec.PROPERTIES:
                message_id = _message_id(codec.first_list_item(section))
            body_parts.append(section.raw)
    if not any(
        part[2] in (codec.DATA, codec.AMQP_SEQUENCE, codec.AMQP_VALUE) for part in body_parts
    ):
        raise codec.CodecError("the message has no body section")
    return Incoming(
        message_id, durable, priority, ttl, scheduled_at, annotations, b"".join(body_parts)
    )


def _at(items: object, index: int, default: object) -> object:
    if isinstance(items, list) and len(items) > index and items[index] is not None:
        return items[index]
    return default


def _message_id(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


@dataclass
class Queue:
    settings: QueueSettings
    name: str
    persistence: Persistence | None = None
    dead_letter_queue: Queue | None = None
    next_seq: int = 1
    messages: dict[int, StoredMessage] = field(default_factory=dict)
    locks: dict[uuid.UUID, Lock] = field(default_factory=dict)
    _locked_seqs: set[int] = field(default_factory=set)
    _available: list[int] = field(default_factory=list)
    _scheduled: list[tuple[float, int]] = field(default_factory=list)
    _lock_expiries: list[tuple[float, uuid.UUID]] = field(default_factory=list)
    _expiries: list[tuple[float, int]] = field(default_factory=list)
    _seen_ids: OrderedDict[str, float] = field(default_factory=OrderedDict)
    _ended: dict[int, str] = field(default_factory=dict)  # seq -> how its last delivery ended
    stats: LockStats = field(default_factory=LockStats)

    @classmethod
    def with_dead_letter_queue(
        cls, settings: QueueSettings, persistence: Persistence | None = None
    ) -> Queue:
        dlq = cls(settings, settings.name + DEAD_LETTER_SUFFIX, persistence)
        return cls(settings, settings.name, persistence, dead_letter_queue=dlq)

    @property
    def is_dead_letter_queue(self) -> bool:
        return self.dead_letter_queue is None

    # --- arrival ----------------------------------------------------------------------------

    def enqueue(self, incoming: Incoming, now: float) -> int | None:
        """Store a sent message; None when duplicate detection drops it."""
        if self._is_duplicate(incoming.message_id, now):
            return None
        ttl = self.settings.default_ttl.total_seconds()
        if incoming.ttl_seconds:
            ttl = min(ttl, incoming.ttl_seconds)
        scheduled = incoming.scheduled_at if (incoming.scheduled_at or 0) > now else None
        message = StoredMessage(
            seq=self._take_seq(),
            message_id=incoming.message_id,
            enqueued_at=scheduled or now,
            expires_at=(scheduled or now) + ttl,
            durable=incoming.durable,
            priority=incoming.priority,
            annotations=incoming.annotations,
            body=incoming.body,
            state=SCHEDULED if scheduled else ACTIVE,
            scheduled_at=scheduled,
        )
        self._add(message)
        return message.seq

    def restore(self, message: StoredMessage) -> None:
        """Load a persisted message after a restart (locks do not survive a restart)."""
        self.next_seq = max(self.next_seq, message.seq + 1)
        self._index(message)

    def restore_seen_id(self, message_id: str, at: float) -> None:
        self._seen_ids[message_id] = at

    def _take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def _is_duplicate(self, message_id: str | None, now: float) -> bool:
        if not self.settings.requires_duplicate_detection or message_id is None:
            return False
        self._forget_old_ids(now)
        if message_id in self._seen_ids:
            return True
        self._seen_ids[message_id] = now
        if self.persistence:
            self.persistence.remember_id(self.name, message_id, now)
        return False

    def _forget_old_ids(self, now: float) -> None:
        cutoff = now - self.settings.duplicate_detection_window.total_seconds()
        forgot = False
        while self._seen_ids:
            oldest_id, seen = next(iter(self._seen_ids.items()))
            if seen >= cutoff:
                break
            del self._seen_ids[oldest_id]
            forgot = True
        if forgot and self.persistence:
            self.persistence.forget_ids_before(self.name, cutoff)

    def _add(self, message: StoredMessage) -> None:
        if self.persistence:
            self.persistence.save(self.name, message, self.next_seq)
        self._index(message)

    def _index(self, message: StoredMessage) -> None:
        self.messages[message.seq] = message
        heapq.heappush(self._expiries, (message.expires_at, message.seq))
        if message.state == SCHEDULED:
            heapq.heappush(self._scheduled, (message.scheduled_at or 0, message.seq))
        elif message.state == ACTIVE:
            heapq.heappush(self._available, message.seq)

    # --- receiving --------------------------------------------------------------------------

    def may_have_available(self) -> bool:
        """False when nothing can be handed out (no side effects, unlike has_available)."""
        return bool(self._available)

    def has_available(self, now: float) -> bool:
        while self._available:
            message = self.messages.get(self._available[0])
            if message is None or message.state != ACTIVE or self._is_locked(message.seq):
                heapq.heappop(self._available)
            elif message.expires_at <= now:
                heapq.heappop(self._available)
                self._expire(message)
            else:
                return True
        return False

    def lock_next(
        self, now: float, holder: LockHolder | None = None
    ) -> tuple[StoredMessage, uuid.UUID, float] | None:
        if not self.has_available(now):
            return None
        message = self.messages[heapq.heappop(self._available)]
        token, locked_until = self._new_lock(message, now, holder)
        return message, token, locked_until

    def take_next(self, now: float) -> StoredMessage | None:
        """Receive-and-delete: the message is gone once handed out."""
        if not self.has_available(now):
            return None
        message = self.messages[heapq.heappop(self._available)]
        self._remove(message)
        return message

    def _is_locked(self, seq: int) -> bool:
        return seq in self._locked_seqs

    def _new_lock(
        self, message: StoredMessage, now: float, holder: LockHolder | None
    ) -> tuple[uuid.UUID, float]:
        token = uuid.uuid4()
        locked_until = now + self.settings.lock_duration.total_seconds()
        self.locks[token] = Lock(message.seq, locked_until, holder)
        self._locked_seqs.add(message.seq)
        heapq.heappush(self._lock_expiries, (locked_until, token))
        self.stats.delivered += 1
        ended = self._ended.pop(message.seq, None)
        if ended is not None:
            self.stats.redelivered(ended)
        return token, locked_until

    def _drop_lock(self, token: uuid.UUID) -> Lock:
        lock = self.locks.pop(token)
        self._locked_seqs.discard(lock.seq)
        return lock

    # --- settlement -------------------------------------------------------------------------

    def complete(self, token: uuid.UUID, now: float) -> None:
        self._remove(self._release_lock(token, now))
        self.stats.completed += 1

    def abandon(self, token: uuid.UUID, now: float) -> None:
        """Return to the queue with delivery count + 1, or dead-letter past the maximum."""
        message = self._release_lock(token, now)
        self.stats.abandoned += 1
        self._failed_delivery(message, ENDED_ABANDONED)

    def release(self, token: uuid.UUID, now: float) -> None:
        """Never-processed (a receiver closed with prefetched messages): no count increment."""
        message = self._release_lock(token, now)
        self._ended[message.seq] = ENDED_RELEASED
        heapq.heappush(self._available, message.seq)

    def defer(self, token: uuid.UUID, now: float) -> None:
        message = self._release_lock(token, now)
        message.state = DEFERRED
        self._ended[message.seq] = ENDED_DEFERRED
        if self.persistence:
            self.persistence.update(self.name, message)

    def dead_letter(self, token: uuid.UUID, now: float, reason: str, description: str) -> None:
        self._move_to_dead_letter(self._release_lock(token, now), reason, description)

    def renew(self, token: uuid.UUID, now: float) -> float:
        lock = self._live_lock(token, now)
        lock.locked_until = now + self.settings.lock_duration.total_seconds()
        heapq.heappush(self._lock_expiries, (lock.locked_until, token))
        return lock.locked_until

    def locked_message(self, token: uuid.UUID, now: float) -> StoredMessage:
        return self.messages[self._live_lock(token, now).seq]

    def _live_lock(self, token: uuid.UUID, now: float) -> Lock:
        lock = self.locks.get(token)
        if lock is None:
            self.stats.refused_lock_lost += 1
            raise LockLost(f"the lock token {token} is not held on '{self.name}'")
        if lock.locked_until <= now:
            self._expire_lock(token)
            self.stats.refused_lock_lost += 1
            raise LockLost(f"the lock {token} on '{self.name}' expired; the message was requeued")
        return lock

    def _release_lock(self, token: uuid.UUID, now: float) -> StoredMessage:
        lock = self._live_lock(token, now)
        self._drop_lock(token)
        return self.messages[lock.seq]

    def _failed_delivery(self, message: StoredMessage, ended: str) -> None:
        self._ended[message.seq] = ended
        message.delivery_count += 1
        if message.delivery_count >= self.settings.max_delivery_count and not (
            self.is_dead_letter_queue
        ):
            self._move_to_dead_letter(
                message,
                MAX_DELIVERY_COUNT_EXCEEDED,
                f"Message could not be consumed after {self.settings.max_delivery_count} "
                "delivery attempts.",
            )
            return
        if self.persistence:
            self.persistence.update(self.name, message)
        if message.state == ACTIVE:
            heapq.heappush(self._available, message.seq)

    def _move_to_dead_letter(self, message: StoredMessage, reason: str, description: str) -> None:
        target = self.dead_letter_queue
        if target is None:  # dead-lettering from a dead-letter queue just removes it
            self._remove(message)
            return
        copy = StoredMessage(
            seq=target._take_seq(),
            message_id=message.message_id,
            enqueued_at=message.enqueued_at,
            expires_at=float("inf"),  # dead letters never expire
            durable=message.durable,
            priority=message.priority,
            annotations=message.annotations,
            body=_with_dead_letter_properties(message.body, reason, description),
            delivery_count=message.delivery_count,
            dead_letter_source=self.settings.name,
        )
        target._add(copy)
        self._remove(message)

    def _remove(self, message: StoredMessage) -> None:
        self.messages.pop(message.seq, None)
        self._ended.pop(message.seq, None)
        if self.persistence:
            self.persistence.delete(self.name, message.seq)

    # --- time -------------------------------------------------------------------------------

    def has_due(self, now: float) -> bool:
        """Whether :meth:`tick` has anything to do at ``now`` (a cheap look at three heaps)."""
        return any(heap and heap[0][0] <= now for heap in self._timed_heaps())

    def _timed_heaps(self) -> tuple[list, ...]:
        return (self._lock_expiries, self._scheduled, self._expiries)

    def tick(self, now: float) -> None:
        """Expire locks, release due scheduled messages, expire messages past their TTL."""
        while self._lock_expiries and self._lock_expiries[0][0] <= now:
            _, token = heapq.heappop(self._lock_expiries)
            lock = self.locks.get(token)
            if lock is not None and lock.locked_until <= now:
                self._expire_lock(token)
        while self._scheduled and self._scheduled[0][0] <= now:
            _, seq = heapq.heappop(self._scheduled)
            message = self.messages.get(seq)
            if message is not None and message.state == SCHEDULED:
                message.state = ACTIVE
                if self.persistence:
                    self.persistence.update(self.name, message)
                heapq.heappush(self._available, seq)
        while self._expiries and self._expiries[0][0] <= now:
            _, seq = heapq.heappop(self._expiries)
            message = self.messages.get(seq)
            if message is not None and message.state == ACTIVE and not self._is_locked(seq):
                self._expire(message)

    def _expire_lock(self, token: uuid.UUID) -> None:
        lock = self._drop_lock(token)
        holder = lock.holder
        if holder is not None and holder.crashed:
            self.stats.expired_after_crash += 1
            ended = ENDED_HOLDER_CRASHED
        else:
            self.stats.lock_lost += 1
            ended = ENDED_LOCK_LOST
            log.warning(
                "lock lost on '%s': message %d expired under %s, which was %s",
                self.name,
                lock.seq,
                holder.name if holder else "an unknown holder",
                f"gone ({holder.gone})" if holder and holder.gone else "still attached",
            )
        message = self.messages.get(lock.seq)
        if message is not None:
            self._failed_delivery(message, ended)

    def _expire(self, message: StoredMessage) -> None:
        if self.settings.dead_letter_on_expiration and not self.is_dead_letter_queue:
            self._move_to_dead_letter(
                message, TTL_EXPIRED, "The message expired and was dead lettered."
            )
        else:
            self._remove(message)

    # --- management -------------------------------------------------------------------------

    def schedule(self, incoming: Incoming, at: float, now: float) -> int:
        incoming.scheduled_at = at
        seq = self.enqueue(incoming, now)
        if seq is None:  # a duplicate still gets a number back, as the service does
            return 0
        return seq

    def cancel_scheduled(self, seqs: list[int]) -> None:
        """All or nothing: an unknown sequence number cancels none of them."""
        found = []
        for seq in seqs:
            message = self.messages.get(seq)
            if message is None or message.state != SCHEDULED:
                raise NotFound(f"no scheduled message with sequence number {seq}")
            found.append(message)
        for message in found:
            self._remove(message)

    def peek(self, from_seq: int, count: int) -> list[StoredMessage]:
        seqs = sorted(s for s in self.messages if s >= from_seq)[:count]
        return [self.messages[s] for s in seqs]

    def lock_deferred(
        self, seqs: list[int], now: float, holder: LockHolder | None = None
    ) -> list[tuple[StoredMessage, uuid.UUID]]:
        found = []
        for seq in seqs:
            message = self.messages.get(seq)
            if message is None or message.state != DEFERRED or self._is_locked(seq):
                raise NotFound(f"no deferred message with sequence number {seq}")
            found.append(message)
        expired = [m for m in found if m.expires_at <= now]
        for message in expired:
            self._expire(message)
        if expired:
            raise NotFound(f"deferred message(s) {[m.seq for m in expired]} expired")
        locked = []
        for message in found:
            token, _ = self._new_lock(message, now, holder)
            locked.append((message, token))
        return locked

    def render(
        self,
        message: StoredMessage,
        token: uuid.UUID | None = None,
        locked_until: float | None = None,
    ) -> bytes:
        """The message as Service Bus delivers it: header, annotations, then the client's body."""
        updates = {
            _SEQUENCE_NUMBER: _KEYS[_SEQUENCE_NUMBER] + codec.encode_long(message.seq),
            _ENQUEUED_TIME: _KEYS[_ENQUEUED_TIME] + _timestamp(message.enqueued_at),
        }
        if token is not None and locked_until is not None:
            updates[_LOCKED_UNTIL] = _KEYS[_LOCKED_UNTIL] + _timestamp(locked_until)
            updates[_LOCK_TOKEN] = _KEYS[_LOCK_TOKEN] + b"\x98" + token.bytes
        if message.scheduled_at:
            updates[_SCHEDULED] = _KEYS[_SCHEDULED] + _timestamp(message.scheduled_at)
        if message.dead_letter_source:
            source = codec.encode(message.dead_letter_source)
            updates[_DEAD_LETTER_SOURCE] = _KEYS[_DEAD_LETTER_SOURCE] + source
        return (
            codec.encode_header(message.durable, message.priority, message.delivery_count)
            + codec.described_section(
                codec.MESSAGE_ANNOTATIONS, codec.merge_encoded(message.annotations, updates)
            )
            + message.body
        )


_SEQUENCE_NUMBER = Symbol("x-opt-sequence-number")
_ENQUEUED_TIME = Symbol("x-opt-enqueued-time")
_LOCKED_UNTIL = Symbol("x-opt-locked-until")
_LOCK_TOKEN = Symbol("x-opt-lock-token")
_SCHEDULED = Symbol("x-opt-scheduled-enqueue-time")
_DEAD_LETTER_SOURCE = Symbol("x-opt-deadletter-source")
_KEYS = {
    key: codec.encode(key)
    for key in (
        _SEQUENCE_NUMBER,
        _ENQUEUED_TIME,
        _LOCKED_UNTIL,
        _LOCK_TOKEN,
        _SCHEDULED,
        _DEAD_LETTER_SOURCE,
    )
}


def _timestamp(seconds: float) -> bytes:
    return codec.encode_timestamp_ms(int(seconds * 1000))


def _with_dead_letter_properties(body: bytes, reason: str, description: str) -> bytes:
    """Body sections with DeadLetterReason/DeadLetterErrorDescription application properties."""
    updates = {"DeadLetterReason": reason, "DeadLetterErrorDescription": description}
    sections = codec.split_sections(body)
    out = []
    placed = False
    for section in sections:
        if section.code == codec.APPLICATION_PROPERTIES:
            merged = codec.merge_map(codec.section_map_bytes(section), updates)
            out.append(codec.described_section(codec.APPLICATION_PROPERTIES, merged))
            placed = True
            continue
        if not placed and section.code > codec.APPLICATION_PROPERTIES:
            out.append(
                codec.described_section(
                    codec.APPLICATION_PROPERTIES, codec.merge_map(None, updates)
                )
            )
            placed = True
        out.append(section.raw)
    if not placed:
        out.append(
            codec.described_section(codec.APPLICATION_PROPERTIES, codec.merge_map(None, updates))
        )
    return b"".join(out)
