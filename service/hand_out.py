"""A tick hands the rows it found due out to the fleet: every instance recovers, the tick only
finds, marks and sends.

The timer runs on one instance at a time, so a tick that recovered every order itself would
recover at one instance's pace whatever the size of the fleet. Instead, past a handful of rows
(:data:`INLINE_ROWS`, handled in the tick as before), the tick hands the rows out: for each
bucket, most overdue first, in messages of a few rows (:func:`rows_per_message`)
(:class:`domain.messages.DueRows`) on the scheduler-commands queue, which every instance
consumes (:mod:`service.recovery` recovers them, each order as the tick would, on its own clock).

Before it sends a message the tick marks its rows handed out, in one transaction conditional
on each row as found (:meth:`adapters.store.active_index.ActiveOrderIndex.hand_out`): the row's
due time moves to the lease's end, so the next tick does not hand it out again, and a row that
changed meanwhile (moved on by a recovery or a write to its order) is left out. Then the
messages go, most overdue first. Whoever recovers a row moves it on and ends its hand-out; a row
nobody moved on by the lease's end (a message lost to a crash between mark and send, a worker
killed or paused mid-way, a recovery that failed) comes due again and is handed out anew, in a
new message (a message names its rows and the due times they were found at). So a kill costs
one period, as a Supervisor holder's does. The recovery itself is one write conditional on the
order's ETag: a row handed out twice is recovered once.

The lease ends before the next tick, so that tick sees what the fleet did not move on: the rows
of the previous hand-out found due again (*returned*). From them each bucket measures the
fleet's pace (:func:`pace`), and the tick hands out at most what the fleet moved on in the last
period, twice that while it kept up (at first :func:`first_hand_out`), the most overdue first
(:func:`allowance`): the queue holds about a period of work, rows wait in the index (where
``GET /api/supervisor`` counts them), and a message rarely waits past its lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from adapters.store.rows import ActiveRow
from adapters.store.supervision import BucketLease
from domain.messages import DueRow, DueRows
from service.runtime import Runtime

log = logging.getLogger("service.hand_out")

INLINE_ROWS: Final = 16
"""A tick that finds at most this many rows due handles them itself: handing out costs a
message and a transaction for little gain."""


def rows_per_message(period_s: float) -> int:
    """Rows per DueRows message: four per second of the period, 8 to 32. Fewer messages cost
    fewer Service Bus operations (each counts, sends and receives alike); but a message's rows
    are moved on together once all are recovered, and a tick measures the fleet's pace by what
    was moved on within a lease (under a period). Measured on the local stack
    (benchmarks.mass_stall, a 2 s period): with 32 rows a message most hand-outs were unfinished
    at the next tick, which handed them out again; with 8, 1,000 orders drained in half the
    time. At the default 15 s period a message of 32 rows takes a small part of its lease."""
    return min(32, max(8, round(4 * period_s)))


FIRST_RATE: Final = 16.0
"""Rows a second a bucket hands out before the fleet's pace is measured (and at least while
the fleet keeps up; one that fell behind gets what it moved on, a message at least): 512 rows
a tick at a 2 s period, 3,840 at 15 s, doubling each period the fleet keeps up."""


def first_hand_out(period_s: float) -> int:
    return round(FIRST_RATE * period_s)


GROWTH: Final = 2
"""While the fleet kept up, a bucket hands out this many times what it moved on."""


@dataclass(frozen=True, slots=True)
class Pace:
    """What a bucket's previous hand-out says about the fleet's pace."""

    returned: int
    """Rows of it found due again: the lease ran out before anyone moved them on."""
    moved_on: int
    """Rows of it moved on within the lease."""
    rate: float
    """``moved_on`` per second since it."""


def pace(lease: BucketLease, at: datetime, rows: Sequence[ActiveRow]) -> Pace:
    """The fleet's pace on the bucket of ``lease`` as its rows due at ``at`` show it."""
    since = lease.dispatched_at
    returned = sum(1 for r in rows if since is not None and r.dispatched_at == since)
    if not lease.dispatched or since is None:
        return Pace(returned, 0, 0.0)
    moved_on = max(0, lease.dispatched - returned)
    seconds = (at - since).total_seconds()
    return Pace(returned, moved_on, moved_on / seconds if seconds > 0 else 0.0)


def allowance(paces: Sequence[Pace], period_s: float) -> int:
    """Rows the buckets of ``paces`` (those a tick holds) may hand out together this tick: what
    the fleet moved on of their last hand-outs, twice that while it moved on all of them (and
    :func:`first_hand_out` a bucket at least); while it fell behind, what it moved on, and one
    message at least, to find out whether it is back. Counted over the buckets together, not
    each: a fleet that is behind gets one message, not one for each of 16 buckets."""
    moved_on = sum(p.moved_on for p in paces)
    if any(p.returned for p in paces):
        return max(rows_per_message(period_s), moved_on)
    return max(len(paces) * first_hand_out(period_s), GROWTH * moved_on)


