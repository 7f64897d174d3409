"""The Scheduler's Service Bus triggers: submissions, agent replies and commands.

Each message is handled in a span parented on the trace context it carries (core.telemetry).
Replies and commands are internal: they are handled only if the app signed them for their
queue (core.inbound). Submissions come from outside and are validated, not signed.
"""

from __future__ import annotations

import azure.functions as func

from core import inbound, runtime
from core.runtime import Runtime
from core.telemetry import consuming
from scheduler.commands import handle_command
from scheduler.intake import handle_submission
from scheduler.replies import handle_response

bp = func.Blueprint()

_TRIGGER = {"connection": "ServiceBusConnection", "arg_name": "msg"}


def on_reply(msg: func.ServiceBusMessage, rt: Runtime) -> None:
    with consuming(msg, "scheduler_replies", rt.settings.queue("responses")):
        body = inbound.trusted_body(rt, inbound.Delivery.of(msg), "responses", "replies")
        if body is not None:
            handle_response(body, rt)


def on_command(msg: func.ServiceBusMessage, rt: Runtime) -> None:
    with consuming(msg, "scheduler_commands", rt.settings.queue("commands")):
        body = inbound.trusted_body(rt, inbound.Delivery.of(msg), "commands", "commands")
        if body is not None:
            handle_command(body, rt)


@bp.service_bus_queue_trigger(queue_name="%ORDERS_QUEUE%", **_TRIGGER)
def scheduler_intake(msg: func.ServiceBusMessage) -> None:
    rt = runtime.current()
    with consuming(msg, "scheduler_intake", rt.settings.queue("orders")):
        handle_submission(msg.get_body(), rt)


@bp.service_bus_queue_trigger(queue_name="%AGENT_RESPONSES_QUEUE%", **_TRIGGER)
def scheduler_replies(msg: func.ServiceBusMessage) -> None:
    on_reply(msg, runtime.current())


@bp.service_bus_queue_trigger(queue_name="%SCHEDULER_COMMANDS_QUEUE%", **_TRIGGER)
def scheduler_commands(msg: func.ServiceBusMessage) -> None:
    on_command(msg, runtime.current())
