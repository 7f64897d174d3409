"""One Supervisor tick: claim a fair share of the index's buckets, sweep what is due in them,
or hand it out to the app's instances.

The active-order index keeps, per order in flight, a due time never later than when the
Supervisor must look at it (:mod:`adapters.store.active_index`), so sweeping a bucket is one
query for the rows due now plus a point read of each of those orders: a tick costs what is due,
not what is in flight or was ever processed. For each order the lifecycle decides
(:mod:`domain.lifecycle`, event ``Swept``): an order past CompleteBy (an agent or scheduler died,
or the agent gave up silently at its deadline) or waiting without progress is released for a
delayed retry, resent what it owes, or compensated at the failure threshold; a finished order
whose row is still there owes its final messages, which are sent again before the row goes.
Then the row is moved up to the order's next due time. The Supervisor never calls remote
services and knows no business rules: it hands orders back, asks agents to undo, and reports.
What it writes or sends for an order runs in a ``supervisor_recover`` span in that order's trace,
linked to the tick (:func:`adapters.telemetry.continuing`); a look that changes nothing stays in the
tick's span.

Work that survives the worker (:mod:`service.leases`):

- Instances share the buckets through per-bucket leases (one roster read and one batch claim
  per tick); an instance that dies releases its buckets when their leases expire.
- The rows due in all held buckets are read concurrently. A handful (``inline_rows``) are
  handled by the tick itself, concurrently, the most overdue first across buckets, within a
  time budget below the period (and so below the lease): under a burst the oldest wait is
  served first and no bucket is starved. More are handed out to every instance of the app, at
  the pace the fleet keeps (:mod:`service.hand_out`; :mod:`service.recovery` recovers them with
  :func:`look`, as the tick would). A bucket whose due rows were all handled or handed out
  records a checkpoint; one the budget cut short keeps its old checkpoint and is claimed first
  next tick, by whoever holds it. Either way the bucket's row records what the tick measured
  of the backlog and the fleet's pace (:func:`service.operations.supervisor.lag` sums it up).
- Progress inside a bucket needs no checkpoint: a handled row is moved to its next due time,
  and a handed-out row to the end of its hand-out's lease, so a new holder finds only the rows
  not handled yet, and those whose hand-out was not carried out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from adapters.store.active_index import DEFAULT_GRACE
from adapters.store.rows import ActiveRow, ConcurrencyConflict, CorruptOrderState
from adapters.store.supervision import BucketLease, Sweep
from domain.events import Swept
from domain.lifecycle import decide
from domain.messages import OperatorAlert
from domain.workflows import UnknownWorkflow
from service import apply, deadlines, hand_out, leases
from service.runtime import Runtime
from service.sweep_report import TickReport, record_tick

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger("service.sweep")

PAGE_SIZE = 500
"""Due rows taken per bucket and tick; the rest are first in line next tick."""
CLAIM_ATTEMPTS = 3
RECOVER_SPAN = "supervisor_recover"
BACKLOG_REASON = "supervisor_backlog"
_OUTCOMES = {"released": "retried", "compensation_started": "compensating", "error": "failed"}


async def run_tick(
    rt: Runtime, *, budget_s: float | None = None, inline_rows: int = hand_out.INLINE_ROWS
) -> TickReport:
    """One tick: rows are taken up for ``budget_s`` (default: the settings' budget), and every
    Table call ends by the tick's claim (:func:`service.deadlines.tick`). A tick that finds at
    most ``inline_rows`` rows due recovers them itself; more, it hands them out to the fleet
    (:mod:`service.hand_out`)."""
    started = time.monotonic()
    budget = rt.settings.supervisor_budget.total_seconds() if budget_s is None else budget_s
    deadline = started + budget
    report = TickReport()
    claimed_at = rt.clock()
    with deadlines.tick(rt.settings, budget):
        plan = await _claim(rt)
        report.held = len(plan.hold)
        closing: list[_Closing] = []
        if plan.hold:
            limit = asyncio.Semaphore(rt.settings.supervisor_concurrency)
            found = await _gather(limit, lambda lease: _due(rt, lease), plan.hold)
            _found(found, report)
            if sum(len(f.rows) for f in found) <= inline_rows:
                closing = await _sweep(rt, limit, found, deadline, report)
            else:
                # Handing out is quick (a transaction and a send per message): it may go on
                # past the budget, up to the tick's bound, so that a tick whose queries took
                # the budget (a loaded host) still hands out what it found.
                bound = started + deadlines.tick_seconds(rt.settings, budget)
                closing = await _hand_out(rt, limit, found, claimed_at, bound, report)
            await _close(rt, plan, closing, claimed_at + rt.settings.supervisor_lease)
    report.swept = sum(c.sweep is not None for c in closing)
    report.drain_rate = round(sum(c.lease.drain_rate for c in closing), 3)
    report.duration_s = round(time.monotonic() - started, 3)
    record_tick(report)
    if report.left:
        await _behind(rt, report)
    if report.due or report.swept < report.held:
        log.info("supervisor tick: %s", report)
    return report


async def _claim(rt: Runtime) -> leases.Plan:
    """This tick's buckets, each with the ETag of its claimed lease. After lost races (another
    instance claimed at the same moment), a claim that only renews what this one holds."""
    for attempt in range(CLAIM_ATTEMPTS):
        now = rt.clock()
        plan = leases.plan(
            await rt.store.supervision.read(),
            rt.instance_id,
            now,
            rt.settings.supervisor_claim,
            rt.settings.supervisor_lease,
            take=attempt < CLAIM_ATTEMPTS - 1,
        )
        try:
            etags = await rt.store.supervision.claim(plan.member, plan.hold, (), plan.reap)
        except ConcurrencyConflict:
            continue  # read the roster again
        return dataclasses.replace(
            plan, hold=tuple(dataclasses.replace(b, etag=etags[b.bucket]) for b in plan.hold)
        )
    log.info("supervisor roster kept changing; sweeping nothing this tick")
    return leases.Plan(member=plan.member, hold=(), release=(), reap=())


@dataclass(frozen=True)
class _Closing:
    """A held bucket at the end of the tick: its lease with what the tick measured, and its
    sweep if every row due in it was handled or handed out."""

    lease: BucketLease
    sweep: Sweep | None


async def _close(rt: Runtime, plan: leases.Plan, closing: list[_Closing], until: datetime) -> None:
    """Extend the leases of what was held to ``until`` (the next tick renews them), give up the
    surplus, and record the buckets swept and what the tick measured, in one write."""
    now = rt.clock()
    surplus = {b.bucket for b in plan.release}

    def closed(lease: BucketLease) -> BucketLease:
        if lease.bucket in surplus:
            return dataclasses.replace(lease, holder="", until=now)
        return dataclasses.replace(lease, until=until)

    measured = {c.lease.bucket: c for c in closing}
    sweeps = [dataclasses.replace(c.sweep, lease=closed(c.lease)) for c in closing if c.sweep]
    others = [
        closed(measured[b.bucket].lease if b.bucket in measured else b)
        for b in plan.hold
        if b.bucket not in measured or measured[b.bucket].sweep is None
    ]
    await rt.store.supervision.checkpoint(sweeps, rt.instance_id, others=others)


@dataclass(frozen=True)
class _Found:
    lease: BucketLease
    at: datetime
    rows: tuple[ActiveRow, ...]
    limit: int

    @property
    def full(self) -> bool:
        """As many rows as were asked for: more may be due than were read."""
        return len(self.rows) >= self.limit


async def _due(rt: Runtime, lease: BucketLease) -> _Found:
    """The rows due in ``lease``'s bucket: a page, or what the bucket may hand out if more."""
    now = rt.clock()
    limit = hand_out.read_limit(lease, PAGE_SIZE)
    return _Found(lease, now, await rt.store.index.due(lease.bucket, now, limit), limit)


