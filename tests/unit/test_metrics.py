"""The order metrics (adapters.metrics): recorded once per committed transition, in the shell, by
the app's real handlers on the in-memory world (tests/support/world.py). A duplicate, a lost
race and a redelivery after a crash record nothing more; with no meter provider bound, the hot
path builds nothing at all.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import service.sweep_report as supervisor_metrics
from adapters import metrics
from adapters.store.rows import ConcurrencyConflict
from domain.events import Replied
from domain.messages import AgentRequest
from domain.states import ProcessState
from service import apply
from tests.support.world import CLOCK_SKEW, FAULTS, QUEUES, World

pytestmark = pytest.mark.anyio

Points = dict[str, Counter[tuple[tuple[str, Any], ...]]]


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> InMemoryMetricReader:
    monkeypatch.setattr(metrics, "_bound", None)  # unbound again after the test
    found = InMemoryMetricReader()
    metrics.bind(MeterProvider(metric_readers=[found]))
    return found


def points(reader: InMemoryMetricReader) -> Points:
    """Per instrument, per attribute set: a counter's sum, a histogram's count."""
    found: Points = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    key = tuple(sorted(point.attributes.items()))
                    value = getattr(point, "count", None)
                    if value is None:
                        value = point.value
                    found.setdefault(metric.name, Counter())[key] += value
    return found


def total(found: Points, name: str, **attributes: str) -> float:
    wanted = set(attributes.items())
    return sum(v for k, v in found.get(name, Counter()).items() if wanted <= set(k))


def agent_requests(world: World) -> list[Any]:
    return [e for e in world.pending if isinstance(e.message, AgentRequest)]


async def run_clean(world: World, order_id: str) -> None:
    await world.submit(order_id)
    await world.drain()


def test_names_are_the_instruments_the_workbook_queries() -> None:
    assert {
        "orders.started",
        "orders.finished",
        "orders.failed",
        "step.duration",
        "step.retries",
        "agent.circuit.state",
    } == metrics.NAMES
    assert "supervisor.lag" in supervisor_metrics.NAMES
    assert not metrics.NAMES & supervisor_metrics.NAMES


async def test_a_clean_order_records_start_finish_and_one_duration_per_step(reader) -> None:
    world = World()
    await run_clean(world, "ORD-1")
    assert (await world.store.load("ORD-1")).state is ProcessState.PROCESSED
    found = points(reader)
    assert total(found, "orders.started", workflow="order") == 1
    assert total(found, "orders.finished", workflow="order") == 1
    assert "orders.failed" not in found and "step.retries" not in found
    steps = {dict(k)["step"] for k in found["step.duration"]}
    assert steps == {"reserve_inventory", "charge_payment", "create_shipment"}
    assert total(found, "step.duration", outcome="succeeded", operation="do") == 3


async def test_duration_runs_from_the_claim_to_the_reply_being_applied(reader) -> None:
    world = World()
    await world.submit("ORD-1")
    (request,) = agent_requests(world)
    await world.deliver(request)
    world.advance(4)  # the reply waits 4 s in its queue
    (reply,) = world.deliverable("responses")
    await world.deliver(reply)
    data = reader.get_metrics_data()
    histogram = next(
        m
        for r in data.resource_metrics
        for s in r.scope_metrics
        for m in s.metrics
        if m.name == "step.duration"
    )
    (point,) = histogram.data.data_points
    assert point.count == 1 and point.sum == pytest.approx(4.0)
    assert dict(point.attributes) == {
        "step": "reserve_inventory",
        "outcome": "succeeded",
        "operation": "do",
    }


async def test_duplicate_submission_and_duplicate_reply_record_nothing_more(reader) -> None:
    world = World()
    await world.submit("ORD-1")
    await world.submit("ORD-1")  # a redelivered submission
    (request,) = agent_requests(world)
    await world.deliver(request)
    (reply,) = world.deliverable("responses")
    await world.deliver(reply, keep=True)
    await world.deliver(reply)  # the same reply again
    found = points(reader)
    assert total(found, "orders.started") == 1
    assert total(found, "step.duration") == 1


async def test_a_crash_after_the_write_and_the_redelivery_record_once(reader) -> None:
    world = World()
    await world.submit("ORD-1")
    (request,) = agent_requests(world)
    await world.deliver(request)
    (reply,) = world.deliverable("responses")
    await world.deliver(reply, crash_after=0)  # written, then the sends failed: redelivered
    assert reply in world.pending
    await world.deliver(reply)
    assert total(points(reader), "step.duration") == 1


async def test_a_losing_writer_records_nothing(reader, monkeypatch: pytest.MonkeyPatch) -> None:
    world = World()
    await world.submit("ORD-1")
    (request,) = agent_requests(world)
    await world.deliver(request)
    (reply,) = world.deliverable("responses")

    async def lose(*_: Any, **__: Any) -> Any:
        raise ConcurrencyConflict("another writer won")

    monkeypatch.setattr(world.store, "save", lose)
    with pytest.raises(apply.Busy):
        await world.deliver(reply)
    assert "step.duration" not in points(reader)


@pytest.mark.parametrize(
    ("fault", "cause", "outcome"),
    [("transient", "transient", "transient"), ("deferred", "circuit_open", "deferred")],
)
async def test_a_released_step_counts_one_retry_with_its_cause(
    reader, fault, cause, outcome
) -> None:
    world = World()
    await world.submit("ORD-1")
    (request,) = agent_requests(world)
    await world.deliver(request, fault)
    (reply,) = world.deliverable("responses")
    await world.deliver(reply)
    found = points(reader)
    assert total(found, "step.retries", step="reserve_inventory", cause=cause) == 1
    assert total(found, "step.duration", step="reserve_inventory", outcome=outcome) == 1
    await world.drain()
    found = points(reader)
    assert total(found, "step.retries") == 1
    assert total(found, "orders.finished") == 1


async def test_the_supervisor_releasing_a_timed_out_attempt_counts_a_timeout_retry(reader) -> None:
    world = World()
    await world.submit("ORD-1")
    (request,) = agent_requests(world)
    await world.deliver(request, "lost_before")  # the agent died with it: no reply ever
    world.now = (await world.store.load("ORD-1")).complete_by + CLOCK_SKEW + timedelta(seconds=1)
    assert await world.tick()
    found = points(reader)
    assert total(found, "step.retries", step="reserve_inventory", cause="timeout") == 1
    assert "step.duration" not in found  # no reply was applied
    assert await world.tick()  # a second look at the released order records nothing
    assert total(points(reader), "step.retries") == 1


async def test_a_declined_first_step_fails_the_order_with_its_reason(reader) -> None:
    world = World()
    await world.submit("ORD-1")
    (request,) = agent_requests(world)
    await world.deliver(request, "decline")
    await world.drain()
    assert (await world.store.load("ORD-1")).state is ProcessState.ERROR
    found = points(reader)
    assert total(found, "orders.failed", workflow="order", reason="step_declined") == 1
    assert total(found, "step.duration", outcome="failed") == 1
    assert "orders.finished" not in found


async def test_cancel_fails_the_order_once_with_reason_cancelled(reader) -> None:
    world = World()
    await world.submit("ORD-1")
    assert await world.cancel("ORD-1")
    await world.drain()
    assert await world.cancel("ORD-1")  # refused: already in Error
    assert total(points(reader), "orders.failed", reason="cancelled") == 1


async def test_with_no_provider_bound_nothing_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_bound", None)

    def not_expected(*_: Any, **__: Any) -> Any:
        raise AssertionError("observed with metrics off")

    monkeypatch.setattr(metrics, "observe", not_expected)
    monkeypatch.setattr(metrics, "Observation", not_expected)
    world = World()
    await world.submit("ORD-1")
    (request,) = agent_requests(world)
    await world.deliver(request, "transient")
    await world.drain()
    assert (await world.store.load("ORD-1")).state is ProcessState.PROCESSED
    metrics.order_started("order")
    metrics.record_circuit_state("payment", "no-such-state")  # off: not even checked


def test_circuit_state_is_a_gauge_per_agent(reader) -> None:
    metrics.record_circuit_state("payment", "open")
    metrics.record_circuit_state("payment", "half_open")
    metrics.record_circuit_state("shipping", "closed")
    found = points(reader)["agent.circuit.state"]
    assert found == Counter({(("agent", "payment"),): 1, (("agent", "shipping"),): 0})
    with pytest.raises(ValueError, match="unknown circuit state 'ajar'"):
        metrics.record_circuit_state("payment", "ajar")


async def test_every_instrument_is_recorded_with_the_attributes_it_declares(reader) -> None:
    """ATTRIBUTES is what the workbook's charts may read as customDimensions (tests/infra)."""
    for order_id, fault in (("ORD-1", "transient"), ("ORD-2", "decline")):
        world = World()
        await world.submit(order_id)
        (request,) = agent_requests(world)
        await world.deliver(request, fault)
        await world.drain()
    metrics.record_circuit_state("payment", "open")
    found = points(reader)
    assert set(found) == metrics.NAMES
    for name, series in found.items():
        for key in series:
            assert {attribute for attribute, _ in key} == metrics.ATTRIBUTES[name], name
    assert set(supervisor_metrics.ATTRIBUTES) == supervisor_metrics.NAMES


