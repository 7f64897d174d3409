"""One Supervisor tick: claim a fair share of the index's buckets, sweep what is due in them.

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
- The rows due in all held buckets are read concurrently and handled concurrently, the most
  overdue first across buckets, within a time budget below the period (and so below the
  lease): under a burst the oldest wait is served first and no bucket is starved. A bucket
  whose due rows were all handled records a checkpoint; one the budget cut short keeps its
  old checkpoint and is claimed first next tick, by whoever holds it.
- Progress inside a bucket needs no checkpoint: a handled row is moved to its next due time, so
  a new holder finds only the rows not handled yet.
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
from domain.workflows import UnknownWorkflow
from service import apply, deadlines, leases
from service.runtime import Runtime
from service.sweep_report import TickReport, record_tick

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger("service.sweep")

PAGE_SIZE = 500
"""Due rows taken per bucket and tick; the rest are first in line next tick."""
CLAIM_ATTEMPTS = 3
RECOVER_SPAN = "supervisor_recover"
_OUTCOMES = {"released": "retried", "compensation_started": "compensating", "error": "failed"}


async def run_tick(rt: Runtime, *, budget_s: float | None = None) -> TickReport:
    """One tick: rows are taken up for ``budget_s`` (default: the settings' budget), and every
    Table call ends by the tick's claim (:func:`service.deadlines.tick`)."""
    started = time.monotonic()
    budget = rt.settings.supervisor_budget.total_seconds() if budget_s is None else budget_s
    deadline = started + budget
    report = TickReport()
    claimed_at = rt.clock()
    with deadlines.tick(rt.settings, budget):
        plan = await _claim(rt)
        report.held = len(plan.hold)
        sweeps: list[Sweep] = []
        if plan.hold:
            limit = asyncio.Semaphore(rt.settings.supervisor_concurrency)
            found = await _gather(limit, lambda lease: _due(rt, lease), plan.hold)
            sweeps = await _sweep(rt, limit, found, deadline, report)
            await _close(rt, plan, sweeps, claimed_at + rt.settings.supervisor_lease)
    report.swept = len(sweeps)
    report.duration_s = round(time.monotonic() - started, 3)
    record_tick(report)
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


async def _close(rt: Runtime, plan: leases.Plan, sweeps: list[Sweep], until: datetime) -> None:
    """Extend the leases of what was held to ``until`` (the next tick renews them), give up the
    surplus, and record the buckets swept, in one write."""
    now = rt.clock()
    surplus = {b.bucket for b in plan.release}

    def closed(lease: BucketLease) -> BucketLease:
        if lease.bucket in surplus:
            return dataclasses.replace(lease, holder="", until=now)
        return dataclasses.replace(lease, until=until)

    swept = {s.lease.bucket for s in sweeps}
    await rt.store.supervision.checkpoint(
        [dataclasses.replace(s, lease=closed(s.lease)) for s in sweeps],
        rt.instance_id,
        others=[closed(b) for b in plan.hold if b.bucket not in swept],
    )


@dataclass(frozen=True)
class _Found:
    lease: BucketLease
    at: datetime
    rows: tuple[ActiveRow, ...]


async def _due(rt: Runtime, lease: BucketLease) -> _Found:
    now = rt.clock()
    return _Found(lease, now, await rt.store.index.due(lease.bucket, now, PAGE_SIZE))


async def _sweep(
    rt: Runtime, limit: asyncio.Semaphore, found: list[_Found], deadline: float, report: TickReport
) -> list[Sweep]:
    """Handle the rows found due, most overdue first across all held buckets, until the budget
    is spent; the buckets whose rows were all handled are swept."""
    rows = sorted(
        ((f.at - row.due_at, n, row) for n, f in enumerate(found) for row in f.rows),
        key=lambda item: item[0],
        reverse=True,
    )
    report.queries += len(found)
    report.due += len(rows)
    if rows:
        report.lag_s = rows[0][0].total_seconds()
    outcomes = await _gather(limit, lambda item: _handle(rt, item[2], deadline), rows)
    left = [len(f.rows) for f in found]
    for (_, n, _row), outcome in zip(rows, outcomes, strict=True):
        if outcome is None:
            continue  # out of budget: the row is still due, its bucket first next tick
        left[n] -= 1
        report.handled += 1
        if outcome:
            setattr(report, outcome, getattr(report, outcome) + 1)
    return [
        Sweep(lease=f.lease, at=f.at, lag_s=_lag(f), due_found=len(f.rows))
        for f, remaining in zip(found, left, strict=True)
        if remaining == 0 and len(f.rows) < PAGE_SIZE  # a full page: more are due than read
    ]


def _lag(found: _Found) -> float:
    return max(((found.at - row.due_at).total_seconds() for row in found.rows), default=0.0)


async def _handle(rt: Runtime, row: ActiveRow, deadline: float) -> str | None:
    """What became of ``row``: None if the budget was spent first, else the outcome counted in
    the report ("" for none)."""
    if time.monotonic() >= deadline:
        return None
    try:
        return await _inspect(row, rt)
    except ConcurrencyConflict:
        return "conflicts"  # the order moved on while we looked: nothing to recover
    except CorruptOrderState as exc:
        log.error("order %s cannot be read: %s", row.order_id, exc)
        return "errors"
    # One order whose messages cannot be sent now must not stop the tick for the others; its
    # outbox is still on its record and its row is still due.
    except Exception:
        log.exception("order %s: recovery failed; the next tick tries again", row.order_id)
        return "errors"


async def _inspect(row: ActiveRow, rt: Runtime) -> str:
    order = await rt.store.find(row.order_id)
    if order is None or order.generation != row.generation:
        if await rt.store.reap_active(row, order):
            return "reaped"
        # Young garbage, or a create on its way: look again before that order could be due,
        # and reap it once it is old enough.
        recheck = apply.earliest_due(rt, rt.clock())
        await rt.store.index.postpone(row, min(recheck, row.written_at + DEFAULT_GRACE))
        return ""
    try:
        ctx = apply.context(rt, order.workflow, rt.actor("supervisor"))
    except UnknownWorkflow as missing:
        await apply.park(rt, order, missing, rt.actor("supervisor"))
        await rt.store.index.postpone(row, rt.clock() + apply.PARKED_RECHECK)
        return "parked"
    swept = Swept()
    decision = decide(order, swept, ctx)
    acts = decision.order is not None or bool(decision.send)
    with apply.in_order_trace(RECOVER_SPAN if acts else None, order, ctx.actor):
        after = await apply.carry_out(rt, order, decision, swept)
    if not decision.finished:
        # The row was due, the order may not be (the row is kept early): move the row up. If
        # the write above moved it already, the row's ETag changed and this does nothing.
        await rt.store.index.postpone(row, apply.due(rt, after))
    if decision.entry is not None:
        return _OUTCOMES.get(decision.entry.event, "")
    return "flushed" if decision.finished and decision.order is None else ""


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
