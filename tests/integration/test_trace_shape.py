"""One order, one trace: intake -> agent -> reply through the local host, with the spans the
platform and the app make (docs/deploy.md, "Telemetry").

The real app runs in the local host against the development broker and Azurite, with an
in-memory span exporter on the process's tracer provider and the Service Bus SDK tracing its
sends, as the Azure Monitor distro's azure-sdk instrumentation makes it do in Azure. A
single-step order is submitted inside a client span. Expected, per hop:

    client span / the app span of the previous hop
      └─ ServiceBus.message  PRODUCER  (the SDK's span for the message; its context travels)
      └─ ServiceBus.send     CLIENT    (the SDK's send, linking to that message span)
    ServiceBus.message
      └─ <function>          CONSUMER  (the host's invocation span, parented on the message)
           └─ <function>     INTERNAL  (the app's span: adapters.telemetry.consuming)
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence

import pytest
from azure.core.settings import settings as azure_settings
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind

from adapters import telemetry
from adapters.servicebus import Bus
from adapters.store.rows import OrderNotFound
from domain.messages import StatusUpdate, message_id_for
from domain.states import ProcessState
from service.runtime import Runtime
from tests.support.app import hosting, make_runtime, pattern_app
from tests.support.pattern import new_order

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

HOPS = (  # function, the queue role it reads
    ("scheduler_intake", "orders"),
    ("inventory_agent", "inventory"),
    ("scheduler_replies", "responses"),
)


class _Switchable(SpanProcessor):
    """Passes ended spans on while on (a provider's processors cannot be removed)."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner
        self.on = True

    def on_start(self, span: object, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self.on:
            self.inner.on_end(span)


def _sdk_provider() -> TracerProvider:
    """The process's SDK tracer provider, installed if there is none yet (one per process)."""
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider), "another kind of provider is installed"
    return provider


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    recorder = _Switchable(SimpleSpanProcessor(exporter))
    _sdk_provider().add_span_processor(recorder)
    azure_settings.tracing_implementation = "opentelemetry"
    try:
        yield exporter
    finally:
        azure_settings.tracing_implementation.unset_value()
        recorder.on = False


@pytest.fixture
def env(env):
    """The shared settings with a step budget no hop comes near: a request refused as late on a
    loaded machine would leave the order unfinished; no deadline is under test here."""
    return env | {"STEP_TIMEOUT_SECONDS": "60"}


@pytest.fixture
async def hosted(env, spans) -> AsyncIterator[Runtime]:
    rt = await make_runtime(env, "scheduler")
    app, root = pattern_app(rt)
    functions = [function for function, _ in HOPS]
    async with hosting(app, root, rt, settings=env, host_json="host.json",
                       concurrency_override=1, functions=functions):  # fmt: skip
        yield rt


async def test_one_order_is_one_trace_of_invocations_app_spans_and_sends(hosted, spans, fakes):
    rt = hosted
    order = new_order(workflow="single_step")
    with telemetry.tracer.start_as_current_span("submit", kind=SpanKind.CLIENT) as submit:
        await rt.bus.send(rt.settings.queue("orders"), order)
    trace_id = submit.get_span_context().trace_id

    finished = await _wait_for_reply_hop(rt, spans, order.order_id, trace_id)
    ours = [s for s in finished if s.context.trace_id == trace_id]
    by_id = {s.context.span_id: s for s in ours}

    # Every span of the order's hops is in the submitter's trace (the queues may also hold
    # other tests' leftovers, handled in traces of their own).
    hop_spans = [
        s
        for s in finished
        if s.name in {f for f, _ in HOPS} and (s.attributes or {}).get("order.id") == order.order_id
    ]
    assert hop_spans and all(s.context.trace_id == trace_id for s in hop_spans), _shape(finished)
    roots = [s.name for s in ours if s.parent is None]
    assert roots == ["submit"], _shape(ours)

    sender = submit
    for function, role in HOPS:
        queue = rt.settings.queue(role)
        invocation = _one(ours, function, SpanKind.CONSUMER)
        app = _one(ours, function, SpanKind.INTERNAL)
        message = by_id[invocation.parent.span_id]  # type: ignore[union-attr]
        assert message.kind is SpanKind.PRODUCER, _shape(ours)
        assert (message.attributes or {}).get("messaging.destination.name") == queue
        assert message.parent is not None
        assert message.parent.span_id == sender.get_span_context().span_id, _shape(ours)
        assert _send_linking(ours, message), f"no send span links to the message to {queue}"
        assert (invocation.attributes or {}).get("faas.trigger") == "pubsub"
        assert app.parent is not None and app.parent.span_id == invocation.context.span_id
        assert not app.links, "the app span is in its message's trace: nothing to link"
        assert (app.attributes or {}).get("order.id") == order.order_id
        sender = app


async def test_grouped_sends_keep_each_message_in_its_own_senders_trace(servicebus, spans):
    """Sends that wait for a send in flight go out as one batch (adapters.servicebus): the SDK's
    span for each message is still a child of that message's own sender, in its own trace, and
    the context that travels with the message is that span's."""
    queue = servicebus.queue("order-status")
    bus = Bus(lambda: AsyncServiceBusClient.from_connection_string(servicebus.connection_string))
    updates = [
        StatusUpdate(order_id=f"o-grouped-{uuid.uuid4().hex[:12]}", sequence=0, state="Pending")
        for _ in range(6)
    ]

    async def send(update: StatusUpdate) -> SpanContext:
        with telemetry.tracer.start_as_current_span(f"send {update.order_id}") as span:
            await bus.send(queue, update)
            return span.get_span_context()

    try:
        senders = await asyncio.gather(*(send(u) for u in updates))
    finally:
        await bus.close()
    finished = spans.get_finished_spans()
    ours = {sender.trace_id for sender in senders}
    sends = [s for s in finished if s.kind is SpanKind.CLIENT and s.context.trace_id in ours]
    assert len(sends) < len(updates), "the sends were not grouped:\n" + _shape(finished)
    messages = {}
    for sender in senders:
        (message,) = [
            s
            for s in finished
            if s.kind is SpanKind.PRODUCER and s.context.trace_id == sender.trace_id
        ]
        assert message.parent is not None and message.parent.span_id == sender.span_id
        assert any(
            link.context.span_id == message.context.span_id for s in sends for link in s.links
        ), f"no send links to the message of trace {sender.trace_id:x}"
        messages[sender.trace_id] = message

    wanted = {message_id_for(u): sender for u, sender in zip(updates, senders, strict=True)}
    async with AsyncServiceBusClient.from_connection_string(servicebus.connection_string) as c:
        async with c.get_queue_receiver(queue, max_wait_time=10) as receiver:
            while wanted:
                batch = await receiver.receive_messages(max_message_count=20, max_wait_time=10)
                assert batch, f"{sorted(wanted)} never arrived"
                for received in batch:
                    await receiver.complete_message(received)
                    sender = wanted.pop(str(received.message_id), None)
                    if sender is None:
                        continue  # another test's leftover
                    carried = trace.get_current_span(
                        telemetry.extract(received.application_properties)
                    ).get_span_context()
                    assert carried.span_id == messages[sender.trace_id].context.span_id


async def _wait_for_reply_hop(rt, spans, order_id: str, trace_id: int) -> Sequence[ReadableSpan]:
    """The finished spans once the order is Processed and its reply hop's invocation ended (in
    its trace: a reply left on the queue by an earlier test is handled in a trace of its own)."""
    deadline = time.monotonic() + 60
    while True:
        finished = spans.get_finished_spans()
        state = await _state(rt, order_id)
        if state is ProcessState.PROCESSED and any(
            s.name == "scheduler_replies"
            and s.kind is SpanKind.CONSUMER
            and s.context.trace_id == trace_id
            for s in finished
        ):
            return finished
        assert time.monotonic() < deadline, f"not finished: {state}"
        await asyncio.sleep(0.2)


async def _state(rt, order_id: str) -> ProcessState | None:
    try:
        return (await rt.store.load(order_id)).state
    except OrderNotFound:
        return None  # intake has not run yet


def _one(spans: Sequence[ReadableSpan], name: str, kind: SpanKind) -> ReadableSpan:
    found = [s for s in spans if s.name == name and s.kind is kind]
    assert len(found) == 1, f"{len(found)} {kind.name} spans named {name}:\n{_shape(spans)}"
    return found[0]


def _send_linking(spans: Sequence[ReadableSpan], message: ReadableSpan) -> bool:
    """A sibling CLIENT span that links to ``message`` (the SDK's send of that message)."""
    return any(
        s.kind is SpanKind.CLIENT
        and s.parent == message.parent
        and any(link.context.span_id == message.context.span_id for link in s.links)
        for s in spans
    )


def _shape(spans: Sequence[ReadableSpan]) -> str:
    """The spans as a tree, for failure messages."""
    children: dict[int | None, list[ReadableSpan]] = {}
    ids = {s.context.span_id for s in spans}
    for span in spans:
        parent = span.parent.span_id if span.parent and span.parent.span_id in ids else None
        children.setdefault(parent, []).append(span)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: s.start_time or 0):
            lines.append(
                f"{'  ' * depth}{span.name} {span.kind.name} trace={span.context.trace_id:x}"
            )
            walk(span.context.span_id, depth + 1)

    walk(None, 0)
    return "\n".join(lines)
