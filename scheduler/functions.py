"""The Scheduler's Service Bus triggers: submissions, agent replies and commands.

Each message is handled in a span parented on the trace context it carries (core.telemetry).
"""

from __future__ import annotations

import azure.functions as func

from core import runtime
from core.telemetry import consuming
from scheduler.commands import handle_command
from scheduler.intake import handle_submission
from scheduler.replies import handle_response

bp = func.Blueprint()

_TRIGGER = {"connection": "ServiceBusConnection", "arg_name": "msg"}


@bp.service_bus_queue_trigger(queue_name="%ORDERS_QUEUE%", **_TRIGGER)
def scheduler_intake(msg: func.ServiceBusMessage) -> None:
    rt = runtime.current()
    with consuming(msg, "scheduler_intake", rt.settings.queue("orders")):
        handle_submission(msg.get_body(), rt)


@bp.service_bus_queue_trigger(queue_name="%AGENT_RESPONSES_QUEUE%", **_TRIGGER)
def scheduler_replies(msg: func.ServiceBusMessage) -> None:
    rt = runtime.current()
    with consuming(msg, "scheduler_replies", rt.settings.queue("responses")):
        handle_response(msg.get_body(), rt)


@bp.service_bus_queue_trigger(queue_name="%SCHEDULER_COMMANDS_QUEUE%", **_TRIGGER)
def scheduler_commands(msg: func.ServiceBusMessage) -> None:
    rt = runtime.current()
    with consuming(msg, "scheduler_commands", rt.settings.queue("commands")):
        handle_command(msg.get_body(), rt)
