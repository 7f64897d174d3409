"""One Supervisor pass over the orders in flight.

It reads the active-order index (one request per page) and point-reads each listed order, so a
tick costs about one request per order in flight, whatever the history holds. It recovers:
Processing/Compensating orders past CompleteBy (the agent or scheduler died, or the agent gave
up silently at its deadline), and Pending orders (or released compensations) with no progress
for `pending_stale_after` (a lost retry command, a crash between create and claim). It never
calls remote services and knows no business rules: it only hands orders back to the Scheduler,
asks it to compensate them, or gives up on them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from core.runtime import Runtime
from core.state_models import ActiveRow, ConcurrencyConflict, CorruptOrderState
from core.states import ProcessState
from supervisor.recovery import retry_or_fail

log = logging.getLogger("supervisor.tick")

PAGE_SIZE = 500


@dataclass
class TickReport:
    leader: bool = True
    scanned: int = 0
    retried: int = 0
    compensating: int = 0
    failed: int = 0
    reaped: int = 0
    conflicts: int = 0


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
        continuation = page.continuation
        if continuation is None:
            break
    if report.retried or report.compensating or report.failed or report.reaped:
        log.info("supervisor tick: %s", report)
    return report


def _inspect(row: ActiveRow, rt: Runtime, report: TickReport) -> None:
    process = rt.store.find_process(row.order_id)
    if process is None or not process.state.in_flight or process.generation != row.generation:
        if rt.store.reap_active(row, process):
            report.reaped += 1
        return
    now = rt.clock()
    actor = rt.actor("supervisor")
    if process.locked_by is not None:
        if process.complete_by is None or process.complete_by > now:
            return
        reason = (
            f"{process.current_operation} {process.current_step} attempt {process.attempt} by "
            f"{process.locked_by} passed CompleteBy {process.complete_by.isoformat()}"
        )
    else:
        waiting_since = process.next_attempt_at or process.updated_at
        if waiting_since + rt.settings.pending_stale_after > now:
            return
        reason = (
            f"{process.state} since {waiting_since.isoformat()} with no progress for "
            f"{rt.settings.pending_stale_after.total_seconds():.0f}s"
        )
    if process.state not in (
        ProcessState.PENDING,
        ProcessState.PROCESSING,
        ProcessState.COMPENSATING,
    ):
        return
    outcome = retry_or_fail(process, reason, rt, actor=actor)
    if outcome == "failed":
        report.failed += 1
    elif outcome == "compensating":
        report.compensating += 1
    else:
        report.retried += 1
