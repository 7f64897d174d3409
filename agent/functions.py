"""One Service Bus-triggered agent per remote service."""

from __future__ import annotations

import azure.functions as func

from agent.handler import handle_request
from core import runtime

bp = func.Blueprint()

_TRIGGER = {"connection": "ServiceBusConnection", "arg_name": "msg"}


@bp.service_bus_queue_trigger(queue_name="%INVENTORY_REQUESTS_QUEUE%", **_TRIGGER)
def inventory_agent(msg: func.ServiceBusMessage) -> None:
    handle_request(msg.get_body(), "inventory", runtime.current())


@bp.service_bus_queue_trigger(queue_name="%PAYMENT_REQUESTS_QUEUE%", **_TRIGGER)
def payment_agent(msg: func.ServiceBusMessage) -> None:
    handle_request(msg.get_body(), "payment", runtime.current())


@bp.service_bus_queue_trigger(queue_name="%SHIPPING_REQUESTS_QUEUE%", **_TRIGGER)
def shipping_agent(msg: func.ServiceBusMessage) -> None:
    handle_request(msg.get_body(), "shipping", runtime.current())
