"""Operator actions on one order: cancel and resubmit. One implementation for every front end.

The HTTP API and the CLI (through :mod:`operator_api.operations`) and SchedulerCommand messages
(through :mod:`scheduler.commands`) all call these. The operator is the ``actor`` of the
timeline entries they write, so every action records who did it.

Cancel (a Pending or Processing order):
    Pending - nothing is in flight: compensate now (the current step too if an attempt of it
    failed or timed out: its effect is unknown) and end in Error "cancelled ...".
    Processing - a step is in flight and may still take effect: the order is marked
    (``CancelRequestedBy``) and whatever resolves that step (its reply, or the Supervisor at its
    deadline) compensates instead of going on. Undoing before the step resolves could let the
    step's effect land after its undo.

Resubmit (an Error order):
    If undos are left (compensation incomplete): the compensation resumes at the latest step
    still to undo, same Generation, so each undo keeps its idempotency key. Otherwise the order
    resumes at its first step that has not succeeded: completed steps are not redone, and
    steps that were compensated are redone, with Generation + 1 giving every step new
    idempotency keys (after a full compensation, the order starts over).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from core.runtime import Runtime
from core.state_models import ConcurrencyConflict, OrderNotFound, OrderRecord, ProcessRecord
from core.states import ProcessState, StepState
from scheduler import compensation
from scheduler.dispatch import claim_and_dispatch
from scheduler.status import Status, publish

log = logging.getLogger("scheduler.control")

_CONFLICT_RETRIES = 5

Outcome = Literal[
    "cancel_requested",
    "cancel_already_requested",
    "compensating",
    "failed",
    "resubmitted",
    "compensation_resumed",
]


class Refused(Exception):
    """The action does not apply to the order as it is; ``code`` says why in one word."""

    def __init__(self, code: Literal["not_found", "conflict", "busy"], message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class ActionResult:
    order_id: str
    action: Literal["cancel", "resubmit"]
    outcome: Outcome
    state: ProcessState
    step: str | None
    generation: int
    requested_by: str
    detail: str


def cancel(rt: Runtime, order_id: str, *, actor: str, reason: str) -> ActionResult:
    """Cancel a Pending or Processing order (see the module docstring)."""

    def attempt(order: OrderRecord) -> ActionResult:
        process = order.process
        if process.state in (ProcessState.PROCESSED, ProcessState.ERROR):
            raise Refused(
                "conflict",
                f"order {order_id} is {process.state}; only Pending or Processing orders can be "
                "cancelled",
            )
        if process.state is ProcessState.COMPENSATING:
            raise Refused(
                "conflict",
                f"order {order_id} is already being undone ({process.compensation_reason})",
            )
        if process.cancel_requested_by is not None:
            return _result(
                order_id,
                "cancel",
                "cancel_already_requested",
                process,
                actor,
                f"{process.cancel_requested_by} already asked to cancel it",
            )
        if process.state is ProcessState.PROCESSING:
            marked = rt.store.request_cancel(process, actor=actor, reason=reason)
            return _result(
                order_id,
                "cancel",
                "cancel_requested",
                marked,
                actor,
                f"{process.current_step} is in flight; once it replies or times out, the "
                "order's completed steps are undone and it ends in Error (cancelled)",
            )
        outcome = compensation.start(
            rt,
            order,
            process,
            cause=compensation.CANCELLED,
            reason=f"cancelled by {actor}: {reason}",
            actor=actor,
            include_in_flight=process.failure_count > 0,
            claim=True,
        )
        after = rt.store.get_process(order_id)
        return _result(order_id, "cancel", outcome, after, actor, after.last_error or "")

    return _with_retries(rt, order_id, attempt)


def resubmit(rt: Runtime, order_id: str, *, actor: str, reason: str) -> ActionResult:
    """Resubmit an Error order (see the module docstring)."""

    def attempt(order: OrderRecord) -> ActionResult:
        process = order.process
        if process.state is not ProcessState.ERROR:
            raise Refused(
                "conflict",
                f"order {order_id} is {process.state}; only Error orders can be resubmitted",
            )
        workflow = rt.workflow(process.workflow)
        left = compensation.left_to_undo(workflow, order.steps)
        if left:
            resumed = rt.store.resume_compensation(
                process, actor=actor, reason=reason, step=left[0].name
            )
            detail = f"compensation resumed: undo {', '.join(step.name for step in left)}"
            resumed = publish(rt, resumed, Status("resubmitted", step=left[0].name, detail=detail))
            claim_and_dispatch(resumed, order.details, rt)
            return _result(order_id, "resubmit", "compensation_resumed", resumed, actor, detail)
        redo = [s for s in order.steps if s.state is not StepState.SUCCEEDED]
        if not redo:
            raise Refused("conflict", f"order {order_id} has no step left to do")
        first = min(redo, key=lambda s: s.index)
        reset = [s.name for s in redo if s.state is not StepState.PENDING]
        resubmitted = rt.store.resubmit(
            process, actor=actor, reason=reason, step=first.name, redo=reset
        )
        kept = [s.name for s in order.steps if s.state is StepState.SUCCEEDED]
        detail = f"resumes at {first.name}" + (f"; kept: {', '.join(kept)}" if kept else "")
        resubmitted = publish(
            rt, resubmitted, Status("resubmitted", step=first.name, detail=detail)
        )
        claim_and_dispatch(resubmitted, order.details, rt)
        return _result(order_id, "resubmit", "resubmitted", resubmitted, actor, detail)

    return _with_retries(rt, order_id, attempt)


def _with_retries(
    rt: Runtime, order_id: str, attempt: Callable[[OrderRecord], ActionResult]
) -> ActionResult:
    for _ in range(_CONFLICT_RETRIES):
        try:
            order = rt.store.get_order(order_id)
        except OrderNotFound:
            raise Refused("not_found", f"order {order_id} does not exist") from None
        try:
            return attempt(order)
        except ConcurrencyConflict:
            log.info("order %s changed during an operator action; re-reading", order_id)
    raise Refused("busy", f"order {order_id} kept changing; try again in a moment")


def _result(
    order_id: str,
    action: Literal["cancel", "resubmit"],
    outcome: Outcome,
    process: ProcessRecord,
    actor: str,
    detail: str,
) -> ActionResult:
    return ActionResult(
        order_id=order_id,
        action=action,
        outcome=outcome,
        state=process.state,
        step=process.current_step,
        generation=process.generation,
        requested_by=actor,
        detail=detail,
    )
