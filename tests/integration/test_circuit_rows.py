"""The agents' circuit rows in the supervision table (adapters.store.circuits), against Azurite:
written by a Runtime's breakers on each transition, read (and reaped) by the dashboard's summary,
and invisible to the Supervisor's roster that shares the table."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from adapters.store import circuits
from adapters.store.circuit_overview import CircuitRows
from adapters.store.circuits import CircuitRow, CircuitState
from adapters.store.state_store import OrderStateStore
from adapters.tables import TableService
from domain.messages import utc_now
from service.circuit import BreakerRegistry, CircuitReporter
from service.operations.summary import Summary

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture
async def table(rt):
    await rt.store.ensure_tables()
    service = TableService.from_connection_string(rt.settings.storage.connection_string)
    client = service.get_table_client(rt.settings.supervision_table, owns_service=True)
    yield CircuitRows(client)
    await client.close()


async def test_rows_are_written_read_and_reaped_by_etag(rt, table):
    now = utc_now()
    old = CircuitRow(
        agent="payment",
        instance="gone.1",
        state=CircuitState.OPEN,
        since=now - timedelta(days=2),
        consecutive_failures=5,
        retry_at=now - timedelta(days=2) + timedelta(seconds=30),
        updated_at=now - timedelta(days=2),
    )
    live = dataclasses.replace(old, instance="live.2", since=now, updated_at=now, retry_at=None,
                               state=CircuitState.CLOSED, consecutive_failures=0)  # fmt: skip
    await table.record(old)
    await table.record(live)
    read = await table.read()
    assert {r.instance for r in read.rows} == {"gone.1", "live.2"}
    assert (read.unreadable, read.partial, read.requests) == (0, False, 1)
    stored_old = next(r for r in read.rows if r.instance == "gone.1")
    assert stored_old.retry_at == old.retry_at and stored_old.etag

    # The Supervisor's roster shares the table and never sees these rows.
    roster = await rt.store.supervision.read()
    assert roster.members == () and all(b.etag is None for b in roster.buckets)

    # Rewritten since it was read: the reaper leaves it.
    await table.record(dataclasses.replace(old, updated_at=now))
    assert await table.reap([stored_old]) == 0
    fresh = next(r for r in (await table.read()).rows if r.instance == "gone.1")
    assert await table.reap([fresh]) == 1
    assert {r.instance for r in (await table.read()).rows} == {"live.2"}


async def test_an_open_circuit_reaches_the_overview_and_its_close_too(rt, table):
    breakers = rt.breakers
    assert breakers.reporter is not None
    summary = Summary(lambda: rt)
    try:
        breaker = breakers.get("payment")
        for _ in range(breaker.settings.failure_threshold):
            assert breaker.acquire()
            breaker.record_failure()
        assert await breakers.reporter.flush(timeout=10)
        [written] = [r for r in (await table.read()).rows if r.agent == "payment"]
        assert written.instance == circuits.instance_id()
        assert (written.state, written.consecutive_failures) == (
            CircuitState.OPEN,
            breaker.settings.failure_threshold,
        )
        assert written.retry_at is not None and written.retry_at > written.since

        view = (await summary.snapshot())["circuits"]
        payment = next(a for a in view["agents"] if a["agent"] == "payment")
        assert (payment["state"], payment["instances"], payment["stale"]) == ("open", 1, 0)
        inventory = next(a for a in view["agents"] if a["agent"] == "inventory")
        assert inventory["state"] is None  # never changed state in this process

        breakers.reset_all()  # the operator's reset is a transition like any other
        assert await breakers.reporter.flush(timeout=10)
        [closed] = [r for r in (await table.read()).rows if r.agent == "payment"]
        assert closed.state is CircuitState.CLOSED and closed.consecutive_failures == 0
    finally:
        await summary.close()


async def test_an_unreachable_table_never_fails_the_call(rt, caplog):
    nowhere = rt.settings.storage.connection_string.replace("127.0.0.1:", "127.0.0.1:1")
    broken = OrderStateStore.from_connection_string(nowhere)
    reporter = CircuitReporter(lambda: broken.circuits, circuits.instance_id())
    breakers = BreakerRegistry(reporter=reporter)
    try:
        breaker = breakers.get("shipping")
        for _ in range(breaker.settings.failure_threshold):
            assert breaker.acquire()
            breaker.record_failure()  # returns at once: the write is the reporter's task's
        assert not breaker.acquire()
        assert await reporter.flush(timeout=60)
        assert "not recorded for the dashboard" in caplog.text
    finally:
        await broken.close()
