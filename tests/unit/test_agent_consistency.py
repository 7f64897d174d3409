"""The agent's check of a request against the order snapshot it carries (service.consistency):
pure, on orders the lifecycle makes and requests as they come off the wire."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from domain.events import Context, Replied
from domain.lifecycle import decide, submit
from domain.messages import AgentRequest, AgentResponse, OrderSubmitted, encode, parse_message
from domain.operator_actions import Cancel, act
from domain.order import Order
from domain.workflows import ORDER_WORKFLOW
from service import resume
from service.consistency import disagreement

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ctx(at: float) -> Context:
    return Context(workflow=ORDER_WORKFLOW, now=T0 + timedelta(seconds=at), actor="scheduler:a")


def stored(order: Order | None, version: int) -> Order:
    """``order`` as the store hands it back after writing it: with an ETag."""
    assert order is not None
    return replace(order, etag=f'W/"{version}"')


def on_the_wire(order: Order) -> AgentRequest:
    """The one request ``order`` owes, sent with its snapshot, as the agent parses it."""
    [request] = [o.message for o in order.outbox if isinstance(o.message, AgentRequest)]
    sent = request.model_copy(update={"resume": resume.snapshot(order)})
    return parse_message(encode(sent), AgentRequest)


def succeeded(request: AgentRequest) -> AgentResponse:
    return AgentResponse(
        order_id=request.order_id,
        step=request.step,
        operation=request.operation,
        attempt=request.attempt,
        idempotency_key=request.idempotency_key,
        outcome="succeeded",
    )


def orders() -> list[Order]:
    """An order as stored after each write that sent a request: reserve, charge, then a cancel
    that undoes the charge and the reservation."""
    submitted = OrderSubmitted(
        order_id="o-1",
        customer_id="c-1",
        items=[{"sku": "SKU-1", "quantity": 2, "unit_price_cents": 250}],
        currency="EUR",
        reply_to="client-replies",
    )
    order = stored(submit(submitted, ctx(0)).order, 1)
    written = [order]
    order = stored(decide(order, Replied(succeeded(on_the_wire(order))), ctx(2)).order, 2)
    written.append(order)
    order = stored(act(order, Cancel("operator:bob", "fraud"), ctx(3)).order, 3)
    written.append(order)
    order = stored(decide(order, Replied(succeeded(on_the_wire(order))), ctx(9)).order, 9)
    return [*written, order]


def test_every_request_the_order_sent_agrees_with_the_snapshot_it_carries():
    sent = [on_the_wire(order) for order in orders()]
    assert [(r.operation, r.step) for r in sent] == [
        ("do", "reserve_inventory"),
        ("do", "charge_payment"),
        ("undo", "charge_payment"),
        ("undo", "reserve_inventory"),
    ]
    assert [disagreement(request) for request in sent] == [None] * 4


def test_a_request_carrying_another_writes_snapshot_disagrees():
    first, second, *_ = orders()
    mixed = on_the_wire(second).model_copy(update={"resume": on_the_wire(first).resume})
    assert disagreement(mixed) == (
        "its order's outbox holds no such request (it holds: do reserve_inventory attempt 1)"
    )


def test_a_request_changed_on_the_way_names_what_differs():
    request = on_the_wire(orders()[2])  # the refund of the charge
    changed = request.model_copy(update={"action": "charge", "payload": {"amount": 1}})
    assert disagreement(changed) == (
        "it differs in action, payload from the request its order put in its outbox"
    )


def test_a_request_without_a_snapshot_is_not_checked():
    request = on_the_wire(orders()[1]).model_copy(update={"resume": None, "attempt": 7})
    assert disagreement(request) is None


def test_a_snapshot_whose_outbox_request_is_malformed_cannot_be_read():
    request = on_the_wire(orders()[1])
    assert request.resume is not None
    packed = request.resume.removeprefix(resume.PREFIX)
    data = json.loads(base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4)))
    outbox = json.loads(data["e"]["Outbox"])
    for item in outbox:
        if item["type"] == "AgentRequest":
            item["message"]["attempt"] = "many"
    data["e"]["Outbox"] = json.dumps(outbox)
    text = json.dumps(data).encode()
    token = resume.PREFIX + base64.urlsafe_b64encode(text).rstrip(b"=").decode()
    assert disagreement(request.model_copy(update={"resume": token})) == (
        "the order snapshot it carries cannot be read or is another order's"
    )
