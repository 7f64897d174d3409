"""One Service Bus-triggered agent per remote service.

Each request is handled in a span parented on the trace context it carries (core.telemetry).
"""

from __future__ import annotations

import azure.functions as func

from agent.handler import handle_request
from core import runtime
from core.telemetry import consuming

bp = func.Blueprint()

_TRIGGER = {"connection": "ServiceBusConnection", "arg_name": "msg"}


def _handle(msg: func.ServiceBusMessage, service: str) -> None:
    rt = runtime.current()
    with consuming(msg, f"{service}_agent", rt.settings.queue(service)):
        handle_request(msg.get_body(), service, rt)


@bp.service_bus_queue_trigger(queue_name="%INVENTORY_REQUESTS_QUEUE%", **_TRIGGER)
def inventory_agent(msg: func.ServiceBusMessage) -> None:
    _handle(msg, "inventory")


@bp.service_bus_queue_trigger(queue_name="%PAYMENT_REQUESTS_QUEUE%", **_TRIGGER)
def payment_agent(msg: func.ServiceBusMessage) -> None:
    _handle(msg, "payment")


@bp.service_bus_queue_trigger(queue_name="%SHIPPING_REQUESTS_QUEUE%", **_TRIGGER)
def shipping_agent(msg: func.ServiceBusMessage) -> None:
    _handle(msg, "shipping")
