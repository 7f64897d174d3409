"""Scheduler commands: the Supervisor's retries, and operators' resubmissions and cancels.

A retry command names the FailureCount it was issued for; if the order has moved on since (it
was claimed, finished, or failed again), the command is stale and dropped. A retry of a released
compensation claims the next undo. Resubmit and cancel run :mod:`scheduler.control` on behalf of
``requested_by``; one that does not apply to the order as it is now is reported to operators.
"""

from __future__ import annotations

import logging

from core.messages import BadMessage, OperatorAlert, SchedulerCommand, parse_message
from core.runtime import Runtime
from core.state_models import OrderNotFound
from core.states import ProcessState
from scheduler import control
from scheduler.dispatch import claim_and_dispatch

log = logging.getLogger("scheduler.commands")

_RETRYABLE = (ProcessState.PENDING, ProcessState.COMPENSATING)


def handle_command(body: bytes | str, rt: Runtime) -> None:
    try:
        command = parse_message(body, SchedulerCommand)
    except BadMessage as bad:
        rt.alert(bad.to_alert(source=rt.actor("commands")))
        return
    if command.command == "retry":
        _retry(command, rt)
        return
    action = control.cancel if command.command == "cancel" else control.resubmit
    try:
        result = action(rt, command.order_id, actor=command.requested_by, reason=command.reason)
    except control.Refused as refused:
        rt.alert(
            OperatorAlert(
                order_id=command.order_id,
                severity="warning",
                reason="command_refused",
                detail=f"{command.command} from {command.requested_by} was not applied: "
                f"{refused.message}",
                source=rt.actor("commands"),
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


def _retry(command: SchedulerCommand, rt: Runtime) -> None:
    try:
        order = rt.store.get_order(command.order_id)
    except OrderNotFound:
        log.warning("retry command for unknown order %s dropped", command.order_id)
        return
    process = order.process
    if process.state not in _RETRYABLE or process.locked_by is not None:
        log.info("order %s is %s; retry command dropped", process.order_id, process.state)
        return
    if process.failure_count != command.failure_count:
        log.info("order %s: stale retry command dropped", process.order_id)
        return
    claim_and_dispatch(process, order.details, rt)
