"""Operator actions on one order: cancel, resubmit and restart. One implementation for every
front end.

The HTTP API and the CLI (through :mod:`service.operations.orders`) and SchedulerCommand
messages (through :mod:`service.commands`) all call these; :func:`domain.operator_actions.act`
decides. The operator is the ``actor`` of the timeline entries they write.

Cancel (an order in flight, not already being undone) acts at once, whatever the order waits
for: every step that may have taken effect - the one in flight too - is undone, latest first,
each undo naming the forward call it undoes (a forward call that lands later is refused by the
service), then Error "cancelled" with one alert.

Resubmit (an Error order): if undos are left (compensation incomplete), the compensation
resumes, same Generation, so each undo keeps its idempotency key. Otherwise the order resumes at
its first step that has not succeeded, with Generation + 1 (new idempotency keys); completed
steps are not redone.

Each action runs in a span in the order's trace (``operator_cancel``, ...), linked to the
request or message that asked for it, so the messages it sends continue the order's trace
(:func:`adapters.telemetry.continuing`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Literal

from adapters.store.rows import OrderNotFound
from domain import operator_actions
from domain.events import Context, Decision
from domain.operator_actions import Cancel, Refused, Restart, Resubmit, act
from domain.order import Order
from domain.states import ProcessState
from service import apply
from service.runtime import Runtime

__all__ = ["ActionResult", "Refused", "cancel", "restart", "resubmit"]

Outcome = Literal["compensating", "failed", "resubmitted", "compensation_resumed", "restarted"]
Action = Literal["cancel", "resubmit", "restart"]


@dataclass(frozen=True, slots=True)
class ActionResult:
    order_id: str
    action: Action
    outcome: Outcome
    state: ProcessState
    step: str | None
    generation: int
    requested_by: str
    detail: str


async def cancel(rt: Runtime, order_id: str, *, actor: str, reason: str) -> ActionResult:
    """Cancel an order in flight (see the module docstring)."""
    result = await _act(rt, order_id, Cancel(actor, reason), actor, "cancel", "compensating")
    if result.state is ProcessState.ERROR:
        return replace(result, outcome="failed")
    return result


async def resubmit(rt: Runtime, order_id: str, *, actor: str, reason: str) -> ActionResult:
    """Resubmit an Error order (see the module docstring)."""

    async def action(order: Order) -> Resubmit:
        return Resubmit(actor, reason, outbox_delivered=await _delivered(rt, order))

    result = await _act(rt, order_id, action, actor, "resubmit", "resubmitted")
    if result.state is ProcessState.COMPENSATING:
        return replace(result, outcome="compensation_resumed")
    return result


async def restart(
    rt: Runtime, order_id: str, *, step: str, actor: str, reason: str
) -> ActionResult:
    """Restart an Error order from ``step`` (see the module docstring)."""

    async def action(order: Order) -> Restart:
        return Restart(actor, reason, step, outbox_delivered=await _delivered(rt, order))

    return await _act(rt, order_id, action, actor, "restart", "restarted")


async def _delivered(rt: Runtime, order: Order) -> bool:
    """Whether the Error order's alert and status were sent: they are on its record until
    then, and its active-index row is deleted only after they were."""
    return not await rt.store.index.has(order.order_id, order.generation)


async def _act(
    rt: Runtime,
    order_id: str,
    action: operator_actions.Action | Callable[[Order], Awaitable[operator_actions.Action]],
    actor: str,
    name: Action,
    outcome: Outcome,
) -> ActionResult:
    """Decide ``action`` (or the action it gives for the order as loaded) on the order and carry
    the decision out; :class:`Refused`, saying why, when that cannot be done."""

    async def deciding(order: Order, ctx: Context) -> Decision:
        return act(order, await action(order) if callable(action) else action, ctx)

    try:
        span = f"operator_{name}"
        order, decision = await apply.handle_with(rt, order_id, deciding, actor=actor, span=span)
    except OrderNotFound:
        raise Refused("not_found", f"order {order_id} does not exist") from None
    except apply.Busy as busy:
        raise Refused("busy", f"{busy}; try again in a moment") from None
    except apply.Parked as parked:
        raise Refused("conflict", str(parked)) from None
    return ActionResult(
        order_id=order.order_id,
        action=name,
        outcome=outcome,
        state=order.state,
        step=order.current_step,
        generation=order.generation,
        requested_by=actor,
        detail=decision.entry.detail if decision.entry else "",
    )
