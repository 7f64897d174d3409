"""Alerts: the messages of the alerts queue, each named by its sequence number.

Listing and showing them peeks (nothing changes) and says whether each is resolved, from its
order's state and timeline (:mod:`service.operations.alert_resolution`). Acknowledging completes
the message (see :mod:`adapters.queues`) and, when the alert names an order, records the
acknowledgement, with the operator's reason, in that order's timeline.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from azure.servicebus import ServiceBusReceivedMessage

from adapters.queues import body_of
from domain.messages import BadMessage, OperatorAlert, excerpt, parse_message
from domain.order import Order
from domain.retention import ack_detail
from service.listing import MAX_LIMIT
from service.operations import alert_resolution, validation
from service.operations.annotate import annotate
from service.operations.context import OperatorContext
from service.operations.errors import Conflict, InvalidRequest, NotFound
from service.operations.models import AckView, AlertPage, AlertView
from service.operations.orders import MAX_TIMELINE_LIMIT

audit = logging.getLogger("operator_api.audit")

MAX_ACK_SCAN: Final = 500


async def list_alerts(
    ctx: OperatorContext,
    *,
    limit: int = 50,
    continuation: str | None = None,
    open_only: bool = False,
) -> AlertPage:
    """Alerts in the alerts queue, oldest first, without taking them (peek), each with its
    resolution; ``open_only``: only those still open or retrying (a page may then hold
    fewer than ``limit`` and still have a continuation). Costs a point read per order
    named, and a timeline read per terminal alert whose order failed again."""
    validation.check_limit(limit, MAX_LIMIT)
    if not isinstance(open_only, bool):
        raise InvalidRequest("invalid_request", "open must be true or false")
    start = validation.sequence_cursor(continuation)
    messages = await ctx.queues.peek(ctx.queue("alerts"), from_sequence=start, limit=limit)
    more = len(messages) == limit
    views = await _resolved(ctx, [_view(m) for m in messages])
    if open_only:
        views = [v for v in views if v.resolution in alert_resolution.STILL_OPEN]
    return AlertPage(
        items=views,
        continuation=str(messages[-1].sequence_number + 1) if more else None,
        open_only=open_only,
    )


async def peek_alert(ctx: OperatorContext, sequence_number: int) -> AlertView:
    found = await _find(ctx, validation.sequence(sequence_number))
    return (await _resolved(ctx, [_view(found)]))[0]


async def acknowledge_alert(
    ctx: OperatorContext, sequence_number: int, *, operator: str, reason: str | None = None
) -> AckView:
    """Remove an alert from the queue and record who acknowledged it, and why (``reason``
    is required: None or blank is refused, saying so)."""
    sequence = validation.sequence(sequence_number)
    actor = validation.operator_actor(operator)
    why = validation.reason(reason)
    view = _view(await _find(ctx, sequence))
    alerts = ctx.queue("alerts")
    if not await ctx.queues.complete(alerts, sequence, max_scan=MAX_ACK_SCAN):
        raise Conflict(
            "alert_busy",
            f"alert {sequence} could not be taken: another operator may be acknowledging it "
            "right now. Try again in a moment.",
        )
    order_id = _order_named(view)
    recorded = False
    if order_id is not None:
        alert = view.alert or {}
        # domain.retention reads the alert's reason back from the start of the detail (a
        # terminal alert acknowledged resolves an Error): the operator's reason goes after it.
        detail = f"{ack_detail(sequence, alert.get('severity'), alert.get('reason'))}: {why}"
        recorded = await annotate(ctx, order_id, actor, "alert_acknowledged", detail)
    audit.info("%s acknowledged alert %d (order %s): %s", actor, sequence, order_id or "-", why)
    return AckView(
        sequence_number=sequence,
        message_id=view.message_id,
        order_id=order_id,
        acknowledged_by=actor,
        recorded_in_timeline=recorded,
    )


async def _resolved(ctx: OperatorContext, views: list[AlertView]) -> list[AlertView]:
    orders: dict[str, Order | None] = {}
    shown = []
    for view in views:
        alert = view.alert or {}
        order_id = _order_named(view)
        if order_id is not None and order_id not in orders:
            orders[order_id] = await ctx.rt.store.find(order_id)
        order = orders.get(order_id) if order_id else None
        after = alert_resolution.needs_timeline(alert, order)
        later = (
            await ctx.rt.store.get_timeline(order_id, after_seq=after, limit=MAX_TIMELINE_LIMIT)
            if after is not None and order_id
            else []
        )
        shown.append(
            view.model_copy(
                update={
                    "resolution": alert_resolution.resolution(alert, order, later),
                    "order_state": order.state.value if order else None,
                }
            )
        )
    return shown


async def _find(ctx: OperatorContext, sequence: int) -> ServiceBusReceivedMessage:
    found = await ctx.queues.peek(ctx.queue("alerts"), from_sequence=sequence, limit=1)
    if not found or found[0].sequence_number != sequence:
        raise NotFound(
            "alert_not_found",
            f"no alert with sequence number {sequence} (it may have been acknowledged)",
        )
    return found[0]


def _view(message: ServiceBusReceivedMessage) -> AlertView:
    raw = body_of(message)
    alert: dict[str, Any] | None = None
    problem: str | None = None
    try:
        alert = parse_message(raw, OperatorAlert).model_dump(mode="json")
    except BadMessage as bad:
        problem = bad.reason
    return AlertView(
        sequence_number=message.sequence_number or 0,
        message_id=message.message_id,
        enqueued_at=message.enqueued_time_utc,
        alert=alert,
        raw=None if alert is not None else excerpt(raw),
        problem=problem,
    )


def _order_named(view: AlertView) -> str | None:
    order_id = (view.alert or {}).get("order_id")
    return order_id if isinstance(order_id, str) else None
