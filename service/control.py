"""Operator actions on one order: cancel, resubmit and restart. One implementation for every
front end.

The HTTP API and the CLI (through :mod:`service.operations.orders`) call these;
:func:`domain.operator_actions.act` decides. The operator is the ``actor`` of the timeline
entries they write. Operations-app code only: the pattern app never imports it.

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
(:func:`adapters.telemetry.continuing`). Each is written here (:func:`write_with`) and sent by
the pattern app (:mod:`service.handover`): the operations app sends to no queue but
scheduler-commands.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Literal

from adapters.store.rows import ConcurrencyConflict, OrderNotFound
from domain import operator_actions
from domain.events import Context, Decision
from domain.messages import SendOwed
from domain.operator_actions import Cancel, Refused, Restart, Resubmit, act
from domain.order import Order
from domain.states import ProcessState
from domain.workflows import UnknownWorkflow
from service import apply
from service.runtime import Runtime

__all__ = ["ActionResult", "Refused", "cancel", "restart", "resubmit", "write_with"]
log = logging.getLogger("service.control")

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


async def write_with(
    rt: Runtime, order_id: str, deciding: apply.Decider, *, actor: str, span: str
) -> tuple[Order, Decision]:
    """:func:`service.apply.handle_with` less the sends: load the order, decide with
    ``deciding``, write the decision; again on a lost race. Then, if it owes messages, ask the
    pattern app to send them (:func:`ask`). ``span``: the span of the order's trace it runs in.

    Raises :class:`adapters.store.rows.OrderNotFound`, whatever ``deciding`` raises,
    :class:`service.apply.Parked` for an order of a workflow version not deployed (the pattern
    app alerts when it next touches it), :class:`service.apply.Busy` after
    :data:`service.apply.MAX_CONFLICT_RETRIES` lost races.
    """
    for _ in range(apply.MAX_CONFLICT_RETRIES):
        order = await rt.store.load(order_id)
        with apply.in_order_trace(span, order, actor):
            try:
                ctx = apply.context(rt, order.workflow, actor)
            except UnknownWorkflow as missing:
                raise apply.Parked(
                    f"order {order_id} runs workflow {order.workflow!r}, which this deployment "
                    f"does not carry ({missing}); it is parked until a package that carries it "
                    "is deployed (docs/versioning.md)"
                ) from None
            decision = await deciding(order, ctx)
            try:
                written = await apply.write(rt, order, decision)
            except ConcurrencyConflict:
                log.info("order %s changed while deciding; reading it again", order_id)
                continue
            if decision.send:
                await ask(rt, written, actor)
            return written, decision
    tries = apply.MAX_CONFLICT_RETRIES
    raise apply.Busy(f"order {order_id} kept changing; gave up after {tries} tries")


async def ask(rt: Runtime, order: Order, actor: str) -> None:
    """Ask the pattern app to send what ``order`` (as just written) owes."""
    command = SendOwed(
        order_id=order.order_id,
        timeline_seq=order.timeline_seq,
        requested_by=actor,
        requested_at=rt.clock(),
    )
    await rt.bus.send(rt.settings.queue("commands"), command)


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
        order, decision = await write_with(rt, order_id, deciding, actor=actor, span=span)
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
