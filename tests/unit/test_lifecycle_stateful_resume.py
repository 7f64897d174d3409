"""The stateful lifecycle exploration (test_lifecycle_stateful) with agents that echo the order's
snapshot (service.resume), as the real agent does, so that replies are applied without a read.
Answers to requests never asked for carry the order's latest snapshot too.

Everything that test explores - lost, late, duplicated and reordered replies, deadlines, the
Supervisor's releases, cancels, resubmits, crashes between any write and any send - now meets
replies whose snapshot is stale, and the same invariants must hold after every step. Some
agents answer without a snapshot (one deployed before them) or with another order's, which
must be ignored.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, settings

import tests.unit.test_lifecycle_stateful as plain
from domain.messages import AgentRequest, AgentResponse
from tests.support.world import QUEUES, World

pytestmark = pytest.mark.timeout(900)


class EchoingWorld(World):
    """Agents echo the request's snapshot; one reply in ten carries none, one in ten that of
    the last other order seen."""

    def __init__(self) -> None:
        super().__init__()
        self._rng = random.Random(7)
        self._last: dict[str, str] = {}

    async def _reply(self, request: AgentRequest, outcome: str, code: str | None = None) -> None:
        sent = len(self.bus.sent)
        await super()._reply(request, outcome, code)
        if len(self.bus.sent) == sent:
            return  # a duplicate: dropped by the bus
        last = self.bus.sent[-1]
        assert last.queue == QUEUES["responses"] and isinstance(last.message, AgentResponse)
        echoed = self._echo(request)
        self.bus.sent[-1] = type(last)(
            last.queue, last.message.model_copy(update={"resume": echoed}), last.scheduled_at
        )

    def _resume_of(self, order_id: str) -> str | None:
        """A lie carries the order's latest snapshot, as if it answered the request sent last."""
        return self._last.get(order_id)

    def _echo(self, request: AgentRequest) -> str | None:
        if request.resume is not None:
            self._last[request.order_id] = request.resume
        draw = self._rng.random()
        if draw < 0.1:
            return None
        if draw < 0.2:
            others = [t for order, t in self._last.items() if order != request.order_id]
            return others[-1] if others else None
        return request.resume


class EchoingLifecycle(plain.Lifecycle):
    def __init__(self) -> None:
        super().__init__()
        self.world = EchoingWorld()


EchoingLifecycle.TestCase.settings = settings(
    max_examples=int(os.environ.get("LIFECYCLE_EXAMPLES", "1000")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_lifecycle_with_snapshots = EchoingLifecycle.TestCase
