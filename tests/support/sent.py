"""Agent requests as the Scheduler sends them: each with the snapshot of an order whose outbox
holds it (service.resume), so an agent's check of the request against its order passes."""

from __future__ import annotations

from dataclasses import replace

from domain.events import Context
from domain.lifecycle import submit
from domain.messages import AgentRequest, OrderSubmitted
from domain.order import Outgoing
from domain.workflows import ORDER_WORKFLOW
from service import resume

ETAG = "W/\"datetime'2030-01-01T12%3A00%3A00Z'\""


def as_sent(request: AgentRequest, agent: str = "payment") -> AgentRequest:
    """``request`` with the snapshot of an order (as stored, ETag included) that owes it."""
    submitted = OrderSubmitted(
        order_id=request.order_id,
        customer_id="c-1",
        items=[{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 2500}],
        currency="EUR",
    )
    ctx = Context(workflow=ORDER_WORKFLOW, now=request.requested_at, actor="scheduler:test")
    created = submit(submitted, ctx).order
    assert created is not None
    stored = replace(created, outbox=(Outgoing(agent, request),), etag=ETAG)
    token = resume.snapshot(stored)
    assert token is not None, "too large for a snapshot"
    return request.model_copy(update={"resume": token})
