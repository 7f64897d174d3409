"""The Scheduler's Service Bus triggers: submissions, agent replies and commands."""

from __future__ import annotations

import azure.functions as func

from core import runtime
from scheduler.commands import handle_command
from scheduler.intake import handle_submission
from scheduler.replies import handle_response

bp = func.Blueprint()

_TRIGGER = {"connection": "ServiceBusConnection", "arg_name": "msg"}


@bp.service_bus_queue_trigger(queue_name="%ORDERS_QUEUE%", **_TRIGGER)
def scheduler_intake(msg: func.ServiceBusMessage) -> None:
    handle_submission(msg.get_body(), runtime.current())


@bp.service_bus_queue_trigger(queue_name="%AGENT_RESPONSES_QUEUE%", **_TRIGGER)
def scheduler_replies(msg: func.ServiceBusMessage) -> None:
    handle_response(msg.get_body(), runtime.current())


@bp.service_bus_queue_trigger(queue_name="%SCHEDULER_COMMANDS_QUEUE%", **_TRIGGER)
def scheduler_commands(msg: func.ServiceBusMessage) -> None:
    handle_command(msg.get_body(), runtime.current())
