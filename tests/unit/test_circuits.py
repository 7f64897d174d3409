"""Circuit rows and the overview's per-agent view (adapters.store.circuits), and how the breaker
reports
its transitions (service.circuit): only transitions, from a task of their own off the calling
path, never failing the call."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters import metrics
from adapters.store import circuit_overview, circuits
from adapters.store.circuit_overview import (
    DROP_AFTER,
    STALE_GRACE,
    Shown,
    effective_state,
    overview,
)
from adapters.store.circuits import CircuitRow, CircuitState
from domain import ids
from service import circuit
from service.circuit import (
    BreakerSettings,
    BreakerState,
    CircuitBreaker,
    CircuitReporter,
    Transition,
)

pytestmark = pytest.mark.anyio

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)


def row(
    agent: str = "payment",
    instance: str = "host.1",
    state: CircuitState = CircuitState.CLOSED,
    *,
    since_s: float = 60,
    retry_in_s: float | None = None,
    updated_s: float | None = None,
    failures: int = 0,
) -> CircuitRow:
    return CircuitRow(
        agent=agent,
        instance=instance,
        state=state,
        since=NOW - timedelta(seconds=since_s),
        consecutive_failures=failures,
        retry_at=None if retry_in_s is None else NOW + timedelta(seconds=retry_in_s),
        updated_at=NOW - timedelta(seconds=since_s if updated_s is None else updated_s),
    )


# ------------------------------------------------------------------------------ the rows


def test_a_row_round_trips_through_its_entity():
    original = row(state=CircuitState.OPEN, retry_in_s=30, failures=5)
    entity = circuits.to_entity(original)
    assert entity["PartitionKey"] == "circuits"
    assert entity["RowKey"] == "payment:host.1"
    assert circuit_overview.from_entity(entity, "etag-1") == _with_etag(original, "etag-1")


def _fields(value: CircuitRow) -> dict:
    return {name: getattr(value, name) for name in value.__slots__}  # type: ignore[attr-defined]


def _with_etag(value: CircuitRow, etag: str) -> CircuitRow:
    return CircuitRow(**{**_fields(value), "etag": etag})


def test_hostile_agent_or_instance_names_never_become_keys():
    with pytest.raises(ids.InvalidId, match="agent"):
        row(agent="pay' or PartitionKey ne '")
    with pytest.raises(ids.InvalidId, match="instance id"):
        row(instance="a/b#c")
    with pytest.raises(ids.InvalidId):
        circuits.row_key("payment", "")


def test_an_unreadable_entity_says_which_row():
    with pytest.raises(circuit_overview.BadCircuitRow, match="payment:x"):
        circuit_overview.from_entity({"RowKey": "payment:x", "Agent": "payment", "State": "ajar"})


def test_instance_id_is_the_azure_instance_else_host_and_pid():
    assert circuits.instance_id({"WEBSITE_INSTANCE_ID": "ab12cd"}) == "ab12cd"
    local = circuits.instance_id({})
    assert local.endswith(f".{__import__('os').getpid()}")
    assert ids.validate_instance_id(local) == local


# ------------------------------------------------------------------------- what a row says


def test_open_until_retry_at_then_half_open_then_stale():
    opened = row(state=CircuitState.OPEN, retry_in_s=10)
    assert effective_state(opened, NOW) is Shown.OPEN
    assert effective_state(opened, NOW + timedelta(seconds=11)) is Shown.HALF_OPEN
    late = NOW + timedelta(seconds=10) + STALE_GRACE + timedelta(seconds=1)
    assert effective_state(opened, late) is Shown.STALE


def test_half_open_is_believed_for_the_grace_after_its_write():
    trial = row(state=CircuitState.HALF_OPEN, since_s=5)
    assert effective_state(trial, NOW) is Shown.HALF_OPEN
    assert effective_state(trial, NOW + STALE_GRACE) is Shown.STALE


def test_a_closed_row_stays_closed_however_old():
    assert effective_state(row(since_s=10 * 86400), NOW) is Shown.CLOSED


def test_the_worst_current_state_across_instances_wins():
    rows = [
        row(instance="a.1"),
        row(instance="b.2", state=CircuitState.OPEN, since_s=20, retry_in_s=10, failures=5),
        row(instance="c.3", state=CircuitState.OPEN, since_s=40, retry_in_s=3, failures=6),
        row(instance="d.4", state=CircuitState.HALF_OPEN, since_s=1000, updated_s=1000),  # stale
    ]
    [inventory, payment, *_] = overview(rows, NOW, ["inventory", "payment", "shipping"])
    assert inventory.state is None and inventory.instances == 0
    assert payment.state is Shown.OPEN
    assert payment.since == NOW - timedelta(seconds=40)
    assert payment.retry_at == NOW + timedelta(seconds=3)
    assert (payment.instances, payment.stale) == (3, 1)
    assert payment.by_state == {"closed": 1, "open": 2}
    assert payment.consecutive_failures == 6
    assert payment.as_dict()["since"].endswith("Z")


def test_expired_rows_are_left_out_and_agents_not_in_the_catalog_are_still_shown():
    rows = [
        row(instance="gone.1", state=CircuitState.OPEN, since_s=DROP_AFTER.total_seconds() + 60),
        row(agent="legacy", instance="x.1", state=CircuitState.CLOSED),
    ]
    shown = {a.agent: a for a in overview(rows, NOW, ["payment"])}
    assert shown["payment"].state is None and shown["payment"].stale == 0
    assert shown["legacy"].state is Shown.CLOSED
    assert circuit_overview.expired(rows[0], NOW) and not circuit_overview.expired(rows[1], NOW)


rows_strategy = st.lists(
    st.builds(
        row,
        agent=st.sampled_from(["inventory", "payment"]),
        instance=st.sampled_from(["a.1", "b.2", "c.3"]),
        state=st.sampled_from(list(CircuitState)),
        since_s=st.floats(0, 200_000),
        retry_in_s=st.one_of(st.none(), st.floats(-1000, 1000)),
        failures=st.integers(0, 50),
    ),
    max_size=12,
)


@given(rows_strategy)
def test_overview_counts_every_kept_row_once_and_shows_the_worst(rows):
    severity = {Shown.CLOSED: 0, Shown.HALF_OPEN: 1, Shown.OPEN: 2}
    for agent in overview(rows, NOW, ["inventory", "payment"]):
        kept = [r for r in rows if r.agent == agent.agent and not circuit_overview.expired(r, NOW)]
        states = [effective_state(r, NOW) for r in kept]
        current = [s for s in states if s is not Shown.STALE]
        assert agent.instances + agent.stale == len(kept)
        assert sum(agent.by_state.values()) == agent.instances
        if current:
            assert agent.state is max(current, key=severity.__getitem__)
            assert agent.since is not None
        else:
            assert agent.state is None and agent.since is None


# ------------------------------------------------------------------ the breaker's reports


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_only_transitions_are_reported_never_calls():
    heard: list[Transition] = []
    clock = Clock()
    breaker = CircuitBreaker(
        "payment",
        BreakerSettings(failure_threshold=2, reset_timeout=30),
        clock=clock,
        now=lambda: NOW,
        on_transition=heard.append,
    )
    for _ in range(5):
        assert breaker.acquire()
        breaker.record_success()
    assert heard == []
    breaker.acquire()
    breaker.record_failure()
    assert heard == []
    breaker.acquire()
    breaker.record_failure()
    assert [(t.old, t.new) for t in heard] == [(BreakerState.CLOSED, BreakerState.OPEN)]
    assert heard[0].retry_at == NOW + timedelta(seconds=30)
    assert heard[0].consecutive_failures == 2
    assert not breaker.acquire() and len(heard) == 1  # refused calls report nothing
    clock.t = 31
    assert breaker.acquire()  # half-open: the trial
    breaker.record_success()
    assert [t.new for t in heard] == [
        BreakerState.OPEN,
        BreakerState.HALF_OPEN,
        BreakerState.CLOSED,
    ]
    assert heard[-1].consecutive_failures == 0 and heard[-1].retry_at is None


def test_a_failing_listener_never_fails_the_call_and_may_read_the_breaker(caplog):
    seen: list[BreakerState] = []

    def listener(transition: Transition) -> None:
        seen.append(breaker.state)  # called after the lock is released: no deadlock
        raise RuntimeError("listener broke")

    breaker = CircuitBreaker(
        "payment", BreakerSettings(failure_threshold=1), on_transition=listener
    )
    breaker.acquire()
    breaker.record_failure()  # does not raise
    assert seen == [BreakerState.OPEN]
    assert "transition listener failed" in caplog.text


class FakeTable:
    def __init__(self, *, fail: bool = False, gate: asyncio.Event | None = None) -> None:
        self.rows: list[CircuitRow] = []
        self.fail = fail
        self.gate = gate
        self.entered = asyncio.Event()

    async def record(self, value: CircuitRow) -> None:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise ConnectionError("table storage is down\nsecond line")
        self.rows.append(value)


def where(table: FakeTable | None) -> Callable[[], FakeTable | None]:
    """The reporter's ``table()``: where to write."""
    return lambda: table


