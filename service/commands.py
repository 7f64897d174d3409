"""Scheduler commands: the retries the lifecycle schedules, the rows due a Supervisor tick hands
out to be recovered (:mod:`service.recovery`), and what the operations app asks the pattern app
to send for it, since it may send to no other queue: what an order it wrote owes
(:mod:`service.handover`), and dead letters to send back (:mod:`service.replays`).

A retry command names the attempt it was issued for; if the order has moved on since (it was
claimed, finished, or failed again), the command is stale and changes nothing. Operators act on
orders through the operations app (:mod:`service.control`), never through this queue.
"""

from __future__ import annotations

import logging

from adapters.store.rows import OrderNotFound
from domain.events import RetryDue
from domain.messages import (
    BadMessage,
    DueRows,
    ReplayDeadLetter,
    SchedulerCommand,
    SendOwed,
    parse_one_of,
)
from service import apply, handover, replays
from service.recovery import handle_due_rows
from service.runtime import Runtime

log = logging.getLogger("service.commands")


async def handle_command(body: bytes | str, rt: Runtime, *, caused_by: str | None = None) -> None:
    """``caused_by``: the command's :meth:`service.inbound.Delivery.cause`, for its alerts. The
    queue also carries the rows a Supervisor tick handed out (:mod:`service.recovery`)."""
    try:
        command = parse_one_of(body, SchedulerCommand, SendOwed, ReplayDeadLetter, DueRows)
    except BadMessage as bad:
        await rt.alert(bad.to_alert(source=rt.actor("commands"), caused_by=caused_by))
        return
    if isinstance(command, DueRows):
        await handle_due_rows(rt, command, caused_by=caused_by)
        return
    if isinstance(command, SendOwed):
        await handover.send_owed(rt, command)
        return
    if isinstance(command, ReplayDeadLetter):
        await replays.replay(rt, command, caused_by=caused_by)
        return
    assert isinstance(command, SchedulerCommand)
    try:
        await apply.handle(rt, command.order_id, RetryDue(command), actor=rt.actor("scheduler"))
    except OrderNotFound:
        log.warning("retry command for unknown order %s dropped", command.order_id)
    except apply.Parked:
        log.warning("retry command for parked order %s dropped", command.order_id)
