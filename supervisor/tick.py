"""One Supervisor pass over the orders in flight.

It reads the active-order index (one request per page) and point-reads each listed order, so a
tick costs about one request per order in flight, whatever the history holds. For each, the
lifecycle decides (:mod:`core.lifecycle`, event ``Swept``): an order past CompleteBy (an agent
or scheduler died, or the agent gave up silently at its deadline) or waiting without progress
for ``pending_stale_after`` is released for a delayed retry, or compensated at the failure
threshold; a finished order whose index row is still there owes its final messages, which are
sent again before the row goes. The Supervisor never calls remote services and knows no business
rules: it hands orders back, asks agents to undo, and reports.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from core import apply
from core.lifecycle import Swept, decide
from core.runtime import Runtime
from core.state_models import ActiveRow, ConcurrencyConflict, CorruptOrderState

log = logging.getLogger("supervisor.tick")

PAGE_SIZE = 500
_OUTCOMES = {"released": "retried", "compensation_started": "compensating", "error": "failed"}


@dataclass
class TickReport:
    scanned: int = 0
    retried: int = 0
    compensating: int = 0
    failed: int = 0
    flushed: int = 0
    reaped: int = 0
    conflicts: int = 0
    errors: int = 0


def run_tick(rt: Runtime) -> TickReport:
    report = TickReport()
    continuation: str | None = None
    while True:
        page = rt.store.list_active(PAGE_SIZE, continuation=continuation)
        for row in page.rows:
            report.scanned += 1
            try:
                _inspect(row, rt, report)
            except ConcurrencyConflict:
                report.conflicts += 1  # the order moved on while we looked: nothing to recover
            except CorruptOrderState as exc:
                log.error("order %s cannot be read: %s", row.order_id, exc)
            # One order whose messages cannot be sent now must not stop the tick for the
            # others; its outbox is still on its record and the next tick tries again.
            except Exception:
                report.errors += 1
                log.exception("order %s: recovery failed; the next tick tries again", row.order_id)
        continuation = page.continuation
        if continuation is None:
            break
    if report.retried or report.compensating or report.failed or report.flushed:
        log.info("supervisor tick: %s", report)
    return report


def _inspect(row: ActiveRow, rt: Runtime, report: TickReport) -> None:
    order = rt.store.find(row.order_id)
    if order is None or order.generation != row.generation:
        if rt.store.reap_active(row, order):
            report.reaped += 1
        return
    decision = decide(order, Swept(), apply.context(rt, order, rt.actor("supervisor")))
    apply.carry_out(rt, order, decision)
    if decision.finished and decision.order is None:
        report.flushed += 1
    elif decision.entry is not None:
        outcome = _OUTCOMES.get(decision.entry.event)
        if outcome is not None:
            setattr(report, outcome, getattr(report, outcome) + 1)
