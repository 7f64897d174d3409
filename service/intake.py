"""Intake: an OrderSubmitted message becomes an order, created and dispatched in one write.

The order's details, its state (already claimed for the first step) and its first timeline row
are written in ONE table transaction, with the first AgentRequest and the ``received`` status in
its outbox; the sends follow. A redelivered submission finds the order and sends what it still
owes; the same id with a different payload is rejected and reported, never merged. An order
whose ``reply_to`` names one of the app's own queues is refused before anything is stored
(status messages injected into, say, the agent-response queue would be read as replies).

The order records the ``traceparent`` of the span it was created in, so the work the
Supervisor and operators do on it later continues its trace (:func:`adapters.telemetry.continuing`).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from adapters import metrics, telemetry
from adapters.settings import Settings
from adapters.store.rows import AlreadyExists
from domain import events, lifecycle
from domain.messages import BadMessage, OperatorAlert, OrderSubmitted, excerpt, parse_message
from domain.workflows import UnknownWorkflow
from service import apply
from service.runtime import Runtime

log = logging.getLogger("service.intake")


def is_app_queue(settings: Settings, name: str) -> bool:
    """True if ``name`` is one of this app's queues (entity names are case-insensitive)."""
    folded = name.casefold()
    return any(folded == queue.casefold() for queue in settings.queues.values())


async def handle_submission(
    body: bytes | str, rt: Runtime, *, caused_by: str | None = None
) -> None:
    """``caused_by``: the submission's :meth:`service.inbound.Delivery.cause`, which tells
    the alerts of two submissions apart (None: the alert is named by its text)."""
    actor = rt.actor("intake")
    try:
        order = parse_message(body, OrderSubmitted)
    except BadMessage as bad:
        await rt.alert(bad.to_alert(source=actor, caused_by=caused_by))
        return

    async def refuse(reason: str, detail: str) -> None:
        """An error alert that the submission was not applied, quoting its body."""
        await rt.alert(
            OperatorAlert(
                order_id=order.order_id,
                severity="error",
                reason=reason,
                detail=detail,
                raw_excerpt=excerpt(body),
                source=actor,
                caused_by=caused_by,
            )
        )

    if order.reply_to is not None and is_app_queue(rt.settings, order.reply_to):
        await refuse(
            "forbidden_reply_to",
            f"order {order.order_id} names reply_to {order.reply_to!r}, one of this app's own "
            "queues; the order was refused. Name a queue of the submitter's own.",
        )
        return
    try:
        ctx = apply.context(rt, apply.new_order_ref(rt, order), rt.actor("scheduler"))
    except UnknownWorkflow as missing:
        await refuse(
            "unknown_workflow_version",
            f"order {order.order_id} asks for version {order.workflow_version} of workflow "
            f"{order.workflow}: {missing}. The order was not created; submit it without "
            "workflow_version (the current one) or with a carried one.",
        )
        return
    decision = lifecycle.submit(order, ctx)
    assert decision.order is not None and decision.entry is not None
    created = replace(decision.order, trace_parent=telemetry.current_trace_parent())
    result = await rt.store.create(order, created, decision.entry, due=apply.due(rt, created))
    if not isinstance(result, AlreadyExists):
        metrics.order_started(order.workflow)
        await apply.send(rt, result, decision.send)
        return
    if not result.same_payload:
        await refuse(
            "conflicting_submission",
            f"order {order.order_id} already exists with a different payload (stored hash "
            f"{result.existing_payload_hash[:12]}, submitted {order.content_hash()[:12]}); the "
            "new submission was not applied. Submit changes under a new order id.",
        )
        return
    log.info("order %s: duplicate submission; state %s", order.order_id, result.order.state)
    try:
        ctx = apply.context(rt, result.order.workflow, rt.actor("scheduler"))
    except UnknownWorkflow as missing:
        await apply.park(rt, result.order, missing, actor)
        return
    await apply.carry_out(rt, result.order, lifecycle.decide(result.order, events.Resent(), ctx))
