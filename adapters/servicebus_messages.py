"""The Service Bus message each app message travels as: one definition for adapters.servicebus (and
for
the tools that send through the SDK directly)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from azure.servicebus import ServiceBusMessage

from adapters import telemetry
from domain import signing
from domain.messages import MessageBase, encode, message_id_for


def to_servicebus_message(
    message: MessageBase,
    scheduled_at: datetime | None = None,
    *,
    signed_for: tuple[str, signing.Keyring] | None = None,
) -> ServiceBusMessage:
    """``signed_for``: (destination queue, keyring) to sign the message for that queue."""
    body = encode(message)
    message_id = message_id_for(message)
    properties: dict[str | bytes, Any] = {"schema_version": message.schema_version}
    if signed_for is not None:
        queue, keyring = signed_for
        properties[signing.SIGNATURE_PROPERTY] = signing.sign(
            keyring, queue=queue, message_id=message_id, body=body
        )
    telemetry.inject(properties)
    return ServiceBusMessage(
        body,
        message_id=message_id,
        correlation_id=getattr(message, "order_id", None),
        subject=message.type,  # type: ignore[attr-defined]
        content_type="application/json",
        application_properties=properties,
        scheduled_enqueue_time_utc=scheduled_at,
    )
