"""Claiming an order and sending its current step to the step's agent.

A claim is one ETag-conditional write (LockedBy, CompleteBy, Attempt + 1, Processing). Losing
the race (412) means another instance owns the order: stop, never retry blindly. A crash between
the claim and the send leaves the order Processing with nothing in flight; the Supervisor finds
it at CompleteBy and retries it.
"""

from __future__ import annotations

import logging

from core.messages import AgentRequest, OrderSubmitted
from core.runtime import Runtime
from core.state_models import ConcurrencyConflict, InvalidTransition, ProcessRecord
from core.workflows import Step
from scheduler.status import Status, publish

log = logging.getLogger("scheduler.dispatch")


def agent_payload(order: OrderSubmitted) -> dict:
    """What every remote service is told about the order (it needs no more)."""
    return {
        "order_id": order.order_id,
        "customer_id": order.customer_id,
        "currency": order.currency,
        "amount": order.total_cents,
        "items": [{"sku": item.sku, "qty": item.quantity} for item in order.items],
    }


def claim_and_dispatch(
    process: ProcessRecord, order: OrderSubmitted, rt: Runtime
) -> ProcessRecord | None:
    """Claim a Pending order (or a released compensation) and dispatch its current step.

    None if another instance won. A forward step reports ``step_started`` to the submitter.
    """
    workflow = rt.workflow(process.workflow)
    step = workflow.step_named(process.current_step or workflow.first_step.name)
    try:
        claimed = rt.store.claim(
            process,
            instance_id=rt.instance_id,
            complete_by=rt.clock() + step.complete_by_budget,
        )
    except ConcurrencyConflict:
        log.info("order %s: another instance claimed it first", process.order_id)
        return None
    except InvalidTransition as exc:
        log.info("order %s: not claimable: %s", process.order_id, exc)
        return None
    send_step(claimed, step, order, rt)
    if claimed.current_operation == "do":
        detail = f"attempt {claimed.attempt}" if claimed.failure_count else ""
        return publish(rt, claimed, Status("step_started", step=step.name, detail=detail))
    return claimed


def send_step(process: ProcessRecord, step: Step, order: OrderSubmitted, rt: Runtime) -> None:
    """Send the AgentRequest for the step and attempt the process record has in flight."""
    assert process.complete_by is not None
    operation = process.current_operation or "do"
    request = AgentRequest(
        order_id=process.order_id,
        step=step.name,
        operation=operation,
        action=step.action_for(operation),
        attempt=process.attempt,
        complete_by=process.complete_by,
        idempotency_key=step.idempotency_key(process.order_id, operation, process.generation),
        payload=agent_payload(order),
    )
    rt.bus.send(rt.settings.queue(step.agent), request)
    log.info(
        "order %s: %s %s sent to %s (attempt %d)",
        process.order_id,
        operation,
        step.name,
        step.agent,
        process.attempt,
    )
