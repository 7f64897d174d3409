"""Scheduler commands: the retries the lifecycle schedules, and operators' cancels and resubmits.

A retry command names the attempt it was issued for; if the order has moved on since (it was
claimed, finished, or failed again), the command is stale and changes nothing. Resubmit and
cancel run :mod:`service.control` on behalf of ``requested_by``; one that does not apply to
the order as it is now is reported to operators.
"""

from __future__ import annotations

import logging

from adapters.store.rows import OrderNotFound
from domain.events import RetryDue
from domain.messages import BadMessage, OperatorAlert, SchedulerCommand, parse_message
from domain.operator_actions import Refused
from service import apply, control
from service.runtime import Runtime

log = logging.getLogger("service.commands")


async def handle_command(body: bytes | str, rt: Runtime, *, caused_by: str | None = None) -> None:
    """``caused_by``: the command's :meth:`service.inbound.Delivery.cause`, for its alerts."""
    try:
        command = parse_message(body, SchedulerCommand)
    except BadMessage as bad:
        await rt.alert(bad.to_alert(source=rt.actor("commands"), caused_by=caused_by))
        return
    if command.command == "retry":
        try:
            await apply.handle(rt, command.order_id, RetryDue(command), actor=rt.actor("scheduler"))
        except OrderNotFound:
            log.warning("retry command for unknown order %s dropped", command.order_id)
        except apply.Parked:
            log.warning("retry command for parked order %s dropped", command.order_id)
        return
    action = control.cancel if command.command == "cancel" else control.resubmit
    try:
        result = await action(
            rt, command.order_id, actor=command.requested_by, reason=command.reason
        )
    except Refused as refused:
        await rt.alert(
            OperatorAlert(
                order_id=command.order_id,
                severity="warning",
                reason="command_refused",
                detail=f"{command.command} from {command.requested_by} was not applied: "
                f"{refused.message}",
                source=rt.actor("commands"),
                caused_by=caused_by,
            )
        )
        return
    log.info(
        "order %s: %s by %s: %s",
        command.order_id,
        command.command,
        command.requested_by,
        result.outcome,
    )
