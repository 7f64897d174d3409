"""In-memory state store and bus: the same interfaces as the Table and Service Bus adapters.

For fast tests of everything above the adapters (the lifecycle, the shell, the handlers): the
store keeps ETags and the active and Error indexes with the Table store's semantics (a write
conditional on a stale ETag raises :class:`ConcurrencyConflict`); the bus records what was sent,
keeps duplicate detection by MessageId, and can be told to fail the next sends (a crash between
the write and the send). The store also has the purge's reads and ETag-conditional delete
(:mod:`core.purge`), and :class:`MemoryArchive` the archive's JSON lines (:mod:`core.archive`).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from core import archive
from core.active_index import DEFAULT_GRACE, bucket_partition, index_partition, index_row_key
from core.messages import MessageBase, OrderSubmitted, message_id_for, utc_now
from core.order import Order, TimelineEntry
from core.purge_log import MemoryPurgeLog
from core.retention import PURGEABLE_STATES, Candidate, DeleteOutcome, OrderSnapshot
from core.state_models import (
    ActivePage,
    ActiveRow,
    AlreadyExists,
    ConcurrencyConflict,
    OrderNotFound,
    OrderRecord,
)
from core.states import ProcessState
from core.supervision import MemorySupervision


class MemoryIndex:
    """The active-order index (or the Error index) as a dict of rows."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self._rows: dict[tuple[str, int], ActiveRow] = {}
        self._clock = clock
        self._etags = itertools.count(1)

    def put(
        self, order_id: str, generation: int, workflow: str = "", due: datetime | None = None
    ) -> str:
        etag = f"i{next(self._etags)}"
        now = self._clock()
        self._rows[(order_id, generation)] = ActiveRow(
            order_id=order_id,
            generation=generation,
            workflow=workflow,
            written_at=now,
            due_at=due or now,
            partition_key=index_partition(order_id),
            row_key=index_row_key(order_id, generation),
            etag=etag,
        )
        return etag

    def postpone(self, row: ActiveRow, due: datetime) -> bool:
        key = (row.order_id, row.generation)
        if self._rows.get(key) != row:
            return False
        etag = f"i{next(self._etags)}"
        self._rows[key] = dataclasses.replace(row, due_at=due, etag=etag)
        return True

    def due(self, bucket: int, now: datetime, limit: int = 1000) -> tuple[ActiveRow, ...]:
        rows = [r for r in self._rows.values() if r.partition_key == bucket_partition(bucket)]
        due = sorted((r for r in rows if r.due_at <= now), key=lambda r: (r.due_at, r.row_key))
        return tuple(due[:limit])

    def add(
        self, order_id: str, generation: int, workflow: str = "", due: datetime | None = None
    ) -> bool:
        if (order_id, generation) in self._rows:
            return False
        self.put(order_id, generation, workflow, due)
        return True

    def insert(self, order_id: str, generation: int) -> str | None:
        """The Error index's write: the row's ETag, or None if it was there already."""
        return None if (order_id, generation) in self._rows else self.put(order_id, generation)

    def discard(self, order_id: str, generation: int, *, etag: str | None = None) -> None:
        row = self._rows.get((order_id, generation))
        if row is not None and (etag is None or row.etag == etag):
            del self._rows[(order_id, generation)]

    def has(self, order_id: str, generation: int) -> bool:
        return (order_id, generation) in self._rows

    def get(self, order_id: str, generation: int) -> ActiveRow | None:
        return self._rows.get((order_id, generation))

    def rows(self) -> list[ActiveRow]:
        return sorted(self._rows.values(), key=lambda r: (r.partition_key, r.row_key))

    def reap(
        self, row: ActiveRow, order: Order | None, *, grace: timedelta = DEFAULT_GRACE
    ) -> bool:
        live = order is not None and order.generation == row.generation
        if live or self._clock() - row.written_at < grace:
            return False
        current = self._rows.get((row.order_id, row.generation))
        if current is None:
            return True  # gone already, as the Table store reports it
        if current != row:
            return False
        del self._rows[(row.order_id, row.generation)]
        return True