def _found(found: list[_Found], report: TickReport) -> None:
    report.queries += len(found)
    report.due += sum(len(f.rows) for f in found)
    report.lag_s = max((_lag(f) for f in found), default=0.0)


async def _sweep(
    rt: Runtime, limit: asyncio.Semaphore, found: list[_Found], deadline: float, report: TickReport
) -> list[_Closing]:
    """Handle the rows found due, most overdue first across all held buckets, until the budget
    is spent; the buckets whose rows were all handled are swept."""
    rows = sorted(
        ((f.at - row.overdue_since, n, row) for n, f in enumerate(found) for row in f.rows),
        key=lambda item: item[0],
        reverse=True,
    )
    outcomes = await _gather(limit, lambda item: _handle(rt, item[2], deadline), rows)
    handled = [0] * len(found)
    for (_, n, _row), outcome in zip(rows, outcomes, strict=True):
        if outcome is None:
            continue  # out of budget: the row is still due, its bucket first next tick
        handled[n] += 1
        report.count(outcome)
    period = rt.settings.supervisor_period.total_seconds()
    closing = []
    for f, done in zip(found, handled, strict=True):
        paced = hand_out.pace(f.lease, f.at, f.rows)
        left = len(f.rows) - done
        report.left += left
        report.returned += paced.returned
        lease = _measured(f, paced, dispatched=0, left=left, rate=paced.rate + done / period)
        closing.append(_Closing(lease, _swept(f, lease) if not left and not f.full else None))
    return closing


