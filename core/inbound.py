"""The door of the internal queues: a message is handled only if the app signed it.

The agent request queues, the reply queue and the command queue carry only messages the app
itself sent, signed for that queue (:mod:`core.signing`). A message that is unsigned, signed
with an unknown key or whose signature does not match is not handled: the trigger returns, so
the message is completed (never retried, never dead-lettered in a loop), and one
``untrusted_message`` alert names the queue, the MessageId and what was wrong. Nothing else
changes, and no Table request is made.

The alert names no order: the order id in a forged body is the sender's claim (it is quoted in
the detail). An alert that named the order would be counted as that order's alert, and its
acknowledgement recorded on the order's timeline.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from core import signing, telemetry
from core.messages import OperatorAlert, excerpt

if TYPE_CHECKING:
    from core.runtime import Runtime

UNTRUSTED_REASON: Final = "untrusted_message"


@dataclass(frozen=True)
class Delivery:
    """What a trigger receives that the signature covers, as the Functions host hands it over."""

    body: bytes
    message_id: str
    properties: Mapping[Any, Any]

    @classmethod
    def of(cls, msg: Any) -> Delivery:
        """From a ``func.ServiceBusMessage`` (Azure's host and the local host build the same)."""
        return cls(
            body=msg.get_body() or b"",
            message_id=str(msg.message_id or ""),
            properties=telemetry.message_properties(msg),
        )


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
    queue: str, delivery: Delivery, rejected: signing.Rejected, source: str
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


async def trusted_body(rt: Runtime, delivery: Delivery, role: str, source: str) -> bytes | None:
    """The body to handle, or None after alerting when the app did not sign it for this queue."""
    queue = rt.settings.queue(role)
    rejected = check(rt.settings.keyring, queue, delivery)
    if rejected is None:
        return delivery.body
    await rt.alert(untrusted_alert(queue, delivery, rejected, rt.actor(source)))
    return None
