"""Scheduler commands: the Supervisor's delayed retries and operators' resubmissions.

A retry command names the FailureCount it was issued for; if the order has moved on since (it
was claimed, finished, or failed again), the command is stale and dropped.
"""

from __future__ import annotations

import logging

from core.messages import BadMessage, OperatorAlert, SchedulerCommand, parse_message
from core.runtime import Runtime
from core.state_models import ConcurrencyConflict, InvalidTransition, OrderNotFound
from core.states import ProcessState
from scheduler.dispatch import claim_and_dispatch

log = logging.getLogger("scheduler.commands")


def handle_command(body: bytes | str, rt: Runtime) -> None:
    try:
        command = parse_message(body, SchedulerCommand)
    except BadMessage as bad:
        rt.alert(bad.to_alert(source=rt.actor("commands")))
        return
    try:
        order = rt.store.get_order(command.order_id)
    except OrderNotFound:
        log.warning("%s command for unknown order %s dropped", command.command, command.order_id)
        return
    process = order.process
    if command.command == "retry":
        if process.state is not ProcessState.PENDING or process.locked_by is not None:
            log.info("order %s is %s; retry command dropped", process.order_id, process.state)
            return
        if process.failure_count != command.failure_count:
            log.info("order %s: stale retry command dropped", process.order_id)
            return
        claim_and_dispatch(process, order.details, rt)
    elif command.command == "resubmit":
        try:
            resumed = rt.store.resubmit(process, actor=command.requested_by, reason=command.reason)
        except (InvalidTransition, ConcurrencyConflict) as exc:
            log.info("order %s: resubmit refused: %s", process.order_id, exc)
            return
        claim_and_dispatch(resumed, order.details, rt)
    else:
        rt.alert(
            OperatorAlert(
                order_id=process.order_id,
                severity="warning",
                reason="command_not_supported",
                detail=(
                    f"'{command.command}' from {command.requested_by} was not applied: this "
                    "version cannot cancel orders (cancellation needs compensation)."
                ),
                source=rt.actor("commands"),
            )
        )