def test_workflow_attribute_drops_the_version() -> None:
    assert metrics.workflow_name("order@2") == "order"
    assert metrics.workflow_name("single_step") == "single_step"
    assert metrics.workflow_name("order@x") == "order@x"


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    faults=st.lists(st.sampled_from(FAULTS), min_size=1, max_size=12),
    duplicates=st.lists(st.booleans(), min_size=1, max_size=12),
    crashes=st.lists(st.sampled_from([None, None, 0, 1]), min_size=1, max_size=12),
)
async def test_every_order_starts_once_and_ends_once_whatever_happens(
    reader, faults, duplicates, crashes
) -> None:
    """Faults, duplicated replies and crashes between write and sends: each order is counted
    started once and finished-or-failed once, and every retry count matches a released write."""
    reader.get_metrics_data()  # forget earlier examples (cumulative: compare differences)
    before = points(reader)
    world = World()
    for n in range(3):
        await world.submit(f"ORD-{n}")
    for i in range(36):
        ready = [e for e in world.pending if e.due <= world.now and e.queue != "client-replies"]
        ready = [e for e in ready if e.queue != QUEUES["alerts"]]
        if not ready:
            await world.tick()
            world.advance(15)
            continue
        envelope = ready[i % len(ready)]
        await world.deliver(
            envelope,
            faults[i % len(faults)],
            crash_after=crashes[i % len(crashes)],
            keep=duplicates[i % len(duplicates)],
        )
    await world.drain()
    after = points(reader)

    def grew(name: str) -> float:
        return total(after, name) - total(before, name)

    orders = world.store.orders()
    assert grew("orders.started") == len(orders) == 3
    processed = sum(o.state is ProcessState.PROCESSED for o in orders)
    assert grew("orders.finished") == processed
    assert grew("orders.failed") == len(orders) - processed
    timelines = [await world.store.get_timeline(o.order_id) for o in orders]
    released = sum(
        1 for timeline in timelines for entry in timeline if entry.event in ("released", "deferred")
    )
    assert grew("step.retries") == released


async def test_a_reply_applied_before_its_claim_time_is_not_a_negative_duration() -> None:
    """A reply applied before the claim time on record (clock skew between instances) is 0 s."""
    world = World()
    await world.submit("ORD-1")
    order = await world.store.load("ORD-1")
    flow = world.rt.workflow(order.workflow)
    (request,) = agent_requests(world)
    await world.deliver(request)
    (reply,) = world.deliverable("responses")
    entry_at = (
        order.complete_by - flow.step_named("reserve_inventory").deadline_budget - timedelta(1)
    )
    entry = replace((await world.store.get_timeline("ORD-1"))[-1], at=entry_at)
    found = metrics.observe(order, order, entry, Replied(reply.message), flow)
    (duration,) = [o for o in found if o.name == "step.duration"]
    assert duration.value == 0.0


async def test_a_failing_measurement_never_stops_the_transition(
    reader, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("exporter bug")

    monkeypatch.setattr(metrics, "observe", broken)
    world = World()
    await world.submit("ORD-1")
    await world.drain()
    assert (await world.store.load("ORD-1")).state is ProcessState.PROCESSED
    assert "order ORD-1: metrics not recorded" in caplog.text
