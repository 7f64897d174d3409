"""What an order owes, sent by the pattern app for the operations app, which wrote it.

The operations app may send to one queue only, scheduler-commands (docs/architecture.md, "Two
apps"). So an operator's action (:mod:`service.control`, :mod:`service.migration`) is decided
and written there as any decision is, in one ETag-conditional write of the order with the
messages it owes (its outbox), but not sent: the operations app asks the pattern app, with one
signed :class:`domain.messages.SendOwed` command (:func:`service.control.write_with`), to send
what the order owes, and :func:`send_owed` (the pattern app's commands trigger) does, deciding
on the order as it is then (:class:`domain.events.Owed`).

Nothing is lost between the two: the outbox is on the order. If the command never leaves (a
crash, an outage), whoever touches the order next sends what it owes, or the Supervisor does: a
finished order once its flush grace has passed, an order in flight when it is next due. A
command that comes twice, late, or for an order that has moved on since sends what the order owes
then: what its next writer would send anyway, which duplicate detection drops within its window
(a finished order whose outbox went already sends nothing).
"""

from __future__ import annotations

import logging

from adapters.store.rows import OrderNotFound
from domain.events import Context, Decision, Owed
from domain.lifecycle import decide
from domain.messages import SendOwed
from domain.order import Order
from service import apply
from service.runtime import Runtime

log = logging.getLogger("service.handover")


async def send_owed(rt: Runtime, command: SendOwed) -> None:
    """Send what the order owes now."""

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
