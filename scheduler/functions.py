"""The Scheduler's Service Bus triggers: submissions, agent replies and commands.

Every trigger is ``async def``: the Python worker awaits it on its event loop. Each message is
handled in a span parented on the trace context it carries (adapters.telemetry), its Table
calls bounded by its lock (service.deadlines). Replies and commands are internal: they are
handled only if the app signed them for their queue (service.inbound). Submissions come from
outside and are validated, not signed. The triggers take the process's Runtime from the app's
composition root (:mod:`service.composition`), which function_app.py hands to :func:`blueprint`.
"""

from __future__ import annotations

import azure.functions as func

from adapters.telemetry import consuming
from service import deadlines, inbound, runtime
from service.commands import handle_command
from service.composition import Root
from service.intake import handle_submission
from service.replies import handle_response

_TRIGGER = {"connection": "ServiceBusConnection", "arg_name": "msg"}


async def on_submission(msg: func.ServiceBusMessage, rt: runtime.Runtime) -> None:
    with consuming(msg, "scheduler_intake", rt.settings.queue("orders")), deadlines.message():
        delivery = inbound.Delivery.of(msg)
        await handle_submission(delivery.body, rt, caused_by=delivery.cause("orders"))


async def on_reply(msg: func.ServiceBusMessage, rt: runtime.Runtime) -> None:
    with (
        consuming(msg, "scheduler_replies", rt.settings.queue("responses")),
        deadlines.message(),
    ):
        delivery = inbound.Delivery.of(msg)
        body = await inbound.trusted_body(rt, delivery, "responses", "replies")
        if body is not None:
            await handle_response(body, rt, caused_by=delivery.cause("responses"))


async def on_command(msg: func.ServiceBusMessage, rt: runtime.Runtime) -> None:
    with (
        consuming(msg, "scheduler_commands", rt.settings.queue("commands")),
        deadlines.message(),
    ):
        delivery = inbound.Delivery.of(msg)
        body = await inbound.trusted_body(rt, delivery, "commands", "commands")
        if body is not None:
            await handle_command(body, rt, caused_by=delivery.cause("commands"))


def blueprint(root: Root) -> func.Blueprint:
    bp = func.Blueprint()

    @bp.service_bus_queue_trigger(queue_name="%ORDERS_QUEUE%", **_TRIGGER)
    async def scheduler_intake(msg: func.ServiceBusMessage) -> None:
        await on_submission(msg, root.runtime())

    @bp.service_bus_queue_trigger(queue_name="%AGENT_RESPONSES_QUEUE%", **_TRIGGER)
    async def scheduler_replies(msg: func.ServiceBusMessage) -> None:
        await on_reply(msg, root.runtime())

    @bp.service_bus_queue_trigger(queue_name="%SCHEDULER_COMMANDS_QUEUE%", **_TRIGGER)
    async def scheduler_commands(msg: func.ServiceBusMessage) -> None:
        await on_command(msg, root.runtime())

    return bp