async def _hand_out(
    rt: Runtime,
    limit: asyncio.Semaphore,
    found: list[_Found],
    claimed_at: datetime,
    deadline: float,
    report: TickReport,
) -> list[_Closing]:
    """Hand the rows found due out to the fleet (:mod:`service.hand_out`): as many as the
    fleet's pace allows, the most overdue first across the buckets. A bucket whose rows were
    all handed out is swept."""
    period = rt.settings.supervisor_period.total_seconds()
    paces = [hand_out.pace(f.lease, f.at, f.rows) for f in found]
    allowed = hand_out.allowance(paces, period)
    picked = {r.row_key for r in hand_out.chosen([r for f in found for r in f.rows], allowed)}
    chosen = [(f.lease.bucket, [r for r in f.rows if r.row_key in picked]) for f in found]
    plan = hand_out.chunks(chosen, hand_out.rows_per_message(period))
    until = claimed_at + rt.settings.supervisor_claim
    began = time.monotonic()
    handed = await hand_out.hand_out(
        rt, plan, until=until, at=claimed_at, deadline=deadline, limit=limit
    )
    report.hand_out_s = round(time.monotonic() - began, 3)
    marked: dict[int, int] = {}
    untried: dict[int, int] = {}
    for chunk, result in zip(plan, handed, strict=True):
        if result is None:
            untried[chunk.bucket] = untried.get(chunk.bucket, 0) + len(chunk.rows)
            continue
        if result.marked and not result.sent:  # due again when the lease ends
            untried[chunk.bucket] = untried.get(chunk.bucket, 0) + result.marked
        marked[chunk.bucket] = marked.get(chunk.bucket, 0) + result.marked
        report.handed_out += result.marked if result.sent else 0
        report.messages += result.sent
    closing = []
    for f, paced, (_, rows) in zip(found, paces, chosen, strict=True):
        bucket = f.lease.bucket
        left = len(f.rows) - len(rows) + untried.get(bucket, 0)
        report.left += left
        report.returned += paced.returned
        dispatched = marked.get(bucket, 0)
        lease = _measured(f, paced, dispatched=dispatched, left=left, rate=paced.rate)
        if dispatched:
            lease = dataclasses.replace(lease, dispatched_at=claimed_at)
        closing.append(_Closing(lease, _swept(f, lease) if not left and not f.full else None))
    return closing


def _measured(
    found: _Found, paced: hand_out.Pace, *, dispatched: int, left: int, rate: float
) -> BucketLease:
    """The bucket's lease with what this tick measured of it."""
    return dataclasses.replace(
        found.lease,
        dispatched=dispatched,
        dispatched_at=None,
        returned=paced.returned,
        drain_rate=round(rate, 3),
        left=left,
        due_found=len(found.rows),
    )


def _swept(found: _Found, lease: BucketLease) -> Sweep:
    return Sweep(lease=lease, at=found.at, lag_s=_lag(found), due_found=len(found.rows))


def _lag(found: _Found) -> float:
    return max(((found.at - row.overdue_since).total_seconds() for row in found.rows), default=0.0)


async def _handle(rt: Runtime, row: ActiveRow, deadline: float) -> str | None:
    """What became of ``row``: None if the budget was spent first, else its outcome."""
    if time.monotonic() >= deadline:
        return None
    return await recover(rt, row)


