"""Trace context sent with a message comes out of the broker with it (real local broker)."""

from __future__ import annotations

import uuid

import pytest
from azure.servicebus import ServiceBusClient
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from adapters import telemetry
from adapters.servicebus import Bus
from devstack.host.servicebus_runner import to_function_message
from domain.messages import OrderSubmitted, message_id_for

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


async def test_traceparent_crosses_the_broker_with_the_same_trace_id(servicebus):
    queue = servicebus.queue("order-status")
    order = OrderSubmitted.model_validate(
        {
            "order_id": f"o-{uuid.uuid4().hex[:12]}",
            "customer_id": "c-1",
            "items": [{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 100}],
            "currency": "EUR",
        }
    )
    sender_span = SpanContext(
        trace_id=uuid.uuid4().int >> 1,
        span_id=uuid.uuid4().int >> 65,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    bus = Bus(lambda: AsyncServiceBusClient.from_connection_string(servicebus.connection_string))
    try:
        with trace.use_span(NonRecordingSpan(sender_span)):
            await bus.send(queue, order)
    finally:
        await bus.close()

    with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        with client.get_queue_receiver(queue, max_wait_time=10) as receiver:
            received = None
            for message in receiver:
                receiver.complete_message(message)
                if message.message_id == message_id_for(order):
                    received = message
                    break
    assert received is not None, "the message did not come back"

    properties = received.application_properties or {}
    traceparent = properties[b"traceparent"]
    expected = f"00-{sender_span.trace_id:032x}-{sender_span.span_id:016x}-01"
    assert traceparent in (expected, expected.encode())
    assert properties[b"Diagnostic-Id"] == traceparent

    for carrier in (properties, to_function_message(received).application_properties):
        extracted = trace.get_current_span(telemetry.extract(carrier)).get_span_context()
        assert extracted.trace_id == sender_span.trace_id
        assert extracted.span_id == sender_span.span_id