class MemoryStore:
    """:class:`core.state_store.OrderStateStore` in memory."""

    def __init__(self, clock: Callable[[], datetime] = utc_now) -> None:
        self._clock = clock
        self._orders: dict[str, Order] = {}
        self._details: dict[str, tuple[OrderSubmitted, str]] = {}
        self._timelines: dict[str, list[TimelineEntry]] = {}
        self._etags = itertools.count(1)
        self._lock = threading.Lock()
        self.index = MemoryIndex(clock)
        self.errors = MemoryIndex(clock)
        self.supervision = MemorySupervision()
        self.purges = MemoryPurgeLog()

    def ensure_tables(self) -> None:
        pass

    def close(self) -> None:
        pass

    def create(
        self,
        submitted: OrderSubmitted,
        order: Order,
        entry: TimelineEntry,
        *,
        due: datetime | None = None,
    ) -> Order | AlreadyExists:
        payload_hash = submitted.content_hash()
        added = self.index.add(order.order_id, order.generation, order.workflow, due)
        with self._lock:
            existing = self._orders.get(order.order_id)
            if existing is not None:
                if added and (existing.state.terminal or existing.generation != 1):
                    self.index.discard(order.order_id, 1)
                stored_hash = self._details[order.order_id][1]
                return AlreadyExists(stored_hash == payload_hash, stored_hash, existing)
            stored = dataclasses.replace(order, etag=self._etag())
            self._orders[order.order_id] = stored
            self._details[order.order_id] = (submitted, payload_hash)
            self._timelines[order.order_id] = [entry]
            return stored

    def load(self, order_id: str) -> Order:
        try:
            return self._orders[order_id]
        except KeyError:
            raise OrderNotFound(order_id) from None

    def find(self, order_id: str) -> Order | None:
        return self._orders.get(order_id)

    def get_order(self, order_id: str) -> OrderRecord:
        order = self.load(order_id)
        details, payload_hash = self._details[order_id]
        return OrderRecord(details=details, payload_hash=payload_hash, process=order)

    def get_timeline(
        self, order_id: str, *, after_seq: int = -1, limit: int = 1000
    ) -> list[TimelineEntry]:
        entries = [e for e in self._timelines.get(order_id, []) if e.seq > after_seq]
        return entries[:limit]

    def save(
        self, before: Order, after: Order, entry: TimelineEntry, *, due: datetime | None = None
    ) -> Order:
        if due is not None or (before.state.terminal and after.state.in_flight):
            self.index.put(after.order_id, after.generation, after.workflow, due)
        entering_error = (
            after.state is ProcessState.ERROR and before.state is not ProcessState.ERROR
        )
        error_row = self.errors.insert(after.order_id, after.generation) if entering_error else None
        with self._lock:
            stored = self._orders.get(before.order_id)
            if stored is None or stored.etag != before.etag:
                if error_row is not None:
                    self.errors.discard(after.order_id, after.generation, etag=error_row)
                if stored is None:
                    raise OrderNotFound(before.order_id)
                raise ConcurrencyConflict(before.order_id, "ETag changed")
            saved = dataclasses.replace(after, etag=self._etag())
            self._orders[before.order_id] = saved
            self._timelines[before.order_id].append(entry)
        if before.state is ProcessState.ERROR and after.state is not ProcessState.ERROR:
            self.errors.discard(before.order_id, before.generation)
        return saved

    def annotate(self, order: Order, *, actor: str, event: str, detail: str = "") -> Order:
        now = self._clock()
        after = dataclasses.replace(order, updated_at=now, timeline_seq=order.timeline_seq + 1)
        entry = TimelineEntry(
            after.timeline_seq,
            now,
            actor,
            event,
            order.state,
            order.state,
            None,
            order.attempt,
            detail,
        )
        return self.save(order, after, entry)

    def list_active(self, limit: int = 1000, *, continuation: str | None = None) -> ActivePage:
        rows = self.index.rows()
        start = int(continuation or 0)
        page = tuple(rows[start : start + limit])
        more = start + limit < len(rows)
        return ActivePage(rows=page, continuation=str(start + limit) if more else None)

    def all_active(self) -> Iterator[ActiveRow]:
        return iter(self.index.rows())

    def reap_active(
        self, row: ActiveRow, order: Order | None, *, grace: timedelta = DEFAULT_GRACE
    ) -> bool:
        return self.index.reap(row, order, grace=grace)

    def purge_candidates(
        self,
        before: datetime,
        states: Iterable[ProcessState] = PURGEABLE_STATES,
        *,
        page_size: int = 1000,
    ) -> Iterator[Candidate]:
        wanted = {ProcessState(s) for s in states}
        if not wanted or any(s.in_flight for s in wanted):
            raise ValueError("only finished states (Processed, Error) can be purged")
        for order in sorted(self._orders.values(), key=lambda o: o.order_id):
            if order.state in wanted and order.updated_at < before:
                yield Candidate(order.order_id, order.state, order.updated_at)

    def snapshot(self, order_id: str) -> OrderSnapshot | None:
        with self._lock:
            order = self._orders.get(order_id)
            if order is None:
                return None
            submitted, payload_hash = self._details[order_id]
            timeline = tuple(self._timelines[order_id])
        return OrderSnapshot(
            submitted=submitted,
            payload_hash=payload_hash,
            process=order,
            timeline=timeline,
            other_rows=tuple(f"timeline-{entry.seq:08d}" for entry in timeline),
        )

    def purge(self, snapshot: OrderSnapshot) -> DeleteOutcome:
        order_id = snapshot.process.order_id
        with self._lock:
            stored = self._orders.get(order_id)
            if stored is None:
                return DeleteOutcome.GONE
            if stored.etag != snapshot.process.etag:
                return DeleteOutcome.CHANGED
            del self._orders[order_id], self._details[order_id], self._timelines[order_id]
        return DeleteOutcome.PURGED

    def finish_purge(self, order_id: str) -> bool:
        return False  # one purge is one step here: nothing is ever left half done

    def orders(self) -> list[Order]:
        return list(self._orders.values())

    def _etag(self) -> str:
        return f"e{next(self._etags)}"


