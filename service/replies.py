"""Agent replies: the lifecycle decides what a reply means (:mod:`domain.lifecycle`).

A reply is matched to its step by the idempotency key it answers, not by attempt: a definitive
answer for the step in flight is applied whichever attempt carried it; one for a step no longer
in flight is recorded when it says an effect happened (or never will). Either only if the order
sent the request it answers; anything else changes nothing and is alerted. A reply that echoes
its request's snapshot of the order is applied without reading the order (service.resume,
service.apply).
"""

from __future__ import annotations

import logging

from adapters.store.rows import OrderNotFound
from domain.events import Replied
from domain.messages import AgentResponse, BadMessage, OperatorAlert, parse_message
from service import apply
from service.runtime import Runtime

log = logging.getLogger("service.replies")


async def handle_response(body: bytes | str, rt: Runtime, *, caused_by: str | None = None) -> None:
    """``caused_by``: the reply's :meth:`service.inbound.Delivery.cause`, for its alerts."""
    try:
        response = parse_message(body, AgentResponse)
    except BadMessage as bad:
        await rt.alert(bad.to_alert(source=rt.actor("replies"), caused_by=caused_by))
        return
    try:
        await apply.handle(
            rt, response.order_id, Replied(response, caused_by), actor=rt.actor("scheduler")
        )
    except apply.Parked:
        # Dropping the reply loses nothing: once the version is back, the step's deadline
        # passes and its retry gets the same answer under the same idempotency key.
        log.warning("reply for parked order %s dropped", response.order_id)
    except OrderNotFound:
        await rt.alert(
            OperatorAlert(
                order_id=response.order_id,
                severity="warning",
                reason="reply_for_unknown_order",
                detail=f"a {response.outcome} reply for step {response.step} names no order",
                source=rt.actor("replies"),
                caused_by=caused_by,
            )
        )
