"""Agent replies: record the step, dispatch the next one, or finish the order.

Only a reply for the step, direction and attempt in flight is applied; a late reply (an attempt
the Supervisor already gave up on) is logged and dropped, so it never changes state. Each
transition is one ETag-conditional write; if another instance changed the order meanwhile, the
reply is re-evaluated against the fresh record.
"""

from __future__ import annotations

import logging

from core.messages import AgentResponse, BadMessage, OperatorAlert, parse_message
from core.runtime import Runtime
from core.state_models import ConcurrencyConflict, OrderNotFound, StaleResult
from scheduler.dispatch import send_step
from supervisor.recovery import retry_or_fail

log = logging.getLogger("scheduler.replies")

MAX_CONFLICT_RETRIES = 3


def handle_response(body: bytes | str, rt: Runtime) -> None:
    try:
        response = parse_message(body, AgentResponse)
    except BadMessage as bad:
        rt.alert(bad.to_alert(source=rt.actor("replies")))
        return
    for _ in range(MAX_CONFLICT_RETRIES):
        try:
            _apply(response, rt)
            return
        except ConcurrencyConflict:
            log.info("order %s changed while applying a reply; re-reading", response.order_id)
    log.warning("order %s: gave up applying a reply after repeated conflicts", response.order_id)


def _apply(response: AgentResponse, rt: Runtime) -> None:
    try:
        order = rt.store.get_order(response.order_id)
    except OrderNotFound:
        rt.alert(
            OperatorAlert(
                order_id=response.order_id,
                severity="warning",
                reason="reply_for_unknown_order",
                detail=f"a {response.outcome} reply for step {response.step} names no order",
                source=rt.actor("replies"),
            )
        )
        return
    process = order.process
    workflow = rt.workflow(process.workflow)
    if response.step not in workflow.step_names:
        rt.alert(
            OperatorAlert(
                order_id=response.order_id,
                severity="error",
                reason="bad_message",
                detail=(
                    f"reply names step {response.step!r}, which workflow {workflow.name} does "
                    f"not have ({', '.join(workflow.step_names)}); not applied"
                ),
                source=rt.actor("replies"),
            )
        )
        return
    try:
        rt.store.ensure_current(process, response)
    except StaleResult as stale:
        log.info("late reply dropped: %s", stale)
        return
    actor = rt.actor("scheduler")
    if response.outcome == "succeeded":
        following = workflow.next_step(response.step)
        if following is None:
            rt.store.mark_processed(process, actor=actor, response=response)
            log.info("order %s processed", process.order_id)
            return
        advanced = rt.store.advance(
            process,
            response,
            next_step=following,
            complete_by=rt.clock() + following.complete_by_budget,
            actor=actor,
        )
        send_step(advanced, following, order.details, rt)
        return
    reason = f"{response.step} failed: {response.error_code}: {response.error_message}"
    if response.transient:
        retry_or_fail(process, reason, rt, actor=actor)
        return
    rt.store.mark_error(process, actor=actor, reason=reason, response=response)
    rt.alert(
        OperatorAlert(
            order_id=process.order_id,
            severity="error",
            reason="step_declined",
            detail=f"{reason}. The order is in Error; resubmit it once the cause is fixed.",
            source=actor,
        )
    )
