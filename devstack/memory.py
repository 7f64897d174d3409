"""In-memory state store and bus: the same interfaces as the Table and Service Bus adapters.

For fast tests of everything above the adapters (the lifecycle, the shell, the handlers): the
store keeps ETags and the active and Error indexes with the Table store's semantics (a write
conditional on a stale ETag raises :class:`ConcurrencyConflict`), and the Supervisor's roster
(:class:`MemorySupervision`) and the record of purge runs (:class:`MemoryPurgeLog`) beside them;
the bus records what was sent, keeps duplicate detection by MessageId, and can be told to fail
the next sends (a crash between the write and the send). The store also has the purge's reads
and ETag-conditional delete (:mod:`service.purge`), and :class:`MemoryArchive` the archive's JSON
lines (:mod:`adapters.archive`).

What the adapters await is awaited here too, so a test drives the same code the app runs, and
each call that would be a request yields to the event loop once (:func:`_round_trip`). All of
it runs on one event loop, and no method awaits between checking a row and writing it, so each
check-and-write is atomic as the service's is. What only tests call to look inside (``rows``,
``get``, ``orders``, ``on``) is plain.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from adapters import archive, archive_reading
from adapters.store.active_index import (
    DEFAULT_GRACE,
    INDEX_BUCKETS,
    bucket_partition,
    index_partition,
    index_row_key,
)
from adapters.store.purge_log import MAX_RECENT
from adapters.store.records import OrderRecord
from adapters.store.rows import (
    ActivePage,
    ActiveRow,
    AlreadyExists,
    ConcurrencyConflict,
    OrderNotFound,
    newest_first_key,
    utc,
)
from adapters.store.supervision import (
    BucketLease,
    Member,
    Roster,
    Sweep,
    member_row_key,
    swept_lease,
)
from domain.messages import MessageBase, OrderSubmitted, message_id_for, utc_now
from domain.order import Order, TimelineEntry
from domain.retention import PURGEABLE_STATES, Candidate, DeleteOutcome, OrderSnapshot
from domain.states import ProcessState


async def _round_trip() -> None:
    """Where a request to the service would suspend its caller: other tasks run meanwhile, so
    concurrent callers (two Supervisor ticks, a tick's sweeps) interleave between requests as
    they do against the service, while each request's check-and-write stays atomic."""
    await asyncio.sleep(0)


class MemoryIndex:
    """The active-order index (or the Error index) as a dict of rows."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self._rows: dict[tuple[str, int], ActiveRow] = {}
        self._clock = clock
        self._etags = itertools.count(1)

    async def put(
        self, order_id: str, generation: int, workflow: str = "", due: datetime | None = None
    ) -> None:
        await _round_trip()
        self._write(order_id, generation, workflow, due)

    def _write(
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

    async def postpone(self, row: ActiveRow, due: datetime) -> bool:
        await _round_trip()
        key = (row.order_id, row.generation)
        stored = self._rows.get(key)
        if stored is None:
            return False
        if stored.etag != row.etag:
            if not (row.dispatch_id and stored.dispatch_id):
                return False
            await _round_trip()  # the row read again: handed out again since, moved on that
        etag = f"i{next(self._etags)}"
        self._rows[key] = dataclasses.replace(
            stored, due_at=due, etag=etag, dispatch_id="", dispatched_at=None, due_since=None
        )
        return True

    async def move_on(self, moves: Sequence[tuple[ActiveRow, datetime]]) -> int:
        await _round_trip()
        moved = 0
        for row, due in moves:  # the Table store's transaction, or row by row once refused
            moved += await self.postpone(row, due)
        return moved

    async def handed_out(self, bucket: int, row_keys: Sequence[str]) -> tuple[ActiveRow, ...]:
        await _round_trip()
        wanted = set(row_keys)
        return tuple(
            row
            for row in self.rows()
            if row.partition_key == bucket_partition(bucket)
            and row.row_key in wanted
            and row.dispatch_id
        )

    async def hand_out(
        self, rows: Sequence[ActiveRow], until: datetime, at: datetime, dispatch_id: str
    ) -> tuple[ActiveRow, ...]:
        await _round_trip()
        if len({row.partition_key for row in rows}) > 1 or len(rows) > 100:
            raise ValueError("hand out at most 100 rows of one bucket at once")
        marked = []
        for row in rows:
            key = (row.order_id, row.generation)
            stored = self._rows.get(key)
            if stored is None or stored.etag != row.etag:
                continue  # changed since found: the Table store's second try leaves it out
            self._rows[key] = dataclasses.replace(
                stored,
                due_at=until,
                etag=f"i{next(self._etags)}",
                dispatch_id=dispatch_id,
                dispatched_at=at,
                due_since=stored.overdue_since,
            )
            marked.append(self._rows[key])
        return tuple(marked)

    async def due(self, bucket: int, now: datetime, limit: int = 1000) -> tuple[ActiveRow, ...]:
        await _round_trip()
        rows = [r for r in self._rows.values() if r.partition_key == bucket_partition(bucket)]
        due = sorted((r for r in rows if r.due_at <= now), key=lambda r: (r.due_at, r.row_key))
        return tuple(due[:limit])

    async def add(
        self, order_id: str, generation: int, workflow: str = "", due: datetime | None = None
    ) -> bool:
        await _round_trip()
        if (order_id, generation) in self._rows:
            return False
        self._write(order_id, generation, workflow, due)
        return True

    async def insert(self, order_id: str, generation: int) -> str | None:
        """The Error index's write: the row's ETag, or None if it was there already."""
        await _round_trip()
        return None if (order_id, generation) in self._rows else self._write(order_id, generation)

    async def discard(self, order_id: str, generation: int, *, etag: str | None = None) -> None:
        await _round_trip()
        row = self._rows.get((order_id, generation))
        if row is not None and (etag is None or row.etag == etag):
            del self._rows[(order_id, generation)]

    async def has(self, order_id: str, generation: int) -> bool:
        await _round_trip()
        return (order_id, generation) in self._rows

    def get(self, order_id: str, generation: int) -> ActiveRow | None:
        return self._rows.get((order_id, generation))

    def rows(self) -> list[ActiveRow]:
        return sorted(self._rows.values(), key=lambda r: (r.partition_key, r.row_key))

    async def reap(
        self, row: ActiveRow, order: Order | None, *, grace: timedelta = DEFAULT_GRACE
    ) -> bool:
        await _round_trip()
        live = order is not None and order.generation == row.generation
        if live or self._clock() - row.written_at < grace:
            return False
        current = self._rows.get((row.order_id, row.generation))
        if current is None:
            return True  # gone already, as the Table store reports it
        if current.etag != row.etag:
            return False
        del self._rows[(row.order_id, row.generation)]
        return True


class MemorySupervision:
    """:class:`adapters.store.supervision.SupervisionTable` in memory, with the same ETag rules."""

    def __init__(self) -> None:
        self._buckets: dict[int, BucketLease] = {}
        self._members: dict[str, Member] = {}
        self._etags = itertools.count(1)

    async def read(self) -> Roster:
        await _round_trip()
        buckets = tuple(self._buckets.get(b, BucketLease(bucket=b)) for b in range(INDEX_BUCKETS))
        return Roster(buckets=buckets, members=tuple(self._members.values()))

    async def claim(
        self,
        member: Member,
        hold: Sequence[BucketLease],
        release: Sequence[BucketLease],
        reap: Sequence[Member] = (),
    ) -> dict[int, str]:
        await _round_trip()
        member_row_key(member.instance)
        for lease in [*hold, *release]:
            stored = self._buckets.get(lease.bucket)
            if (stored.etag if stored else None) != lease.etag:
                raise ConcurrencyConflict("supervisor roster", f"bucket {lease.bucket}")
        for gone in reap:
            stored_member = self._members.get(gone.instance)
            if stored_member is None or stored_member.etag != gone.etag:
                raise ConcurrencyConflict("supervisor roster", f"member {gone.instance}")
        self._members[member.instance] = dataclasses.replace(
            member, until=utc(member.until), etag=self._etag()
        )
        etags = {}
        for lease in [*hold, *release]:
            etags[lease.bucket] = self._etag()
            self._buckets[lease.bucket] = _in_utc(lease, etags[lease.bucket])
        for gone in reap:
            del self._members[gone.instance]
        return etags

    async def checkpoint(
        self, sweeps: Sequence[Sweep], by: str, *, others: Sequence[BucketLease] = ()
    ) -> int:
        await _round_trip()
        written = [swept_lease(sweep, by) for sweep in sweeps] + list(others)
        recorded = 0
        for lease in written:
            stored = self._buckets.get(lease.bucket)
            if stored is None or stored.etag != lease.etag:
                continue
            self._buckets[lease.bucket] = _in_utc(lease, self._etag())
            recorded += 1
        return recorded

    def _etag(self) -> str:
        return f"s{next(self._etags)}"


def _in_utc(lease: BucketLease, etag: str) -> BucketLease:
    """As the table stores it: times in UTC (naive ones refused), a new ETag."""
    until = utc(lease.until) if lease.until is not None else None
    swept = utc(lease.swept_at) if lease.swept_at is not None else None
    return dataclasses.replace(lease, until=until, swept_at=swept, etag=etag)


class MemoryPurgeLog:
    """:class:`adapters.store.purge_log.PurgeLog` in memory."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[str, Any]] = {}

    async def record(self, run_id: str, at: datetime, report: Mapping[str, Any]) -> None:
        await _round_trip()
        self._rows[newest_first_key(at, run_id)] = json.loads(json.dumps(report, default=str))

    async def recent(self, limit: int = 20) -> list[dict[str, Any]]:
        await _round_trip()
        if not 1 <= limit <= MAX_RECENT:
            raise ValueError(f"limit must be from 1 to {MAX_RECENT}")
        return [self._rows[key] for key in sorted(self._rows)[:limit]]


class MemoryStore:
    """:class:`adapters.store.records.OrderRecords` (the state store with operators' reads and the
    purge) in memory."""

    def __init__(self, clock: Callable[[], datetime] = utc_now) -> None:
        self._clock = clock
        self._orders: dict[str, Order] = {}
        self._details: dict[str, tuple[OrderSubmitted, str]] = {}
        self._timelines: dict[str, list[TimelineEntry]] = {}
        self._etags = itertools.count(1)
        self.index = MemoryIndex(clock)
        self.errors = MemoryIndex(clock)
        self.supervision = MemorySupervision()
        self.purges = MemoryPurgeLog()

    async def ensure_tables(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def create(
        self,
        submitted: OrderSubmitted,
        order: Order,
        entry: TimelineEntry,
        *,
        due: datetime | None = None,
    ) -> Order | AlreadyExists:
        payload_hash = submitted.content_hash()
        added = await self.index.add(order.order_id, order.generation, order.workflow, due)
        await _round_trip()
        existing = self._orders.get(order.order_id)
        if existing is not None:
            if added and (existing.state.terminal or existing.generation != 1):
                await self.index.discard(order.order_id, 1)
            stored_hash = self._details[order.order_id][1]
            return AlreadyExists(stored_hash == payload_hash, stored_hash, existing)
        stored = dataclasses.replace(order, etag=self._etag())
        self._orders[order.order_id] = stored
        self._details[order.order_id] = (submitted, payload_hash)
        self._timelines[order.order_id] = [entry]
        return stored

    async def load(self, order_id: str) -> Order:
        await _round_trip()
        try:
            return self._orders[order_id]
        except KeyError:
            raise OrderNotFound(order_id) from None

    async def find(self, order_id: str) -> Order | None:
        await _round_trip()
        return self._orders.get(order_id)

    async def get_order(self, order_id: str) -> OrderRecord:
        order = await self.load(order_id)
        details, payload_hash = self._details[order_id]
        return OrderRecord(details=details, payload_hash=payload_hash, process=order)

    async def get_timeline(
        self, order_id: str, *, after_seq: int = -1, limit: int = 1000
    ) -> list[TimelineEntry]:
        await _round_trip()
        entries = [e for e in self._timelines.get(order_id, []) if e.seq > after_seq]
        return entries[:limit]

    async def save(
        self, before: Order, after: Order, entry: TimelineEntry, *, due: datetime | None = None
    ) -> Order:
        if due is not None or (before.state.terminal and after.state.in_flight):
            await self.index.put(after.order_id, after.generation, after.workflow, due)
        entering_error = (
            after.state is ProcessState.ERROR and before.state is not ProcessState.ERROR
        )
        error_row = (
            await self.errors.insert(after.order_id, after.generation) if entering_error else None
        )
        await _round_trip()
        stored = self._orders.get(before.order_id)
        if stored is None or stored.etag != before.etag:
            if error_row is not None:
                await self.errors.discard(after.order_id, after.generation, etag=error_row)
            if stored is None:
                raise OrderNotFound(before.order_id)
            raise ConcurrencyConflict(before.order_id, "ETag changed")
        saved = dataclasses.replace(after, etag=self._etag())
        self._orders[before.order_id] = saved
        self._timelines[before.order_id].append(entry)
        if before.state is ProcessState.ERROR and after.state is not ProcessState.ERROR:
            await self.errors.discard(before.order_id, before.generation)
        return saved

    async def annotate(self, order: Order, *, actor: str, event: str, detail: str = "") -> Order:
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
        return await self.save(order, after, entry)

    async def list_active(
        self, limit: int = 1000, *, continuation: str | None = None
    ) -> ActivePage:
        await _round_trip()
        rows = self.index.rows()
        start = int(continuation or 0)
        page = tuple(rows[start : start + limit])
        more = start + limit < len(rows)
        return ActivePage(rows=page, continuation=str(start + limit) if more else None)

    async def all_active(self) -> AsyncIterator[ActiveRow]:
        await _round_trip()
        for row in self.index.rows():  # noqa: UP028, RUF100 (an async generator has no yield from)
            yield row

    async def reap_active(
        self, row: ActiveRow, order: Order | None, *, grace: timedelta = DEFAULT_GRACE
    ) -> bool:
        return await self.index.reap(row, order, grace=grace)

    async def purge_candidates(
        self,
        before: datetime,
        states: Iterable[ProcessState] = PURGEABLE_STATES,
        *,
        page_size: int = 1000,
    ) -> AsyncIterator[Candidate]:
        await _round_trip()
        wanted = {ProcessState(s) for s in states}
        if not wanted or any(s.in_flight for s in wanted):
            raise ValueError("only finished states (Processed, Error) can be purged")
        for order in sorted(self._orders.values(), key=lambda o: o.order_id):
            if order.state in wanted and order.updated_at < before:
                yield Candidate(order.order_id, order.state, order.updated_at)

    async def snapshot(self, order_id: str) -> OrderSnapshot | None:
        await _round_trip()
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

    async def purge(self, snapshot: OrderSnapshot) -> DeleteOutcome:
        await _round_trip()
        order_id = snapshot.process.order_id
        stored = self._orders.get(order_id)
        if stored is None:
            return DeleteOutcome.GONE
        if stored.etag != snapshot.process.etag:
            return DeleteOutcome.CHANGED
        del self._orders[order_id], self._details[order_id], self._timelines[order_id]
        return DeleteOutcome.PURGED

    async def finish_purge(self, order_id: str) -> bool:
        await _round_trip()
        return False  # one purge is one step here: nothing is ever left half done

    def orders(self) -> list[Order]:
        return list(self._orders.values())

    def _etag(self) -> str:
        return f"e{next(self._etags)}"


class MemoryArchive:
    """:class:`adapters.archive.BlobArchive` in memory: the same JSON lines, one list per blob."""

    def __init__(self) -> None:
        self._blobs: dict[str, list[bytes]] = {}

    async def append(self, day: date, records: Sequence[archive.ArchivedOrder]) -> str:
        await _round_trip()
        name = archive.blob_name(day)
        self._blobs.setdefault(name, []).extend(archive.encode(r) for r in records)
        return name

    async def lines(self, blob: str) -> AsyncIterator[bytes]:
        await _round_trip()
        for line in list(self._blobs.get(blob, [])):
            yield line.rstrip(b"\n")

    async def blobs(self, day: date | None = None) -> list[str]:
        await _round_trip()
        prefix = archive_reading.day_prefix(day) if day is not None else ""
        return sorted(name for name in self._blobs if name.startswith(prefix))


@dataclass(frozen=True, slots=True)
class Sent:
    queue: str
    message: MessageBase
    scheduled_at: datetime | None


class SendFailed(Exception):
    """The bus was told to fail: the process 'crashed' before this send."""


class MemoryBus:
    """:class:`adapters.servicebus.Bus` in memory: records sends, drops duplicates by MessageId."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self._kept: dict[tuple[str, str], MessageBase] = {}
        self.dropped: list[tuple[MessageBase, MessageBase]] = []
        """Each message dropped as a duplicate, after the one kept under its MessageId."""
        self.fail_after: int | None = None
        """Sends left before every further send fails (None: never fail)."""
        self.attempts = 0

    async def send(
        self, queue: str, message: MessageBase, *, scheduled_at: datetime | None = None
    ) -> None:
        await _round_trip()
        self.attempts += 1
        if self.fail_after is not None:
            if self.fail_after <= 0:
                raise SendFailed(f"send of {message_id_for(message)} to {queue} failed")
            self.fail_after -= 1
        key = (queue, message_id_for(message))
        kept = self._kept.get(key)
        if kept is not None:
            self.dropped.append((kept, message))
            return
        self._kept[key] = message
        self.sent.append(Sent(queue, message, scheduled_at))

    def on(self, queue: str) -> list[Any]:
        return [s.message for s in self.sent if s.queue == queue]

    async def close(self) -> None:
        pass