def reporter_on(table: FakeTable | None) -> CircuitReporter:
    return CircuitReporter(where(table), "host.1")  # type: ignore[arg-type]


_seq = iter(range(1, 10**6))


def transition(new: BreakerState, service: str = "payment", seq: int | None = None) -> Transition:
    return Transition(service, BreakerState.CLOSED, new, NOW, 5, None, seq or next(_seq))


async def test_the_reporter_writes_off_the_calling_path_and_never_waits_for_storage():
    gate = asyncio.Event()
    table = FakeTable(gate=gate)
    reporter = reporter_on(table)
    reporter.submit(transition(BreakerState.OPEN))  # the writer blocks on the gate...
    await asyncio.wait_for(table.entered.wait(), 30)
    for state in (BreakerState.HALF_OPEN, BreakerState.OPEN, BreakerState.HALF_OPEN):
        reporter.submit(transition(state))  # ...and submitting does not wait for it
    assert not await reporter.flush(timeout=0.2)
    gate.set()
    assert await reporter.flush(timeout=30)
    # What waited while the first write hung was coalesced to the latest state.
    assert [r.state for r in table.rows] == [CircuitState.OPEN, CircuitState.HALF_OPEN]
    assert all(r.instance == "host.1" for r in table.rows)


async def test_a_failed_write_is_logged_and_the_next_transition_writes_again(caplog):
    table = FakeTable(fail=True)
    reporter = reporter_on(table)
    reporter.submit(transition(BreakerState.OPEN))
    assert await reporter.flush(timeout=30)
    assert reporter.failed == 1 and "not recorded for the dashboard" in caplog.text
    assert "second line" not in caplog.text
    table.fail = False
    reporter.submit(transition(BreakerState.CLOSED))
    assert await reporter.flush(timeout=30)
    assert [r.state for r in table.rows] == [CircuitState.CLOSED]


