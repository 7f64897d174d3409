"""The Supervisor's recovery move, shared with the Scheduler for transient failure replies.

Under the workflow's failure threshold: FailureCount + 1, LockedBy cleared, Pending (a
compensation stays Compensating), NextAttemptAt set, and a retry command to the Scheduler
scheduled for that time, after a delay from the workflow's RetryPolicy (the pattern's "wait an
extended period"); nothing polls. At the threshold: the order's completed steps, and the step
that kept failing, are compensated (:mod:`scheduler.compensation`), then Error and an alert; an
undo that reaches the threshold ends the compensation as incomplete. An order an operator asked
to cancel is compensated at its first failure instead of being retried.

Every move is one ETag-conditional write; a ConcurrencyConflict means the order moved on and
propagates to the caller, which re-reads.
"""

from __future__ import annotations

import logging

from core.messages import SchedulerCommand
from core.runtime import Runtime
from core.state_models import OrderRecord, ProcessRecord
from core.states import ProcessState
from scheduler import compensation

log = logging.getLogger("supervisor.recovery")


def retry_or_fail(
    process: ProcessRecord,
    reason: str,
    rt: Runtime,
    *,
    actor: str,
    claim: bool = False,
    order: OrderRecord | None = None,
) -> str:
    """Release the order for a delayed retry, or compensate/fail it. Returns which.

    ``claim``: the caller is the Scheduler and dispatches a first undo itself. ``order``: the
    order's rows if the caller has read them (saves a read when compensating). Returns
    "retried", "compensating" or "failed".
    """
    workflow = rt.workflow(process.workflow)
    failures = process.failure_count + 1
    undoing = process.state is ProcessState.COMPENSATING
    if process.cancel_requested_by is not None and not undoing:
        return _compensate(
            process,
            rt,
            order,
            cause=compensation.CANCELLED,
            reason=f"{process.compensation_reason}; the step in flight then failed: {reason}",
            actor=actor,
            claim=claim,
        )
    if failures >= workflow.failure_threshold:
        detail = (
            f"{reason}; failure threshold of {workflow.failure_threshold} reached after "
            f"{failures} failed attempts"
        )
        if undoing:
            steps = (order or compensation.read_steps(rt, process)).steps
            compensation.give_up(rt, process, steps, reason=detail, actor=actor)
            return "failed"
        return _compensate(
            process, rt, order, cause="failure_threshold", reason=detail, actor=actor, claim=claim
        )
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


def _compensate(
    process: ProcessRecord,
    rt: Runtime,
    order: OrderRecord | None,
    *,
    cause: str,
    reason: str,
    actor: str,
    claim: bool,
) -> str:
    return compensation.start(
        rt,
        order or compensation.read_steps(rt, process),
        process,
        cause=cause,
        reason=reason,
        actor=actor,
        include_in_flight=True,
        claim=claim,
    )
