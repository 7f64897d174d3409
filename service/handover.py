"""An operator's action is written by the operations app and sent by the pattern app.

The operations app may send to one queue only, scheduler-commands (docs/architecture.md, "Two
apps"). So an operator's action (:mod:`service.control`, :mod:`service.migration`) is decided
and written as any decision is, in one ETag-conditional write of the order with the messages it
owes (its outbox), but not sent: :func:`write_with` then asks the pattern app, with one signed
:class:`domain.messages.SendOwed` command, to send what the order owes, and :func:`send_owed`
(the pattern app's commands trigger) does, deciding on the order as it is then
(:class:`domain.events.Owed`).

Nothing is lost between the two: the outbox is on the order. If the command never leaves (a
crash, an outage), whoever touches the order next sends what it owes, or the Supervisor does: a
finished order once its flush grace has passed, an order in flight when it is next due. A
command that comes twice, late, or for an order that has moved on since sends what the order owes
then: what its next writer would send anyway, which duplicate detection drops within its window
(a finished order whose outbox went already sends nothing).
"""

from __future__ import annotations

import logging

from adapters.store.rows import ConcurrencyConflict, OrderNotFound
from domain.events import Context, Decision, Owed
from domain.lifecycle import decide
from domain.messages import SendOwed
from domain.order import Order
from domain.workflows import UnknownWorkflow
from service import apply
from service.runtime import Runtime

log = logging.getLogger("service.handover")


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


async def send_owed(rt: Runtime, command: SendOwed) -> None:
    """Send what the order owes now (the pattern app's side of :func:`ask`)."""

    async def deciding(order: Order, ctx: Context) -> Decision:
        finished = order.state.terminal
        delivered = finished and not await rt.store.index.has(order.order_id, order.generation)
        return decide(order, Owed(delivered), ctx)

    actor = rt.actor("scheduler")
    try:
        await apply.handle_with(rt, command.order_id, deciding, actor=actor, span="send_owed")
    except OrderNotFound:
        log.warning("asked to send what order %s owes, but it does not exist", command.order_id)
    except apply.Parked:
        log.warning("asked to send what parked order %s owes; it waits", command.order_id)