async def test_nowhere_to_write_is_not_an_error():
    reporter = reporter_on(None)
    reporter.submit(transition(BreakerState.OPEN))
    assert await reporter.flush(timeout=30)
    assert (reporter.written, reporter.failed) == (0, 0)


async def test_a_transition_heard_after_a_later_one_is_dropped():
    table = FakeTable()
    reporter = reporter_on(table)
    assert reporter.submit(transition(BreakerState.HALF_OPEN, seq=2))
    assert not reporter.submit(transition(BreakerState.OPEN, seq=1))  # the other thread, late
    assert reporter.submit(transition(BreakerState.OPEN, service="shipping", seq=1))
    assert await reporter.flush(timeout=30)
    assert sorted((r.agent, r.state) for r in table.rows) == [
        ("payment", CircuitState.HALF_OPEN),
        ("shipping", CircuitState.OPEN),
    ]


async def test_a_transition_told_on_a_thread_without_a_loop_waits_for_the_next_writer():
    table = FakeTable()
    reporter = reporter_on(table)
    told = threading.Thread(target=reporter.submit, args=(transition(BreakerState.OPEN),))
    told.start()
    told.join()
    await asyncio.sleep(0.05)
    assert table.rows == []  # no loop there to write it on: it waits...
    assert await reporter.flush(timeout=30)  # ...and is written by the next writer
    assert [r.state for r in table.rows] == [CircuitState.OPEN]


async def test_a_write_cut_off_by_its_loop_closing_is_not_lost():
    hung = FakeTable(gate=asyncio.Event())  # never opened: the write hangs until cancelled
    reporter = reporter_on(hung)

    async def transition_then_close() -> None:
        reporter.submit(transition(BreakerState.OPEN))
        await hung.entered.wait()

    await asyncio.to_thread(asyncio.run, transition_then_close())  # cancels the writer
    table = FakeTable()
    reporter._table = where(table)
    assert await reporter.flush(timeout=30)
    assert [r.state for r in table.rows] == [CircuitState.OPEN]


def test_the_process_breakers_set_the_metric_and_queue_the_row(monkeypatch):
    recorded: list[tuple[str, str]] = []
    queued: list[Transition] = []
    monkeypatch.setattr(metrics, "record_circuit_state", lambda a, s: recorded.append((a, s)))
    reporter = reporter_on(None)
    monkeypatch.setattr(reporter, "submit", lambda t: queued.append(t) or True)
    registry = circuit.BreakerRegistry(BreakerSettings(failure_threshold=1), reporter=reporter)
    breaker = registry.get("shipping")
    breaker.acquire()
    breaker.record_failure()
    registry.reset_all()
    assert recorded == [("shipping", "open"), ("shipping", "closed")]
    assert [t.new for t in queued] == [BreakerState.OPEN, BreakerState.CLOSED]
