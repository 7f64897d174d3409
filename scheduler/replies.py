"""Agent replies: record the step, dispatch the next one, finish the order, or compensate.

Only a reply for the step, direction and attempt in flight is applied; a late reply (an attempt
the Supervisor already gave up on) is logged and dropped, so it never changes state. Each
transition is one ETag-conditional write; if another instance changed the order meanwhile, the
reply is re-evaluated against the fresh record.
"""

from __future__ import annotations

import logging

from core.messages import AgentResponse, BadMessage, OperatorAlert, parse_message
from core.runtime import Runtime
from core.state_models import ConcurrencyConflict, OrderNotFound, OrderRecord, StaleResult
from scheduler import compensation
from scheduler.dispatch import send_step
from scheduler.status import Status, publish
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
    if response.operation == "undo":
        _apply_undo(order, response, rt, actor)
    elif response.outcome == "succeeded":
        _apply_success(order, response, rt, actor)
    else:
        _apply_failure(order, response, rt, actor)


def _apply_success(order: OrderRecord, response: AgentResponse, rt: Runtime, actor: str) -> None:
    process = order.process
    if process.cancel_requested_by is not None:
        compensation.start(
            rt,
            order,
            process,
            cause=compensation.CANCELLED,
            reason=process.compensation_reason or f"cancelled by {process.cancel_requested_by}",
            actor=actor,
            include_in_flight=False,
            claim=True,
            response=response,
        )
        return
    following = rt.workflow(process.workflow).next_step(response.step)
    completed = Status("step_completed", step=response.step)
    if following is None:
        done = rt.store.mark_processed(process, actor=actor, response=response)
        log.info("order %s processed", process.order_id)
        publish(rt, done, completed, Status("processed"))
        return
    advanced = rt.store.advance(
        process,
        response,
        next_step=following,
        complete_by=rt.clock() + following.complete_by_budget,
        actor=actor,
    )
    send_step(advanced, following, order.details, rt)
    publish(rt, advanced, completed, Status("step_started", step=following.name))


def _apply_failure(order: OrderRecord, response: AgentResponse, rt: Runtime, actor: str) -> None:
    process = order.process
    reason = f"{response.step} failed: {response.error_code}: {response.error_message}"
    if response.transient:
        retry_or_fail(process, reason, rt, actor=actor, claim=True, order=order)
        return
    if process.cancel_requested_by is not None:
        cause, why = compensation.CANCELLED, f"{process.compensation_reason}; {reason}"
    else:
        cause, why = "step_declined", reason
    compensation.start(
        rt,
        order,
        process,
        cause=cause,
        reason=why,
        actor=actor,
        include_in_flight=False,
        claim=True,
        response=response,
    )


def _apply_undo(order: OrderRecord, response: AgentResponse, rt: Runtime, actor: str) -> None:
    process = order.process
    if response.outcome == "succeeded":
        compensation.undo_succeeded(rt, order, process, response, actor)
        return
    reason = f"undo of {response.step} failed: {response.error_code}: {response.error_message}"
    if response.transient:
        retry_or_fail(process, reason, rt, actor=actor, claim=True, order=order)
        return
    compensation.give_up(rt, process, order.steps, reason=reason, actor=actor, response=response)
