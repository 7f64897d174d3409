"""Compensation: undo the steps of an order that cannot finish, latest first, then Error.

When it starts (``cause``, also the reason code of the alert at the end):

- ``step_declined``: a step failed for good (a business refusal). Its completed predecessors are
  undone; the declined step itself had no effect.
- ``failure_threshold``: a step kept failing or timing out (:mod:`supervisor.recovery`). The step
  in flight is undone too: a timed-out attempt may have taken effect at the remote service, and
  an undo is idempotent and harmless when there is nothing to undo.
- ``cancelled``: an operator cancelled the order (:mod:`scheduler.control`).

How: one write marks every step to undo Compensating (the step rows are the to-do list, so a
crash or a Supervisor recovery loses nothing) and puts the first undo in flight; each undo goes
through the step's agent as an AgentRequest with operation ``undo`` and its own idempotency key
(``<order>:<step>:undo:<generation>``), under the same CompleteBy deadline, FailureCount and
Supervisor recovery as a forward step. Each success records the step Compensated and dispatches
the next; after the last, the order is Error ("compensated ...") with one OperatorAlert.

An undo that fails for good, or reaches the failure threshold, ends in Error "compensation
incomplete" with a critical alert naming the steps whose effects are still in place; they stay
Compensating, and a resubmission resumes the compensation where it stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from core.messages import AgentResponse, OperatorAlert, SchedulerCommand
from core.runtime import Runtime
from core.state_models import ConcurrencyConflict, OrderRecord, ProcessRecord, StepRecord
from core.states import StepState
from core.workflows import Step, Workflow
from scheduler.dispatch import send_step
from scheduler.status import Status, publish

log = logging.getLogger("scheduler.compensation")

CANCELLED = "cancelled"


def plan(workflow: Workflow, steps: Iterable[StepRecord], extra: Iterable[str] = ()) -> list[Step]:
    """The steps to undo, latest first: those done (or marked for undo) plus ``extra``."""
    done = {s.name for s in steps if s.state in (StepState.SUCCEEDED, StepState.COMPENSATING)}
    return list(workflow.compensation_steps(done | set(extra)))


def left_to_undo(workflow: Workflow, steps: Iterable[StepRecord]) -> list[Step]:
    """Steps marked for undo whose undo has not succeeded yet, latest first."""
    marked = [s for s in steps if s.state is StepState.COMPENSATING]
    return [workflow.step_named(s.name) for s in sorted(marked, key=lambda s: -s.index)]


def start(
    rt: Runtime,
    order: OrderRecord,
    process: ProcessRecord,
    *,
    cause: str,
    reason: str,
    actor: str,
    include_in_flight: bool,
    claim: bool,
    response: AgentResponse | None = None,
) -> str:
    """Begin compensating ``process`` (or fail it at once if nothing needs undoing).

    ``claim``: the caller dispatches the first undo itself (the Scheduler); otherwise the order
    is released and a retry command asks the Scheduler to (the Supervisor never calls agents).
    ``response``: the reply that led here; a succeeded 'do' (an order cancelled while that step
    ran) is undone too. Returns "compensating" or "failed".
    """
    workflow = rt.workflow(process.workflow)
    extra: list[str] = []
    if response is not None and response.operation == "do" and response.outcome == "succeeded":
        extra.append(response.step)
    if include_in_flight and process.current_operation == "do" and process.current_step:
        extra.append(process.current_step)
    undo = plan(workflow, order.steps, extra)
    if not undo:
        final = reason if cause != CANCELLED else f"{reason}; nothing to undo"
        errored = rt.store.mark_error(process, actor=actor, reason=final, response=response)
        _alert_done(rt, errored, cause, final, actor)
        publish(rt, errored, Status("failed", detail=final))
        return "failed"
    first = undo[0]
    names = ", ".join(step.name for step in undo)
    if claim:
        record = rt.store.begin_compensation(
            process,
            undo,
            cause=cause,
            reason=reason,
            actor=actor,
            instance_id=rt.instance_id,
            complete_by=rt.clock() + first.complete_by_budget,
            response=response,
        )
        send_step(record, first, order.details, rt)
    else:
        record = rt.store.begin_compensation(
            process, undo, cause=cause, reason=reason, actor=actor, instance_id=None
        )
        rt.bus.send(
            rt.settings.queue("commands"),
            SchedulerCommand(
                order_id=record.order_id,
                command="retry",
                attempt=record.attempt,
                failure_count=record.failure_count,
                reason=f"compensate ({cause}): undo {first.name}",
                requested_by=actor,
            ),
        )
    log.warning("order %s: compensating (%s): undoing %s", process.order_id, cause, names)
    publish(
        rt, record, Status("compensating", step=first.name, detail=f"{reason}; undoing {names}")
    )
    return "compensating"


def undo_succeeded(
    rt: Runtime, order: OrderRecord, process: ProcessRecord, response: AgentResponse, actor: str
) -> None:
    """Record a succeeded undo, then dispatch the next one or finish in Error."""
    workflow = rt.workflow(process.workflow)
    left = [step for step in left_to_undo(workflow, order.steps) if step.name != response.step]
    done = Status("step_compensated", step=response.step)
    if left:
        following = left[0]
        record = rt.store.advance_compensation(
            process,
            response,
            next_undo=following,
            complete_by=rt.clock() + following.complete_by_budget,
            actor=actor,
        )
        send_step(record, following, order.details, rt)
        publish(rt, record, done)
        return
    undone = [s.name for s in order.steps if s.state is StepState.COMPENSATED]
    undone.append(response.step)
    cause = process.compensation_cause or "step_declined"
    final = _final_error(cause, process.compensation_reason or "compensated", undone)
    errored = rt.store.finish_compensation(process, response, actor=actor, last_error=final)
    log.warning("order %s: %s", process.order_id, final)
    _alert_done(rt, errored, cause, final, actor)
    publish(rt, errored, done, Status("failed", detail=final))


def give_up(
    rt: Runtime,
    process: ProcessRecord,
    steps: Sequence[StepRecord],
    *,
    reason: str,
    actor: str,
    response: AgentResponse | None = None,
) -> None:
    """An undo cannot be completed: Error "compensation incomplete" and a critical alert."""
    workflow = rt.workflow(process.workflow)
    left = left_to_undo(workflow, steps)
    names = ", ".join(f"{s.name} ({s.undo_operation} at {s.agent})" for s in left) or "none"
    final = (
        f"compensation incomplete: {reason}; steps left to undo: {names}; "
        f"compensating because: {process.compensation_reason or 'unknown'}"
    )
    errored = rt.store.mark_error(process, actor=actor, reason=final, response=response)
    log.error("order %s: %s", process.order_id, final)
    rt.alert(
        OperatorAlert(
            order_id=process.order_id,
            severity="critical",
            reason="compensation_incomplete",
            detail=(
                f"{final}. These effects are still in place at the remote services: undo them by "
                "hand, or resubmit the order once the service recovers to retry the undo."
            ),
            source=actor,
        )
    )
    publish(rt, errored, Status("failed", detail=final))


def read_steps(rt: Runtime, process: ProcessRecord) -> OrderRecord:
    """The order's rows, for a caller that holds only ``process``; conflict if it moved on."""
    order = rt.store.get_order(process.order_id)
    if order.process.etag != process.etag:
        raise ConcurrencyConflict(process.order_id, "changed while deciding how to recover it")
    return order


def _final_error(cause: str, reason: str, undone: Sequence[str]) -> str:
    steps = ", ".join(undone)
    if cause == CANCELLED:  # the reason already reads "cancelled by <operator>: ..."
        return f"{reason}; compensated: undid {steps}"
    return f"compensated: {reason}; undid {steps}"


def _alert_done(rt: Runtime, process: ProcessRecord, cause: str, final: str, actor: str) -> None:
    if cause == CANCELLED:
        severity, advice = "warning", "The order is in Error (cancelled)."
    else:
        severity, advice = "error", "The order is in Error; resubmit it once the cause is fixed."
    rt.alert(
        OperatorAlert(
            order_id=process.order_id,
            severity=severity,
            reason=cause,
            detail=f"{final}. {advice}",
            source=actor,
        )
    )