async def recover(rt: Runtime, row: ActiveRow) -> str:
    """Look at the order of ``row``, found due, recover it if it is, and move the row on: the
    outcome counted in a report ("" for none). The tick calls it for the rows it handles
    itself."""
    outcome, move_to = await look(rt, row)
    if move_to is not None:
        try:
            await rt.store.index.postpone(row, move_to)
        except Exception:
            log.exception("order %s: its index row could not be moved on", row.order_id)
    return outcome


async def look(rt: Runtime, row: ActiveRow) -> tuple[str, datetime | None]:
    """:func:`recover` but for moving the row on: the outcome, and when the row is due next
    (None: leave it, it is gone or its order could not be looked at). :mod:`service.recovery`
    moves the rows of a message on together."""
    try:
        return await _inspect(row, rt)
    except ConcurrencyConflict:
        return "conflicts", None  # the order moved on while we looked: nothing to recover
    except CorruptOrderState as exc:
        log.error("order %s cannot be read: %s", row.order_id, exc)
        return "errors", None
    # One order whose messages cannot be sent now must not stop the others; its outbox is
    # still on its record and its row is still due (or comes due when its hand-out's lease
    # ends).
    except Exception:
        log.exception("order %s: recovery failed; the next tick tries again", row.order_id)
        return "errors", None


async def _behind(rt: Runtime, report: TickReport) -> None:
    """Alert that the backlog does not drain within a period. The text is fixed, so the alerts
    of the ticks of one stall are one alert per duplicate-detection window; the numbers are in
    the log, the metrics and ``GET /api/supervisor``."""
    period = rt.settings.supervisor_period.total_seconds()
    log.warning(
        "supervisor backlog: %d rows due, %d left for the next tick, %.1f rows/s moved on",
        report.due,
        report.left,
        report.drain_rate,
    )
    alert = OperatorAlert(
        order_id=None,
        severity="warning",
        reason=BACKLOG_REASON,
        detail=(
            f"The Supervisor found more orders due than it recovers within a period ({period:g} "
            "s): they are recovered later than the recovery bound says. `orderctl supervisor` "
            "or GET /api/supervisor shows the backlog, the rate it drains at and the time to "
            "drain it. Stalls of many orders at once drain at the pace of the instances that "
            "take scheduler-commands: raise the app's instance count, or find what stalled them."
        ),
        source=rt.actor("supervisor"),
    )
    try:
        await rt.alert(alert)
    except Exception:
        log.exception("the backlog alert could not be sent; the next tick tries again")


async def _inspect(row: ActiveRow, rt: Runtime) -> tuple[str, datetime | None]:
    order = await rt.store.find(row.order_id)
    if order is None or order.generation != row.generation:
        if await rt.store.reap_active(row, order):
            return "reaped", None
        # Young garbage, or a create on its way: look again before that order could be due,
        # and reap it once it is old enough.
        recheck = apply.earliest_due(rt, rt.clock())
        return "", min(recheck, row.written_at + DEFAULT_GRACE)
    try:
        ctx = apply.context(rt, order.workflow, rt.actor("supervisor"))
    except UnknownWorkflow as missing:
        await apply.park(rt, order, missing, rt.actor("supervisor"))
        return "parked", rt.clock() + apply.PARKED_RECHECK
    swept = Swept()
    decision = decide(order, swept, ctx)
    acts = decision.order is not None or bool(decision.send)
    with apply.in_order_trace(RECOVER_SPAN if acts else None, order, ctx.actor):
        after = await apply.carry_out(rt, order, decision, swept)
    # The row was due, the order may not be (the row is kept early): move the row up. If the
    # write above moved it already, the row's ETag changed and the move does nothing.
    move_to = None if decision.finished else apply.due(rt, after)
    if decision.entry is not None:
        return _OUTCOMES.get(decision.entry.event, ""), move_to
    return ("flushed" if decision.finished and decision.order is None else ""), move_to


async def _gather(
    limit: asyncio.Semaphore, fn: Callable[[T], Awaitable[R]], items: Iterable[T]
) -> list[R]:
    """``fn`` of each item, at most ``limit`` at once, results in order. Each runs in a task
    with a copy of the tick's context, so the commands and alerts a sweep sends stay in the
    tick's trace instead of each starting a new one."""

    async def one(item: T) -> R:
        async with limit:
            return await fn(item)

    return list(await asyncio.gather(*(one(item) for item in items)))
