"""The invocation's deadline (adapters.deadline) and who states it (service.deadlines): a
message's handler, bounded by its lock (host.json's renewal, less the time to settle it); a
Supervisor tick, by its claim; a purge run, by its budget and a grace; a circuit row's write,
by a bound of its own whatever started its writer. The Table client enforcing it:
tests/unit/test_tables_outcomes.py; against Azurite: tests/integration/test_table_deadlines.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.functions.servicebus import ServiceBusMessage as FunctionMessage

from adapters import deadline
from adapters.settings import Connection, Settings
from agent import functions as agent_functions
from devstack.memory import MemoryBus, MemoryStore
from devstack.stack.processes import REPO_ROOT
from domain.agents import AGENTS
from scheduler import functions as scheduler_functions
from service import circuit, deadlines, inbound
from service.purge import PurgeRequest, run_purge
from service.runtime import Runtime
from service.sweep import run_tick
from tests.support.world import QUEUES

pytestmark = pytest.mark.anyio

MESSAGE_BOUND = (deadlines.MESSAGE_LOCK_RENEWAL - deadlines.SETTLE_MARGIN).total_seconds()


def settings() -> Settings:
    return Settings(
        queues=QUEUES, service_urls={}, servicebus=Connection("sb"), storage=Connection("st")
    )


# ------------------------------------------------------------------------------ the bound


async def test_a_bound_ends_with_the_enclosing_one_unless_detached() -> None:
    assert deadline.remaining() is None
    with deadline.within(10):
        outer = deadline.remaining()
        assert outer is not None and 0 < outer <= 10
        with deadline.within(60):
            inner = deadline.remaining()
            assert inner is not None and inner <= 10, "no longer than the enclosing bound"
        with deadline.within(2):
            assert deadline.remaining() <= 2  # type: ignore[operator]
        with deadline.within(60, detached=True):
            assert deadline.remaining() > 10  # type: ignore[operator]
        assert deadline.remaining() <= 10  # type: ignore[operator]
    assert deadline.remaining() is None


async def test_the_tasks_an_invocation_starts_inherit_its_bound() -> None:
    with deadline.within(5):
        left = await asyncio.create_task(_remaining())
    assert left is not None and 0 < left <= 5
    assert await asyncio.create_task(_remaining()) is None


async def _remaining() -> float | None:
    return deadline.remaining()


# -------------------------------------------------------------------- who states the bound


def test_the_message_bound_is_host_jsons_lock_renewal_less_the_time_to_settle() -> None:
    host = json.loads((REPO_ROOT / "host.json").read_text())
    renewal = host["extensions"]["serviceBus"]["maxAutoLockRenewalDuration"]
    parts = re.fullmatch(r"(\d+):(\d+):(\d+)", renewal)
    assert parts is not None, renewal
    hours, minutes, seconds = (int(part) for part in parts.groups())
    held = timedelta(hours=hours, minutes=minutes, seconds=seconds)
    assert held == deadlines.MESSAGE_LOCK_RENEWAL
    assert timedelta(0) < deadlines.SETTLE_MARGIN < held


class Recorded:
    """What a handler saw of its bound."""

    def __init__(self) -> None:
        self.left: list[float | None] = []

    async def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.left.append(deadline.remaining())


def message() -> FunctionMessage:
    return FunctionMessage(
        body=b"{}", message_id="m-1", application_properties={}, user_properties={}
    )


async def test_every_service_bus_trigger_handles_its_message_within_its_lock(monkeypatch) -> None:
    seen = Recorded()
    for name in ("handle_submission", "handle_response", "handle_command"):
        monkeypatch.setattr(scheduler_functions, name, seen)
    monkeypatch.setattr(agent_functions, "handle_request", seen)

    async def trusted(rt: Any, delivery: inbound.Delivery, *args: Any) -> bytes:
        return delivery.body

    monkeypatch.setattr(inbound, "trusted_body", trusted)
    rt = Runtime(settings(), MemoryStore(), MemoryBus(), {})  # type: ignore[arg-type]
    await scheduler_functions.on_submission(message(), rt)
    await scheduler_functions.on_reply(message(), rt)
    await scheduler_functions.on_command(message(), rt)
    await agent_functions.on_request(message(), AGENTS[0], rt)
    assert len(seen.left) == 4
    assert all(left is not None and 0 < left <= MESSAGE_BOUND for left in seen.left), seen.left
    assert deadline.remaining() is None, "the bound ends with the handler"


async def test_a_tick_is_bounded_by_its_claim_or_by_a_longer_budget_given(monkeypatch) -> None:
    config = settings()
    claim = config.supervisor_claim.total_seconds()
    slack = claim - config.supervisor_budget.total_seconds()
    store = MemoryStore()
    seen = Recorded()
    real_read = store.supervision.read

    async def read() -> Any:
        await seen()
        return await real_read()

    monkeypatch.setattr(store.supervision, "read", read)
    rt = Runtime(config, store, MemoryBus(), config.workflows())  # type: ignore[arg-type]
    await run_tick(rt)
    await run_tick(rt, budget_s=0.0)
    await run_tick(rt, budget_s=100.0)
    assert all(left is not None for left in seen.left)
    first, nothing, longer = seen.left
    assert deadlines.TICK_FLOOR.total_seconds() < claim, "the default schedule's claim"
    assert 0 < first <= claim and 0 < nothing <= claim  # type: ignore[operator]
    assert claim < longer <= 100 + slack  # type: ignore[operator]


async def test_a_tick_on_a_schedule_of_seconds_is_bounded_by_the_floor(monkeypatch) -> None:
    config = dataclasses.replace(settings(), supervisor_schedule="*/1 * * * * *")
    store = MemoryStore()
    seen = Recorded()
    real_read = store.supervision.read

    async def read() -> Any:
        await seen()
        return await real_read()

    monkeypatch.setattr(store.supervision, "read", read)
    await run_tick(Runtime(config, store, MemoryBus(), config.workflows()))  # type: ignore[arg-type]
    [left] = seen.left
    floor = deadlines.TICK_FLOOR.total_seconds()
    assert config.supervisor_claim.total_seconds() < left <= floor  # type: ignore[operator]


class Candidates:
    """A purge store that has nothing to purge, and records its bound when asked."""

    def __init__(self) -> None:
        self.left: list[float | None] = []
        self.purges = self

    async def purge_candidates(self, *args: Any) -> Any:
        self.left.append(deadline.remaining())
        for candidate in ():
            yield candidate

    async def record(self, *args: Any) -> None:
        self.left.append(deadline.remaining())


async def test_a_purge_run_is_bounded_by_its_budget_and_a_grace() -> None:
    store = Candidates()
    request = PurgeRequest(
        older_than=timedelta(days=1), requested_by="t", budget=timedelta(seconds=10)
    )
    await run_purge(store, None, request, clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))  # type: ignore[arg-type]
    bound = (timedelta(seconds=10) + deadlines.PURGE_GRACE).total_seconds()
    assert len(store.left) == 2
    assert all(left is not None and 10 < left <= bound for left in store.left), store.left


async def test_a_circuit_row_write_has_a_bound_of_its_own(monkeypatch) -> None:
    """The writer task inherits the bound of the invocation that started it, and goes on
    serving later ones: each write gets its own."""
    written = Recorded()

    class Table:
        record = written

    reporter = circuit.CircuitReporter(lambda: Table(), "host.1")  # type: ignore[arg-type,return-value]
    opened = circuit.BreakerState.OPEN
    transition = circuit.Transition(
        "payment", circuit.BreakerState.CLOSED, opened, datetime.now(UTC), 5, None
    )
    with deadline.within(0):  # an invocation out of time starts the writer
        reporter.submit(transition)
    assert await reporter.flush(timeout=5)
    [left] = written.left
    assert left is not None and 0 < left <= circuit.ROW_WRITE_S