class MemoryArchive:
    """:class:`core.archive.BlobArchive` in memory: the same JSON lines, one list per blob."""

    def __init__(self) -> None:
        self._blobs: dict[str, list[bytes]] = {}
        self._lock = threading.Lock()

    def append(self, day: date, records: Sequence[archive.ArchivedOrder]) -> str:
        name = archive.blob_name(day)
        with self._lock:
            self._blobs.setdefault(name, []).extend(archive.encode(r) for r in records)
        return name

    def lines(self, blob: str) -> Iterator[bytes]:
        with self._lock:
            return iter([line.rstrip(b"\n") for line in self._blobs.get(blob, [])])

    def blobs(self, day: date | None = None) -> list[str]:
        prefix = archive.day_prefix(day) if day is not None else ""
        with self._lock:
            return sorted(name for name in self._blobs if name.startswith(prefix))


@dataclass(frozen=True, slots=True)
class Sent:
    queue: str
    message: MessageBase
    scheduled_at: datetime | None


class SendFailed(Exception):
    """The bus was told to fail: the process 'crashed' before this send."""


class MemoryBus:
    """:class:`core.bus.Bus` in memory: records sends, drops duplicates by MessageId."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self._ids: set[tuple[str, str]] = set()
        self.fail_after: int | None = None
        """Sends left before every further send fails (None: never fail)."""
        self.attempts = 0

    def send(
        self, queue: str, message: MessageBase, *, scheduled_at: datetime | None = None
    ) -> None:
        self.attempts += 1
        if self.fail_after is not None:
            if self.fail_after <= 0:
                raise SendFailed(f"send of {message_id_for(message)} to {queue} failed")
            self.fail_after -= 1
        key = (queue, message_id_for(message))
        if key in self._ids:
            return
        self._ids.add(key)
        self.sent.append(Sent(queue, message, scheduled_at))

    def on(self, queue: str) -> list[Any]:
        return [s.message for s in self.sent if s.queue == queue]

    def close(self) -> None:
        pass
