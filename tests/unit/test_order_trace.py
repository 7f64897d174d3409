"""One order, one trace: the ``traceparent`` an order records at intake, and the spans that
continue it when the Supervisor recovers the order or an operator acts on it
(:func:`adapters.telemetry.continuing`). In memory: the store and bus of :mod:`devstack.memory`, and
the OpenTelemetry SDK exporting to memory."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, TraceFlags

from adapters import telemetry
from adapters.settings import Connection, Settings
from devstack.memory import MemoryBus, MemoryStore
from domain.messages import MessageBase, OrderSubmitted, SchedulerCommand, encode
from domain.order import TRACE_PARENT_CHARS, valid_trace_parent
from domain.states import ProcessState
from service import control, resume
from service.intake import handle_submission
from service.operations.models import trace_id_of
from service.runtime import Runtime
from service.sweep import RECOVER_SPAN, run_tick
from tests.support.memory_runtime import memory_runtime
from tests.support.world import QUEUES

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 1, 1, tzinfo=UTC)
STEP_TIMEOUT = timedelta(seconds=30)
GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_SHAPE = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


# ------------------------------------------------------------------------------ the codec

trace_ids = st.integers(min_value=1, max_value=2**128 - 1)
span_ids = st.integers(min_value=1, max_value=2**64 - 1)
flags = st.integers(min_value=0, max_value=255)


@given(trace_ids, span_ids, flags)
def test_a_span_context_round_trips_through_its_traceparent(trace_id, span_id, flag):
    context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(flag))
    text = telemetry.trace_parent_of(context)
    assert text is not None and len(text) == TRACE_PARENT_CHARS
    assert valid_trace_parent(text) == text
    assert trace_id_of(text) == f"{trace_id:032x}"
    back = telemetry.span_context_of(text)
    assert back is not None and back.is_remote and back.is_valid
    assert (back.trace_id, back.span_id, int(back.trace_flags)) == (trace_id, span_id, flag)


@given(st.one_of(st.text(max_size=80), st.binary(max_size=80), st.integers(), st.none()))
def test_anything_is_either_a_wellformed_traceparent_or_dropped(value):
    valid = valid_trace_parent(value)
    assert valid is None or (valid == value and _SHAPE.fullmatch(valid))
    if valid is None:
        assert telemetry.span_context_of(value) is None  # type: ignore[arg-type]
        assert trace_id_of(value) is None  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=TRACE_PARENT_CHARS - 1), st.characters())
def test_one_changed_character_is_accepted_only_from_its_alphabet(at, char):
    forged = GOOD[:at] + char + GOOD[at + 1 :]
    allowed = "-" if at in (2, 35, 52) else "0" if at < 2 else "0123456789abcdef"
    assert (valid_trace_parent(forged) is not None) == (char in allowed)


@pytest.mark.parametrize(
    "forged",
    [
        GOOD.upper(),  # uppercase hex is not W3C
        "ff" + GOOD[2:],  # version ff is forbidden
        "01" + GOOD[2:],  # a future version: not stored, it may mean something else
        "00-" + "0" * 32 + GOOD[35:],  # all-zero trace id
        GOOD[:36] + "0" * 16 + GOOD[52:],  # all-zero span id
        GOOD + "-extra",  # oversized: version 00 has exactly four fields
        GOOD + "0" * 10_000,
        GOOD[:-1],
        " " + GOOD[1:],
        GOOD[:-1] + "\n",
        GOOD.replace("0", "\u0660", 1),  # an Arabic-Indic zero: a digit to str.isdigit, not here
        "",
        GOOD.encode(),
        55,
        None,
    ],
)
def test_forged_and_malformed_traceparents_are_refused(forged):
    assert valid_trace_parent(forged) is None
    assert telemetry.span_context_of(forged) is None  # type: ignore[arg-type]


def test_no_traceparent_without_a_valid_span_context():
    assert telemetry.trace_parent_of(SpanContext(0, 0, is_remote=False)) is None
    assert telemetry.current_trace_parent() is None


# --------------------------------------------------------------------------- continuing


def test_continuing_parents_on_the_order_and_links_the_asking_span(spans):
    with telemetry.tracer.start_as_current_span("request") as request:
        with telemetry.continuing("work", "o-1", GOOD, {"order.actor": "op"}):
            inside = telemetry.current_trace_parent()
    (span,) = named(spans, "work")
    assert span.context is not None and span.parent is not None
    assert f"{span.context.trace_id:032x}" == trace_id_of(GOOD)
    assert f"{span.parent.span_id:016x}" == GOOD[36:52]
    assert [link.context.span_id for link in span.links] == [request.get_span_context().span_id]
    assert dict(span.attributes or {}) == {"order.actor": "op", "order.id": "o-1"}
    assert trace_id_of(inside) == trace_id_of(GOOD)  # what it sends continues the order


def test_continuing_inside_the_orders_trace_is_a_plain_child(spans):
    parent = telemetry.span_context_of(GOOD)
    assert parent is not None
    with telemetry.tracer.start_as_current_span(
        "hop", context=trace.set_span_in_context(trace.NonRecordingSpan(parent))
    ) as hop:
        with telemetry.continuing("work", "o-1", GOOD):
            pass
    (span,) = named(spans, "work")
    assert span.parent is not None and span.parent.span_id == hop.get_span_context().span_id
    assert not span.links


@pytest.mark.parametrize("stored", [None, "garbage", GOOD.upper()])
def test_continuing_without_a_valid_traceparent_stays_where_it_is(spans, stored):
    with telemetry.tracer.start_as_current_span("tick") as tick:
        with telemetry.continuing("work", "o-1", stored):
            pass
    (span,) = named(spans, "work")
    assert span.parent is not None and span.parent.span_id == tick.get_span_context().span_id
    assert span.context is not None
    assert span.context.trace_id == tick.get_span_context().trace_id


# ------------------------------------------------------------- intake, recovery, operators


class TracingBus(MemoryBus):
    """A MemoryBus that records the trace context each message would carry."""

    def __init__(self) -> None:
        super().__init__()
        self.contexts: list[tuple[MessageBase, str | None]] = []

    async def send(
        self, queue: str, message: MessageBase, *, scheduled_at: datetime | None = None
    ) -> None:
        self.contexts.append((message, telemetry.current_trace_parent()))
        await super().send(queue, message, scheduled_at=scheduled_at)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def runtime(store: MemoryStore, clock: Clock, name: str) -> tuple[Runtime, TracingBus]:
    config = Settings(
        queues=QUEUES,
        service_urls={},
        servicebus=Connection("sb"),
        storage=Connection("st"),
        step_timeout=STEP_TIMEOUT,
        step_queue=timedelta(0),
        retry_base_delay=timedelta(seconds=5),
        retry_max_delay=timedelta(seconds=60),
    )
    bus = TracingBus()
    return memory_runtime(config, store, bus, name, clock), bus


def submission(order_id: str) -> bytes:
    return encode(
        OrderSubmitted(
            order_id=order_id,
            customer_id="c-1",
            items=[{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 500}],
            currency="EUR",
        )
    )


async def submitted(store: MemoryStore, clock: Clock, order_id: str) -> str:
    """Submit ``order_id`` inside an intake span; that span's traceparent."""
    rt, _ = runtime(store, clock, "scheduler-1")
    with telemetry.tracer.start_as_current_span("scheduler_intake"):
        await handle_submission(submission(order_id), rt)
        created = telemetry.current_trace_parent()
    assert created is not None
    return created