MAX_READ: Final = 4000
"""The most rows a bucket reads per tick (four Table pages)."""


def read_limit(lease: BucketLease, page: int) -> int:
    """How many rows due a tick reads in the bucket of ``lease``: a page, or twice what it
    handed out last (:func:`allowance`), up to :data:`MAX_READ`."""
    return min(MAX_READ, max(page, GROWTH * lease.dispatched))


@dataclass(frozen=True, slots=True)
class Chunk:
    """The rows of one message: one bucket's, in key order (the instance that takes it reads
    them back with one query over their range of keys)."""

    bucket: int
    rows: tuple[ActiveRow, ...]

    @property
    def overdue_since(self) -> datetime:
        """When its most overdue row came due: messages go out most overdue first."""
        return min(row.overdue_since for row in self.rows)


def chosen(rows: Sequence[ActiveRow], cap: int) -> list[ActiveRow]:
    """The ``cap`` most overdue of ``rows`` (of all the buckets a tick holds)."""
    return sorted(rows, key=lambda r: (r.overdue_since, r.row_key))[:cap]


def chunks(due: Sequence[tuple[int, Sequence[ActiveRow]]], per_message: int) -> list[Chunk]:
    """``due``'s rows (per bucket, those to hand out) in messages of ``per_message`` rows, most
    overdue message first."""
    out = []
    for bucket, rows in due:
        ordered = sorted(rows, key=lambda r: r.row_key)
        for start in range(0, len(ordered), per_message):
            out.append(Chunk(bucket, tuple(ordered[start : start + per_message])))
    return sorted(out, key=lambda c: (c.overdue_since, c.bucket))


@dataclass
class Handed:
    """What became of one chunk: rows marked (those that changed since found are not: they
    were moved on meanwhile) and sent; None if it was not tried (the tick's time ran out, or
    an earlier mark or send failed)."""

    marked: int = 0
    sent: bool = False


async def hand_out(
    rt: Runtime,
    plan: Sequence[Chunk],
    *,
    until: datetime,
    at: datetime,
    deadline: float,
    limit: asyncio.Semaphore,
) -> list[Handed | None]:
    """Mark each chunk's rows handed out until ``until``, then send its message, the most
    overdue first. Marks run ahead of the sends (``limit`` at once); a chunk not begun before
    ``deadline`` (monotonic) is not handed out, and once a mark or a send fails none after it
    is (what was marked and not sent comes due again at ``until``)."""
    broken = asyncio.Event()

    async def mark(chunk: Chunk) -> tuple[ActiveRow, ...] | None:
        async with limit:
            if time.monotonic() >= deadline or broken.is_set():
                return None
            try:
                return await rt.store.index.hand_out(chunk.rows, until, at, uuid.uuid4().hex)
            except Exception:  # the storage failing: what is not marked waits for the next tick
                log.exception("marking %d rows of bucket %d failed", len(chunk.rows), chunk.bucket)
                broken.set()
                return None

    marking = [asyncio.ensure_future(mark(chunk)) for chunk in plan]
    results: list[Handed | None] = []
    try:
        for chunk, task in zip(plan, marking, strict=True):
            marked = await task
            if marked is None or broken.is_set():
                results.append(None)
                continue
            if not marked:
                results.append(Handed())
                continue
            try:
                await rt.bus.send(
                    rt.settings.queue("commands"), message(rt, chunk, marked, until, at)
                )
            except Exception:
                log.exception("handing out %d rows of bucket %d failed", len(marked), chunk.bucket)
                broken.set()
                results.append(Handed(marked=len(marked)))
                continue
            results.append(Handed(marked=len(marked), sent=True))
    finally:
        for task in marking:
            task.cancel()
    return results


def message(
    rt: Runtime, chunk: Chunk, marked: Sequence[ActiveRow], until: datetime, at: datetime
) -> DueRows:
    """The DueRows message for the rows of ``chunk`` that were marked (``marked``)."""
    found = {row.row_key: row for row in chunk.rows}
    return DueRows(
        bucket=chunk.bucket,
        hand_out=marked[0].dispatch_id,
        rows=tuple(
            DueRow(
                order_id=row.order_id,
                generation=row.generation,
                found_due=found[row.row_key].due_at,
            )
            for row in marked
        ),
        leased_until=until,
        dispatched_at=at,
        requested_by=rt.actor("supervisor"),
    )
