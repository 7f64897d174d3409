"""The Supervisor's recovery move, shared with the Scheduler for transient failure replies.

Under the workflow's failure threshold: FailureCount + 1, LockedBy cleared, Pending, and a retry
command to the Scheduler scheduled after a growing delay (the pattern's "wait an extended
period"); nothing polls. At the threshold: Error and an OperatorAlert. Both are one
ETag-conditional write; a ConcurrencyConflict means the order moved on and propagates to the
caller, which re-reads.
"""

from __future__ import annotations

import logging

from core.messages import OperatorAlert, SchedulerCommand
from core.runtime import Runtime
from core.state_models import ProcessRecord

log = logging.getLogger("supervisor.recovery")


def retry_or_fail(process: ProcessRecord, reason: str, rt: Runtime, *, actor: str) -> str:
    """Release the order for a delayed retry, or fail it at the threshold. Returns which."""
    workflow = rt.workflow(process.workflow)
    failures = process.failure_count + 1
    if failures >= workflow.failure_threshold:
        detail = (
            f"{reason}; failure threshold of {workflow.failure_threshold} reached after "
            f"{failures} failed attempts"
        )
        rt.store.mark_error(process, actor=actor, reason=detail)
        rt.alert(
            OperatorAlert(
                order_id=process.order_id,
                severity="error",
                reason="failure_threshold",
                detail=f"{detail}. The order is in Error; resubmit it once the cause is fixed.",
                source=actor,
            )
        )
        log.warning("order %s failed: %s", process.order_id, detail)
        return "failed"
    due = rt.clock() + workflow.retry.delay(failures, rt.rng)
    released = rt.store.release_for_retry(process, actor=actor, reason=reason, next_attempt_at=due)
    rt.bus.send(
        rt.settings.queue("commands"),
        SchedulerCommand(
            order_id=process.order_id,
            command="retry",
            attempt=released.attempt,
            failure_count=released.failure_count,
            reason=reason,
            requested_by=actor,
        ),
        scheduled_at=due,
    )
    log.info(
        "order %s released (failure %d of %d), retry due %s: %s",
        process.order_id,
        failures,
        workflow.failure_threshold,
        due.isoformat(timespec="seconds"),
        reason,
    )
    return "retried"
