"""Helpers for tests that stage the pattern message by message (fixtures: see
tests/integration/conftest.py)."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

from agent.handler import handle_request
from core.messages import OrderSubmitted
from core.runtime import Runtime
from devstack.fakes.remote_services import FakeServices
from scheduler.commands import handle_command
from scheduler.replies import handle_response
from tests.support.app import QueueReader

UNDO_OF = {"reserve": "release", "charge": "refund", "create": "cancel"}


def new_order(**overrides: Any) -> OrderSubmitted:
    fields = {
        "order_id": f"o-{uuid.uuid4().hex[:12]}",
        "customer_id": "c-1",
        "items": [{"sku": "SKU-1", "quantity": 2, "unit_price_cents": 1250}],
        "currency": "EUR",
    }
    return OrderSubmitted.model_validate(fields | overrides)


def queue(rt: Runtime, role: str) -> str:
    return rt.settings.queue(role)


def take_request(rt: Runtime, reader: QueueReader, order_id: str, service: str) -> dict:
    return json.loads(reader.expect(queue(rt, service), order_id))


def run_agent_step(rt: Runtime, reader: QueueReader, order_id: str, service: str) -> dict:
    """Deliver the next request of ``service`` to its agent and the reply to the Scheduler."""
    request = reader.expect(queue(rt, service), order_id)
    handle_request(request, service, rt)
    handle_response(reader.expect(queue(rt, "responses"), order_id), rt)
    return json.loads(request)


def run_command(rt: Runtime, reader: QueueReader, order_id: str) -> None:
    handle_command(reader.expect(queue(rt, "commands"), order_id), rt)


def effects(fakes: FakeServices, order_id: str) -> list[tuple[str, str, str]]:
    """(service, operation, idempotency key) of each effect applied for ``order_id``."""
    return [
        (e["service"], e["operation"], e["idempotency_key"])
        for e in fakes.ledger()
        if e["order_id"] == order_id
    ]


def net_effects(fakes: FakeServices, order_id: str) -> dict[str, int]:
    """Per service: forward effects minus their undos (0: everything was undone)."""
    net: Counter[str] = Counter()
    for service, operation, _ in effects(fakes, order_id):
        net[service] += 1 if operation in UNDO_OF else -1
    return dict(net)


def alerts_for(rt: Runtime, reader: QueueReader, order_id: str, wait: float = 1.0) -> list[dict]:
    """Every alert about ``order_id`` now on the alerts queue (taken off it)."""
    found = []
    while (raw := reader.take(queue(rt, "alerts"), order_id, wait=wait)) is not None:
        found.append(json.loads(raw))
    return found
