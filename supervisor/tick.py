"""One Supervisor tick: claim a fair share of the index's buckets, sweep what is due in them.

The active-order index keeps, per order in flight, a due time never later than when the
Supervisor must look at it (:mod:`core.active_index`), so sweeping a bucket is one query for the
rows due now plus a point read of each of those orders: a tick costs what is due, not what is
in flight or was ever processed. For each order the lifecycle decides
(:mod:`core.lifecycle`, event ``Swept``): an order past CompleteBy (an agent or scheduler died,
or the agent gave up silently at its deadline) or waiting without progress is released for a
delayed retry, resent what it owes, or compensated at the failure threshold; a finished order
whose row is still there owes its final messages, which are sent again before the row goes.
Then the row is moved up to the order's next due time. The Supervisor never calls remote
services and knows no business rules: it hands orders back, asks agents to undo, and reports.

Work that survives the worker (:mod:`supervisor.leases`):

- Instances share the buckets through per-bucket leases (one roster read and one batch claim
  per tick); an instance that dies releases its buckets when their leases expire.
- Buckets are swept concurrently, each most overdue row first, within a time budget below the
  period (and so below the lease). A bucket swept to the end records a checkpoint; one the
  budget cut short keeps its old checkpoint and is swept first next tick, by whoever holds it.
- Progress inside a bucket needs no checkpoint: a handled row is moved to its next due time, so
  a new holder finds only the rows not handled yet.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields

from core import apply
from core.active_index import DEFAULT_GRACE
from core.lifecycle import Swept, decide
from core.runtime import Runtime
from core.state_models import ActiveRow, ConcurrencyConflict, CorruptOrderState
from core.supervision import BucketLease, Sweep
from supervisor import leases
from supervisor.metrics import record_tick

log = logging.getLogger("supervisor.tick")

PAGE_SIZE = 500
"""Due rows taken per bucket and tick; the rest are first in line next tick."""
CLAIM_ATTEMPTS = 3
_OUTCOMES = {"released": "retried", "compensation_started": "compensating", "error": "failed"}


@dataclass
class TickReport:
    held: int = 0
    """Buckets this instance holds this tick."""
    swept: int = 0
    """Buckets swept to the end (checkpointed); the others are first next tick."""
    queries: int = 0
    due: int = 0
    retried: int = 0
    compensating: int = 0
    failed: int = 0
    flushed: int = 0
    reaped: int = 0
    conflicts: int = 0
    errors: int = 0
    lag_s: float = 0.0
    """How long the most overdue row had been due when the tick found it."""
    duration_s: float = 0.0

    @property
    def recovered(self) -> int:
        return self.retried + self.compensating + self.failed + self.flushed + self.reaped

    def add(self, other: TickReport) -> None:
        for f in fields(self):
            if f.name in ("lag_s", "duration_s"):
                setattr(self, f.name, max(getattr(self, f.name), getattr(other, f.name)))
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def run_tick(rt: Runtime, *, budget_s: float | None = None) -> TickReport:
    started = time.monotonic()
    budget = rt.settings.supervisor_budget.total_seconds() if budget_s is None else budget_s
    deadline = started + budget
    report = TickReport()
    held = _claim(rt)
    report.held = len(held)
    sweeps: list[Sweep] = []
    if held:
        workers = max(1, min(rt.settings.supervisor_concurrency, len(held)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sweep") as pool:
            for part, sweep in pool.map(lambda lease: _sweep(rt, lease, deadline), held):
                report.add(part)
                if sweep is not None:
                    sweeps.append(sweep)
        rt.store.supervision.checkpoint(sweeps, rt.instance_id)
    report.swept = len(sweeps)
    report.duration_s = round(time.monotonic() - started, 3)
    record_tick(report)
    if report.due or report.swept < report.held:
        log.info("supervisor tick: %s", report)
    return report


def _claim(rt: Runtime) -> tuple[BucketLease, ...]:
    """This tick's buckets, each with the ETag of its renewed lease, in sweep order."""
    for _ in range(CLAIM_ATTEMPTS):
        now = rt.clock()
        plan = leases.plan(
            rt.store.supervision.read(), rt.instance_id, now, rt.settings.supervisor_lease
        )
        try:
            etags = rt.store.supervision.claim(plan.member, plan.hold, plan.release, plan.reap)
        except ConcurrencyConflict:
            continue  # another instance claimed at the same moment: read the roster again
        return tuple(dataclasses.replace(b, etag=etags[b.bucket]) for b in plan.hold)
    log.info("supervisor roster kept changing; sweeping nothing this tick")
    return ()


def _sweep(rt: Runtime, lease: BucketLease, deadline: float) -> tuple[TickReport, Sweep | None]:
    report = TickReport()
    now = rt.clock()
    rows = sorted(rt.store.index.due(lease.bucket, now, PAGE_SIZE), key=lambda r: r.due_at)
    report.queries += 1
    report.due += len(rows)
    for row in rows:
        if time.monotonic() >= deadline:
            return report, None
        report.lag_s = max(report.lag_s, (now - row.due_at).total_seconds())
        try:
            _inspect(row, rt, report)
        except ConcurrencyConflict:
            report.conflicts += 1  # the order moved on while we looked: nothing to recover
        except CorruptOrderState as exc:
            log.error("order %s cannot be read: %s", row.order_id, exc)
        # One order whose messages cannot be sent now must not stop the tick for the
        # others; its outbox is still on its record and its row is still due.
        except Exception:
            report.errors += 1
            log.exception("order %s: recovery failed; the next tick tries again", row.order_id)
    if len(rows) == PAGE_SIZE:
        return report, None  # more are due than one page: not swept to the end
    return report, Sweep(lease=lease, at=now, lag_s=report.lag_s, due_found=len(rows))


def _inspect(row: ActiveRow, rt: Runtime, report: TickReport) -> None:
    order = rt.store.find(row.order_id)
    if order is None or order.generation != row.generation:
        if rt.store.reap_active(row, order):
            report.reaped += 1
        else:
            # Young garbage, or a create on its way: look again before that order could be
            # due, and reap it once it is old enough.
            recheck = apply.earliest_due(rt, rt.clock())
            rt.store.index.postpone(row, min(recheck, row.written_at + DEFAULT_GRACE))
        return
    decision = decide(order, Swept(), apply.context(rt, order.workflow, rt.actor("supervisor")))
    after = apply.carry_out(rt, order, decision)
    if decision.finished:
        report.flushed += decision.order is None
    else:
        # The row was due, the order may not be (the row is kept early): move the row up. If the
        # write above moved it already, the row's ETag changed and this does nothing.
        rt.store.index.postpone(row, apply.due(rt, after))
    if decision.entry is not None:
        outcome = _OUTCOMES.get(decision.entry.event)
        if outcome is not None:
            setattr(report, outcome, getattr(report, outcome) + 1)