async def test_intake_records_the_traceparent_of_its_span(spans):
    store, clock = MemoryStore(), Clock()
    created = await submitted(store, clock, "o-intake")
    assert (await store.load("o-intake")).trace_parent == created


async def test_intake_without_a_span_records_none(spans):
    store = MemoryStore()
    rt, _ = runtime(store, Clock(), "scheduler-1")
    await handle_submission(submission("o-untraced"), rt)
    assert (await store.load("o-untraced")).trace_parent is None


async def test_the_supervisors_recovery_continues_the_orders_trace(spans):
    store, clock = MemoryStore(), Clock()
    created = await submitted(store, clock, "o-hung")
    clock.now += STEP_TIMEOUT * 3  # the agent never answered: past CompleteBy
    rt, bus = runtime(store, clock, "supervisor-1")
    with telemetry.tracer.start_as_current_span("supervisor_tick") as tick:
        report = await run_tick(rt)
    assert report.retried == 1

    (recover,) = named(spans, RECOVER_SPAN)
    assert recover.parent is not None and recover.context is not None
    assert f"{recover.parent.span_id:016x}" == created[36:52]
    assert f"{recover.context.trace_id:032x}" == trace_id_of(created)
    assert [link.context.span_id for link in recover.links] == [tick.get_span_context().span_id]
    assert (recover.attributes or {})["order.id"] == "o-hung"
    retries = [ctx for message, ctx in bus.contexts if isinstance(message, SchedulerCommand)]
    assert retries and all(trace_id_of(ctx) == trace_id_of(created) for ctx in retries)


