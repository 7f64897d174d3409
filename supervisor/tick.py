"""One Supervisor pass over the orders that are due.

The active-order index keeps, per order in flight, a due time never later than when the
Supervisor must look at it (core.active_index), so a tick asks each of the index's buckets for
the rows due now - one query per bucket - and reads only those orders: its cost follows what is
due, not what is in flight or was ever processed. For each, the lifecycle decides
(:mod:`core.lifecycle`, event ``Swept``): an order past CompleteBy (an agent or scheduler died,
or the agent gave up silently at its deadline) or waiting without progress is released for a
delayed retry, resent what it owes, or compensated at the failure threshold; a finished order
whose row is still there owes its final messages, which are sent again before the row goes.
Then the row is moved up to the order's next due time. The Supervisor never calls remote
services and knows no business rules: it hands orders back, asks agents to undo, and reports.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from core import apply
from core.active_index import DEFAULT_GRACE, INDEX_BUCKETS
from core.lifecycle import Swept, decide
from core.runtime import Runtime
from core.state_models import ActiveRow, ConcurrencyConflict, CorruptOrderState

log = logging.getLogger("supervisor.tick")

PAGE_SIZE = 500
"""Due rows taken per bucket and tick; the rest are first in line next tick."""
_OUTCOMES = {"released": "retried", "compensation_started": "compensating", "error": "failed"}


@dataclass
class TickReport:
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


def run_tick(rt: Runtime) -> TickReport:
    report = TickReport()
    now = rt.clock()
    for bucket in range(INDEX_BUCKETS):
        rows = rt.store.index.due(bucket, now, PAGE_SIZE)
        report.queries += 1
        report.due += len(rows)
        for row in rows:
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
    if report.due:
        log.info("supervisor tick: %s", report)
    return report


def _inspect(row: ActiveRow, rt: Runtime, report: TickReport) -> None:
    order = rt.store.find(row.order_id)
    if order is None or order.generation != row.generation:
        if rt.store.reap_active(row, order):
            report.reaped += 1
        else:  # young garbage (a create may be on its way): look again once it is old enough
            rt.store.index.postpone(row, row.written_at + DEFAULT_GRACE)
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
