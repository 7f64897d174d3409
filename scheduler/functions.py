"""The Scheduler's Service Bus triggers: submissions, agent replies and commands.

Submissions and replies are the hot path: ``async def`` on the async shell (``core.aio``,
``scheduler.aio``), one event loop per worker. Commands (operator actions) are rare and run
on the sync twin of the same code. Each message is handled in a span parented on the trace
context it carries (core.telemetry). Replies and commands are internal: they are handled only
if the app signed them for their queue (core.inbound). Submissions come from outside and are
validated, not signed.
"""

from __future__ import annotations

import azure.functions as func

from core import inbound, runtime
from core.aio import inbound as inbound_aio
from core.aio import runtime as runtime_aio
from core.telemetry import consuming
from scheduler.aio.intake import handle_submission
from scheduler.aio.replies import handle_response
from scheduler.commands import handle_command

bp = func.Blueprint()

_TRIGGER = {"connection": "ServiceBusConnection", "arg_name": "msg"}


async def on_submission(msg: func.ServiceBusMessage, rt: runtime_aio.Runtime) -> None:
    with consuming(msg, "scheduler_intake", rt.settings.queue("orders")):
        delivery = inbound_aio.Delivery.of(msg)
        await handle_submission(delivery.body, rt, caused_by=delivery.cause("orders"))


async def on_reply(msg: func.ServiceBusMessage, rt: runtime_aio.Runtime) -> None:
    with consuming(msg, "scheduler_replies", rt.settings.queue("responses")):
        delivery = inbound_aio.Delivery.of(msg)
        body = await inbound_aio.trusted_body(rt, delivery, "responses", "replies")
        if body is not None:
            await handle_response(body, rt, caused_by=delivery.cause("responses"))


def on_command(msg: func.ServiceBusMessage, rt: runtime.Runtime) -> None:
    with consuming(msg, "scheduler_commands", rt.settings.queue("commands")):
        delivery = inbound.Delivery.of(msg)
        body = inbound.trusted_body(rt, delivery, "commands", "commands")
        if body is not None:
            handle_command(body, rt, caused_by=delivery.cause("commands"))


@bp.service_bus_queue_trigger(queue_name="%ORDERS_QUEUE%", **_TRIGGER)
async def scheduler_intake(msg: func.ServiceBusMessage) -> None:
    await on_submission(msg, runtime_aio.current())


@bp.service_bus_queue_trigger(queue_name="%AGENT_RESPONSES_QUEUE%", **_TRIGGER)
async def scheduler_replies(msg: func.ServiceBusMessage) -> None:
    await on_reply(msg, runtime_aio.current())


@bp.service_bus_queue_trigger(queue_name="%SCHEDULER_COMMANDS_QUEUE%", **_TRIGGER)
def scheduler_commands(msg: func.ServiceBusMessage) -> None:
    on_command(msg, runtime.current())