async def test_a_tick_that_changes_nothing_adds_no_span_to_the_order(spans):
    store, clock = MemoryStore(), Clock()
    await submitted(store, clock, "o-fine")
    clock.now += STEP_TIMEOUT / 10  # in flight, well within its deadline
    rt, bus = runtime(store, clock, "supervisor-1")
    await run_tick(rt)
    assert not named(spans, RECOVER_SPAN) and not bus.sent


async def test_an_operator_action_continues_the_orders_trace(spans):
    store, clock = MemoryStore(), Clock()
    created = await submitted(store, clock, "o-cancel")
    rt, bus = runtime(store, clock, "scheduler-2")
    with telemetry.tracer.start_as_current_span("POST /api/orders/{id}/cancel") as request:
        result = await control.cancel(rt, "o-cancel", actor="operator:ada", reason="customer asked")
    assert result.state in (ProcessState.COMPENSATING, ProcessState.ERROR)

    (action,) = named(spans, "operator_cancel")
    assert action.parent is not None and action.context is not None
    assert f"{action.parent.span_id:016x}" == created[36:52]
    assert [link.context.span_id for link in action.links] == [request.get_span_context().span_id]
    assert (action.attributes or {})["order.actor"] == "operator:ada"
    assert bus.contexts and all(trace_id_of(c) == trace_id_of(created) for _, c in bus.contexts)


async def test_a_refused_operator_action_records_its_span_as_failed(spans):
    store, clock = MemoryStore(), Clock()
    await submitted(store, clock, "o-busy")
    rt, _ = runtime(store, clock, "scheduler-2")
    with pytest.raises(control.Refused):
        await control.resubmit(rt, "o-busy", actor="operator:ada", reason="not in Error")
    (action,) = named(spans, "operator_resubmit")
    assert action.status.status_code is trace.StatusCode.ERROR


async def test_a_resume_snapshot_keeps_the_traceparent_for_96_more_characters(spans):
    """A reply decided on its snapshot (service.resume) writes the row back whole: the snapshot
    must carry the traceparent, or the answer's write would drop it from the order."""
    store, clock = MemoryStore(), Clock()
    created = await submitted(store, clock, "o-resume")
    order = dataclasses.replace(await store.load("o-resume"), etag='W/"1"')
    token = resume.snapshot(order)
    bare = resume.snapshot(dataclasses.replace(order, trace_parent=None))
    assert token is not None and bare is not None
    assert len(token) - len(bare) == 96
    restored = resume.restore(token, "o-resume")
    assert restored is not None and restored.trace_parent == created
