"""An operator's actions on one order, as pure decisions: ``act(order, action, context)``.

They are not the pattern's events (:func:`domain.lifecycle.decide`): a person asks for them,
and one that does not apply to the order as it is raises :class:`Refused`, saying why. Each
moves the order as the lifecycle does (:func:`domain.lifecycle.write`, ``claim``,
``compensate``), into the same kind of :class:`domain.events.Decision`.

**Cancel** (an order in flight, not already being undone): every step that may have taken
effect - the one in flight too - is undone, latest first, then Error "cancelled".

**Resubmit** (an Error order): if undos are left (compensation incomplete), the compensation
resumes, same generation, so each undo keeps its idempotency key. Otherwise the order resumes
at its first step that has not succeeded, with the next generation (new keys); completed steps
are not redone.

**Restart** (an Error order with nothing left to undo): redo from a named step on, that step
and every later one afresh, even one that succeeded.

**Migrate** (an order moving forward): onto another version of its workflow that keeps its
steps up to the one it has reached (docs/versioning.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from domain.events import Context, Decision
from domain.lifecycle import claim, compensate, undo_plan, write
from domain.order import Order, StepState
from domain.states import ProcessState
from domain.workflows import Workflow

_P = ProcessState


@dataclass(frozen=True, slots=True)
class Cancel:
    actor: str
    reason: str


@dataclass(frozen=True, slots=True)
class Resubmit:
    """``outbox_delivered``: the shell knows the Error order's outbox was sent (its active-index
    row is gone), so the alert is not sent twice."""

    actor: str
    reason: str
    outbox_delivered: bool


@dataclass(frozen=True, slots=True)
class Restart:
    """Redo an Error order from ``step`` on: that step and every later one afresh (new keys),
    even one whose result was kept; the steps before it resume as a resubmit does."""

    actor: str
    reason: str
    step: str
    outbox_delivered: bool


@dataclass(frozen=True, slots=True)
class Migrate:
    """Move an order in flight to another version of its workflow (docs/versioning.md)."""

    to: Workflow
    actor: str
    reason: str


Action = Cancel | Resubmit | Restart | Migrate


class Refused(Exception):
    """An operator action that does not apply to the order as it is; ``code`` says why."""

    def __init__(
        self, code: Literal["not_found", "conflict", "busy", "invalid"], message: str
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def act(order: Order, action: Action, ctx: Context) -> Decision:
    match action:
        case Cancel(actor, reason):
            return _cancel(order, actor, reason, ctx)
        case Resubmit(_, reason, delivered):
            return _resubmit(order, reason, delivered, ctx)
        case Restart(_, reason, step, delivered):
            return _restart(order, reason, step, delivered, ctx)
        case Migrate(to, actor, reason):
            return _migrate(order, to, actor, reason, ctx)
    raise TypeError(f"not an operator action: {action!r}")


def _cancel(order: Order, actor: str, reason: str, ctx: Context) -> Decision:
    if order.state.terminal:
        raise Refused(
            "conflict",
            f"order {order.order_id} is {order.state}; only orders in flight can be cancelled",
        )
    if order.state is _P.COMPENSATING:
        raise Refused(
            "conflict",
            f"order {order.order_id} is already being undone ({order.compensation_reason})",
        )
    return compensate(order, order, "cancelled", f"cancelled by {actor}: {reason}", ctx)


def _migrate(order: Order, to: Workflow, actor: str, reason: str, ctx: Context) -> Decision:
    if order.state not in (_P.PENDING, _P.PROCESSING) or order.current_operation != "do":
        raise Refused(
            "conflict",
            f"order {order.order_id}: {order.state} (undoing or finished); only orders moving "
            "forward can be migrated",
        )
    old = ctx.workflow
    problem = old.migration_problem(to, order.current_step)
    if problem is not None:
        raise Refused("conflict", f"order {order.order_id} cannot be migrated: {problem}")
    kept = old.index_of(order.current_step) + 1
    migrated = order.migrated(to.ref, to.step_names, kept)
    detail = f"{old.ref} -> {to.ref} by {actor}: {reason}"
    return write(order, migrated, ctx, "migrated", detail)


def _resubmit(order: Order, reason: str, delivered: bool, ctx: Context) -> Decision:
    draft = _errored(order, delivered, "resubmitted")
    left = undo_plan(draft, ctx.workflow)
    if left:
        detail = f"{reason}; compensation resumed: undo {', '.join(s.name for s in left)}"
        resumed = draft.compensation_resumed(left[0].name, ctx.now).reporting(
            "resubmitted", ctx.now, step=left[0].name, detail=detail
        )
        return write(order, claim(resumed, ctx), ctx, "compensation_resumed", detail)
    if all(s.state is StepState.SUCCEEDED for s in draft.steps):
        raise Refused("conflict", f"order {order.order_id} has no step left to do")
    return _redo(order, draft, len(draft.steps), "resubmitted", reason, ctx)


def _restart(order: Order, reason: str, step: str, delivered: bool, ctx: Context) -> Decision:
    flow = ctx.workflow
    if step not in flow.step_names:
        raise Refused(
            "invalid",
            f"workflow {flow.ref} has no step {step[:64]!r}; restart from one of: "
            f"{', '.join(flow.step_names)}",
        )
    draft = _errored(order, delivered, "restarted")
    left = undo_plan(draft, flow)
    if left:
        raise Refused(
            "conflict",
            f"order {order.order_id} still has undos left ({', '.join(s.name for s in left)}): "
            "resubmit it to finish its compensation, then restart it",
        )
    start = flow.index_of(step)
    why = f"{reason}; restart from {step}: redo {', '.join(flow.step_names[start:])}"
    return _redo(order, draft, start, "restarted", why, ctx)


def _errored(order: Order, delivered: bool, done: str) -> Order:
    """The draft an operator's action on an Error order starts from (its outbox dropped if
    ``delivered``); Refused for an order not in Error."""
    if order.state is not _P.ERROR:
        raise Refused(
            "conflict", f"order {order.order_id} is {order.state}; only Error orders can be {done}"
        )
    return replace(order, outbox=() if delivered else order.outbox)


def _redo(order: Order, draft: Order, start: int, event: str, why: str, ctx: Context) -> Decision:
    """Put an Error order back in flight (:meth:`domain.order.Order.redone`) and claim its
    first step not Succeeded."""
    again = draft.redone(start)
    kept = [s.name for s in again.steps if s.state is StepState.SUCCEEDED]
    detail = f"{why}; resumes at {again.current_step}"
    if kept:
        detail += f"; kept: {', '.join(kept)}"
    again = again.reporting("resubmitted", ctx.now, step=again.current_step, detail=detail)
    return write(order, claim(again, ctx), ctx, event, detail)
