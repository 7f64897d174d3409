"""Submitting and reading orders against a running local stack (the CLI and the demo)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable, Sequence

from azure.servicebus.aio import ServiceBusClient

from adapters import clients
from adapters.servicebus import to_servicebus_message
from adapters.settings import Settings
from adapters.store.records import OrderRecords
from adapters.tables import Table as TableClient
from domain.messages import OrderSubmitted

SEND_BATCH = 100


def parse_item(text: str) -> dict[str, object]:
    """'SKU:QUANTITY:UNIT_PRICE_CENTS' -> a line item, with a message that says what is wrong."""
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"item {text!r} must be SKU:QUANTITY:UNIT_PRICE_CENTS, e.g. SKU-1:2:1999")
    sku, quantity, price = parts
    if not quantity.isdigit() or not price.isdigit():
        raise ValueError(f"item {text!r}: quantity and unit price (in cents) must be integers")
    return {"sku": sku, "quantity": int(quantity), "unit_price_cents": int(price)}


def build_order(
    order_id: str | None,
    items: Sequence[str],
    customer: str,
    currency: str,
    workflow: str,
    reply_to: str | None,
) -> OrderSubmitted:
    return OrderSubmitted.model_validate(
        {
            "order_id": order_id or f"order-{uuid.uuid4().hex[:12]}",
            "customer_id": customer,
            "items": [parse_item(item) for item in items],
            "currency": currency,
            "workflow": workflow,
            "reply_to": reply_to,
        }
    )


async def send_orders(
    settings: dict[str, str], orders: Iterable[OrderSubmitted], *, rate: float = 0.0
) -> int:
    """Send in batches (one AMQP transfer each); `rate` > 0 paces them to that many orders/s."""
    config = Settings.from_env(settings)
    size = SEND_BATCH if rate <= 0 else max(1, min(SEND_BATCH, int(rate / 10)))
    started = time.monotonic()
    sent = 0
    async with (
        ServiceBusClient.from_connection_string(settings["ServiceBusConnection"]) as client,
        client.get_queue_sender(config.queue("orders")) as sender,
    ):
        batch: list = []
        for order in orders:
            batch.append(to_servicebus_message(order))
            if len(batch) == size:
                await sender.send_messages(batch)
                sent += len(batch)
                batch = []
                if rate > 0:
                    await asyncio.sleep(max(0.0, started + sent / rate - time.monotonic()))
        if batch:
            await sender.send_messages(batch)
            sent += len(batch)
    return sent


def open_store(settings: dict[str, str]) -> OrderRecords:
    """The stack's state store; the caller closes it (``async with``)."""
    config = Settings.from_env(settings)
    return OrderRecords(
        clients.table_service(config.storage),
        orders_table=config.orders_table,
        active_table=config.active_table,
        supervision_table=config.supervision_table,
        owns_service=True,  # closing the store closes its HTTP session
    )


def open_orders_table(settings: dict[str, str]) -> TableClient:
    """The orders table itself, for reads in one pass over many orders (the summaries)."""
    config = Settings.from_env(settings)
    service = clients.table_service(config.storage)
    return service.get_table_client(config.orders_table, owns_service=True)
