"""The door of the internal queues: a message is handled only if the app signed it.

The agent request queues, the reply queue and the command queue carry only messages the app
itself sent, signed for that queue (:mod:`domain.signing`). A message that is unsigned, signed
with an unknown key or whose signature does not match is not handled: the trigger returns, so
the message is completed (never retried, never dead-lettered in a loop), and one
``untrusted_message`` alert names the queue, the MessageId and what was wrong. Nothing else
changes, and no Table request is made.

The alert names no order: the order id in a forged body is the sender's claim (it is quoted in
the detail). An alert that named the order would be counted as that order's alert, and its
acknowledgement recorded on the order's timeline.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from adapters import telemetry
from domain import signing
from domain.messages import MAX_MESSAGE_ID_LENGTH, OperatorAlert, SignedBody, excerpt

if TYPE_CHECKING:
    from service.runtime import Runtime

UNTRUSTED_REASON: Final = "untrusted_message"


@dataclass(frozen=True)
class Delivery:
    """What a trigger receives that the signature covers, as the Functions host hands it over,
    and the broker's sequence number (which names a message its sender gave no MessageId)."""

    body: bytes
    message_id: str
    properties: Mapping[Any, Any]
    sequence_number: int | None = None

    @classmethod
    def of(cls, msg: Any) -> Delivery:
        """From a ``func.ServiceBusMessage`` (Azure's host and the local host build the same)."""
        return cls(
            body=msg.get_body() or b"",
            message_id=str(msg.message_id or ""),
            properties=telemetry.message_properties(msg),
            sequence_number=msg.sequence_number,
        )

    def cause(self, role: str) -> str:
        """Which message this is, for the alerts handling it raises (``OperatorAlert.caused_by``):
        ``<role>/<MessageId>``, the same for every delivery of it (duplicate detection makes a
        MessageId one message per queue); ``<role>#<sequence number>`` when it has none. A
        MessageId over Service Bus's 128 characters is named by its hash."""
        if not self.message_id:
            return f"{role}#{self.sequence_number}"
        if len(self.message_id) > MAX_MESSAGE_ID_LENGTH:
            return f"{role}/sha256:{hashlib.sha256(self.message_id.encode()).hexdigest()[:40]}"
        return f"{role}/{self.message_id}"


def check(keyring: signing.Keyring, queue: str, delivery: Delivery) -> signing.Rejected | None:
    """None if ``delivery`` is the app's message for ``queue``; else why it is not."""
    verdict = signing.verify(
        keyring,
        signing.signature_of(delivery.properties),
        queue=queue,
        message_id=delivery.message_id,
        body=delivery.body,
    )
    return verdict if isinstance(verdict, signing.Rejected) else None


def untrusted_alert(
    role: str, queue: str, delivery: Delivery, rejected: signing.Rejected, source: str
) -> OperatorAlert:
    return OperatorAlert(
        order_id=None,
        severity="critical",
        reason=UNTRUSTED_REASON,
        detail=(
            f"queue {queue}: message {delivery.message_id[:128]!r} refused ({rejected.problem}): "
            f"{rejected.detail}. {_claims(delivery.body)}It was completed without effect. "
            "Find who can send to this queue (only the app identity should), or, after a key "
            "rotation, check that every instance has the new MESSAGE_SIGNING_KEYS."
        ),
        raw_excerpt=excerpt(delivery.body),
        source=source,
        caused_by=delivery.cause(role),
    )


def _claims(body: bytes) -> str:
    """What the body says it is, quoted for the alert (it proves nothing)."""
    if not body.strip():
        return "Its body is empty. "
    try:
        data = json.loads(body[:65536])
    except (ValueError, RecursionError):
        return "Its body is not JSON. "
    if not isinstance(data, dict):
        return "Its body is not a JSON object. "
    kind, order = data.get("type"), data.get("order_id")
    return f"It claims to be {repr(kind)[:40]} for order {repr(order)[:80]}. "


async def trusted_body(
    rt: Runtime, delivery: Delivery, role: str, source: str
) -> SignedBody | None:
    """The body to handle, or None after alerting when the app did not sign it for this queue.
    Marked as signed: it is parsed in one pass (:class:`domain.messages.SignedBody`)."""
    queue = rt.settings.queue(role)
    rejected = check(rt.settings.keyring, queue, delivery)
    if rejected is None:
        return SignedBody(delivery.body)
    await rt.alert(untrusted_alert(role, queue, delivery, rejected, rt.actor(source)))
    return None
