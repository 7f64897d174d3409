"""Intake: an OrderSubmitted message becomes an order in the state store, then gets claimed.

The order's details, process and step rows are written in ONE table transaction. A redelivered
submission finds them and carries on (claiming is idempotent under ETags); the same id with a
different payload is rejected and reported, never merged. An order whose ``reply_to`` names one
of the app's own queues is refused before anything is stored (see :mod:`scheduler.status`).
"""

from __future__ import annotations

import logging

from core.messages import BadMessage, OperatorAlert, OrderSubmitted, excerpt, parse_message
from core.runtime import Runtime
from core.state_models import AlreadyExists
from core.states import ProcessState
from scheduler.dispatch import claim_and_dispatch
from scheduler.status import Status, is_app_queue, publish

log = logging.getLogger("scheduler.intake")


def handle_submission(body: bytes | str, rt: Runtime) -> None:
    try:
        order = parse_message(body, OrderSubmitted)
    except BadMessage as bad:
        rt.alert(bad.to_alert(source=rt.actor("intake")))
        return
    if order.reply_to is not None and is_app_queue(rt.settings, order.reply_to):
        rt.alert(
            OperatorAlert(
                order_id=order.order_id,
                severity="error",
                reason="forbidden_reply_to",
                detail=(
                    f"order {order.order_id} names reply_to {order.reply_to!r}, one of this "
                    "app's own queues; the order was refused. Name a queue of the submitter's own."
                ),
                raw_excerpt=excerpt(body),
                source=rt.actor("intake"),
            )
        )
        return
    workflow = rt.workflow(order.workflow)
    result = rt.store.create_order(order, workflow, actor=rt.actor("intake"))
    if isinstance(result, AlreadyExists) and not result.same_payload:
        rt.alert(
            OperatorAlert(
                order_id=order.order_id,
                severity="error",
                reason="conflicting_submission",
                detail=(
                    f"order {order.order_id} already exists with a different payload "
                    f"(stored hash {result.existing_payload_hash[:12]}, submitted "
                    f"{order.content_hash()[:12]}); the new submission was not applied. "
                    "Submit changes under a new order id."
                ),
                raw_excerpt=excerpt(body),
                source=rt.actor("intake"),
            )
        )
        return
    process = result.process
    if isinstance(result, AlreadyExists):
        log.info("order %s: duplicate submission; state %s", order.order_id, process.state)
    if process.timeline_seq == 0:  # also a redelivery after a crash before "received" was sent
        process = publish(rt, process, Status("received", detail=f"workflow {workflow.name}"))
    if process.state is ProcessState.PENDING and process.locked_by is None:
        claim_and_dispatch(process, order, rt)
