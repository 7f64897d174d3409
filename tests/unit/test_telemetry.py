"""Trace context travels in message properties; each handled message gets the app's span, under
the host's invocation span when there is one (the platform's, or the local host's)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest
from azure.functions.servicebus import ServiceBusMessage as FunctionMessage
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import scheduler.functions
from adapters import metrics, telemetry, trace_files
from adapters.servicebus import to_servicebus_message
from devstack.host.indexing import IndexedFunction, ServiceBusTrigger, TimerTrigger, Trigger
from devstack.host.invoke import Invoker, worker_telemetry
from devstack.host.ncrontab import NcrontabSchedule
from domain.messages import OrderSubmitted


def order(order_id: str = "o-telemetry-1") -> OrderSubmitted:
    return OrderSubmitted.model_validate(
        {
            "order_id": order_id,
            "customer_id": "c-1",
            "items": [{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 100}],
            "currency": "EUR",
        }
    )


def as_received(properties: dict) -> dict[bytes, bytes]:
    """Application properties the way the azure-servicebus SDK hands them to a receiver."""
    return {
        (k if isinstance(k, bytes) else k.encode()): (
            v if isinstance(v, bytes) else str(v).encode()
        )
        for k, v in properties.items()
    }


def function_message(properties: dict, correlation_id: str | None) -> FunctionMessage:
    """A func.ServiceBusMessage as the Python worker builds it (str keys and values)."""
    props = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in properties.items()
    }
    return FunctionMessage(
        body=b"{}",
        message_id="m-1",
        correlation_id=correlation_id,
        application_properties=props,
        user_properties=dict(props),
    )


def test_a_message_sent_inside_a_span_carries_its_trace_context(spans):
    with telemetry.tracer.start_as_current_span("send") as span:
        message = to_servicebus_message(order())
    context = span.get_span_context()
    properties = message.application_properties
    assert properties is not None
    traceparent = properties[b"traceparent"]
    assert str(traceparent).startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")
    assert properties[b"Diagnostic-Id"] == traceparent
    assert properties["schema_version"] == order().schema_version


def test_extract_reads_bytes_keys_and_values_as_the_sdk_delivers_them(spans):
    with telemetry.tracer.start_as_current_span("send") as span:
        message = to_servicebus_message(order())
    received = as_received(dict(message.application_properties or {}))
    assert all(isinstance(k, bytes) and isinstance(v, bytes) for k, v in received.items())

    extracted = trace.get_current_span(telemetry.extract(received)).get_span_context()
    assert extracted.is_valid and extracted.is_remote
    assert extracted.trace_id == span.get_span_context().trace_id
    assert extracted.span_id == span.get_span_context().span_id


def test_extract_falls_back_to_diagnostic_id_and_tolerates_no_context():
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    context = telemetry.extract({"Diagnostic-Id": traceparent})
    assert trace.get_current_span(context).get_span_context().trace_id == int(
        "0af7651916cd43dd8448eb211c80319c", 16
    )
    for nothing in (None, {}, {b"traceparent": b"garbage"}):
        assert not trace.get_current_span(telemetry.extract(nothing)).get_span_context().is_valid


def test_no_trace_properties_without_a_current_span():
    assert set(to_servicebus_message(order()).application_properties or {}) == {"schema_version"}


def test_consuming_starts_a_child_span_of_the_message(spans):
    with telemetry.tracer.start_as_current_span("send") as sender:
        message = to_servicebus_message(order("o-42"))
    received = function_message(dict(message.application_properties or {}), "o-42")

    with telemetry.consuming(received, "scheduler_intake", "orders-q"):
        pass

    span = finished(spans, "scheduler_intake")
    assert span.kind is SpanKind.CONSUMER
    assert span.parent is not None
    assert span.parent.span_id == sender.get_span_context().span_id
    assert span.context.trace_id == sender.get_span_context().trace_id
    assert span.attributes is not None
    assert span.attributes["order.id"] == "o-42"
    assert span.attributes["messaging.system"] == "servicebus"
    assert span.attributes["messaging.destination.name"] == "orders-q"


@pytest.mark.anyio
async def test_the_intake_function_handles_its_message_in_a_child_span(spans, monkeypatch):
    class FakeSettings:
        def queue(self, role: str) -> str:
            return f"{role}-q"

    class FakeRuntime:
        settings = FakeSettings()

    sent_next: list[object] = []

    async def handle_submission(body: bytes, rt: object, caused_by: str) -> None:  # next hop's
        reply = to_servicebus_message(order("o-7"))
        sent_next.append((reply.application_properties or {})[b"traceparent"])

    class FakeRoot:
        def runtime(self) -> FakeRuntime:
            return FakeRuntime()

    monkeypatch.setattr(scheduler.functions, "handle_submission", handle_submission)
    app = func.FunctionApp()
    app.register_functions(scheduler.functions.blueprint(FakeRoot()))  # type: ignore[arg-type]
    [intake] = [f for f in app.get_functions() if f.get_function_name() == "scheduler_intake"]
    with telemetry.tracer.start_as_current_span("submit") as submitter:
        message = to_servicebus_message(order("o-7"))

    await intake.get_user_function()(
        function_message(dict(message.application_properties or {}), "o-7")
    )

    span = finished(spans, "scheduler_intake")
    assert span.context is not None
    trace_id = submitter.get_span_context().trace_id
    assert span.context.trace_id == trace_id
    assert span.attributes is not None
    assert span.attributes["order.id"] == "o-7"
    assert span.attributes["messaging.destination.name"] == "orders-q"
    # what the handler sends next is parented on the handler's span: the trace goes on
    assert len(sent_next) == 1
    assert str(sent_next[0]).startswith(f"00-{trace_id:032x}-{span.context.span_id:016x}-")


def test_configure_without_a_connection_string_installs_nothing(monkeypatch):
    def must_not_be_called(**kwargs: object) -> None:
        raise AssertionError("configure_azure_monitor called without a connection string")

    import azure.monitor.opentelemetry

    monkeypatch.setattr(azure.monitor.opentelemetry, "configure_azure_monitor", must_not_be_called)
    before = trace.get_tracer_provider()
    assert telemetry.configure({}) is False
    assert telemetry.configure({"APPLICATIONINSIGHTS_CONNECTION_STRING": ""}) is False
    assert trace.get_tracer_provider() is before


def finished(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    matching = [s for s in exporter.get_finished_spans() if s.name == name]
    assert len(matching) == 1, [s.name for s in exporter.get_finished_spans()]
    return matching[0]


def test_configure_with_a_connection_string_configures_azure_monitor_once(monkeypatch):
    import azure.monitor.opentelemetry

    calls: list[dict[str, object]] = []
    monkeypatch.setattr(
        azure.monitor.opentelemetry, "configure_azure_monitor", lambda **kw: calls.append(kw)
    )
    monkeypatch.setattr(telemetry, "_configured", False)
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    monkeypatch.setattr(metrics, "_bound", metrics._bound)
    env = {"APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=00000000-0000"}

    assert telemetry.configure(env) is True
    assert telemetry.configure(env) is True
    assert calls == [{"connection_string": "InstrumentationKey=00000000-0000"}]


def test_configure_leaves_a_provider_the_worker_installed_alone(monkeypatch, provider):
    import azure.monitor.opentelemetry

    monkeypatch.setattr(telemetry, "_configured", False)
    monkeypatch.setattr(metrics, "_bound", metrics._bound)
    monkeypatch.setattr(
        azure.monitor.opentelemetry, "configure_azure_monitor", lambda **kw: pytest.fail("twice")
    )
    assert telemetry.configure({"APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=x"})
    assert trace.get_tracer_provider() is provider


# ----------------------------------------------- under the host's invocation span (Azure, local)


def sent_in_span(order_id: str) -> tuple[FunctionMessage, trace.SpanContext]:
    """A message sent inside a span, as a trigger receives it, and the sender's span context."""
    with telemetry.tracer.start_as_current_span("send") as sender:
        message = to_servicebus_message(order(order_id))
    return function_message(dict(message.application_properties or {}), order_id), (
        sender.get_span_context()
    )


def test_consuming_under_an_invocation_span_is_its_internal_child(spans):
    received, sender = sent_in_span("o-9")
    parent = trace.set_span_in_context(trace.NonRecordingSpan(sender))
    with telemetry.tracer.start_as_current_span("host", context=parent) as invocation:
        with telemetry.consuming(received, "scheduler_intake", "orders-q"):
            pass

    span = finished(spans, "scheduler_intake")
    assert span.kind is SpanKind.INTERNAL, "the host reports the request; the app adds none"
    assert span.parent is not None
    assert span.parent.span_id == invocation.get_span_context().span_id
    assert span.context.trace_id == sender.trace_id
    assert not span.links
    assert span.attributes is not None and span.attributes["order.id"] == "o-9"


def test_consuming_links_the_message_when_the_invocation_is_in_another_trace(spans):
    received, sender = sent_in_span("o-10")
    with telemetry.tracer.start_as_current_span("host") as invocation:  # a new trace
        with telemetry.consuming(received, "scheduler_intake", "orders-q"):
            pass

    span = finished(spans, "scheduler_intake")
    assert span.parent is not None
    assert span.parent.span_id == invocation.get_span_context().span_id
    assert [link.context.span_id for link in span.links] == [sender.span_id]


def test_inject_leaves_the_context_to_the_sdk_when_it_traces_sends(spans):
    from azure.core.settings import settings

    settings.tracing_implementation = "opentelemetry"
    try:
        assert telemetry.sdk_traces_sends()
        with telemetry.tracer.start_as_current_span("send"):
            properties = to_servicebus_message(order()).application_properties or {}
    finally:
        settings.tracing_implementation.unset_value()
    assert b"traceparent" not in properties, "the SDK's span for the message writes it"
    assert not telemetry.sdk_traces_sends()


def indexed(
    user_function: Callable[..., Any], trigger: Trigger, *, wants_context: bool = True
) -> IndexedFunction:
    param = "timer" if isinstance(trigger, TimerTrigger) else "msg"
    return IndexedFunction("fn", user_function, trigger, param, wants_context, ".")


QUEUE_TRIGGER = ServiceBusTrigger("q", "ServiceBusConnection", "message")


def test_the_local_host_runs_each_message_in_an_invocation_span_like_the_platform(spans):
    received, sender = sent_in_span("o-11")
    seen: dict[str, Any] = {}

    def fn(msg: FunctionMessage, context: func.Context) -> None:
        seen["traceparent"] = context.trace_context.trace_parent
        with telemetry.consuming(msg, "fn-app", "q"):
            pass

    Invoker().call(indexed(fn, QUEUE_TRIGGER), received, trace=received.application_properties)

    invocation = finished(spans, "fn")
    app = finished(spans, "fn-app")
    assert invocation.kind is SpanKind.CONSUMER
    assert invocation.parent is not None and invocation.parent.span_id == sender.span_id
    assert invocation.attributes is not None
    assert invocation.attributes["faas.trigger"] == "pubsub"
    assert app.parent is not None and app.parent.span_id == invocation.context.span_id
    # context.trace_context is the host's invocation span, as the worker receives it
    span_id = f"{invocation.context.span_id:016x}"
    assert seen["traceparent"].split("-")[2] == span_id


def test_without_the_worker_switch_the_app_span_is_a_sibling_of_the_invocation(spans):
    received, sender = sent_in_span("o-12")

    def fn(msg: FunctionMessage) -> None:
        with telemetry.consuming(msg, "fn-app", "q"):
            pass

    invoker = Invoker(worker_telemetry=False)
    invoker.call(
        indexed(fn, QUEUE_TRIGGER, wants_context=False), received, trace=received.user_properties
    )

    invocation = finished(spans, "fn")
    app = finished(spans, "fn-app")
    assert app.kind is SpanKind.CONSUMER
    assert app.parent is not None and app.parent.span_id == sender.span_id
    assert invocation.parent is not None and invocation.parent.span_id == sender.span_id


def test_a_failed_invocation_marks_its_span_and_a_timer_run_has_none(spans):
    received, _ = sent_in_span("o-13")

    def fails(msg: FunctionMessage) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        Invoker().call(indexed(fails, QUEUE_TRIGGER, wants_context=False), received)
    assert finished(spans, "fn").status.status_code is StatusCode.ERROR

    spans.clear()
    timer = TimerTrigger(NcrontabSchedule("*/5 * * * * *"), run_on_startup=False, use_monitor=False)
    Invoker().call(indexed(lambda timer: None, timer, wants_context=False), None)
    assert spans.get_finished_spans() == ()


@pytest.mark.parametrize(
    ("settings", "on"),
    [
        ({}, True),
        ({"PYTHON_ENABLE_OPENTELEMETRY": "true"}, True),
        ({"PYTHON_ENABLE_OPENTELEMETRY": "false"}, False),
    ],
)
def test_the_worker_switch_setting(settings, on):
    assert worker_telemetry(settings) is on


# ---------------------------------------------------------------- local export to files


@pytest.fixture
def unconfigured(monkeypatch):
    """configure() as in a fresh process; adapters.metrics' binding restored afterwards."""
    monkeypatch.setattr(telemetry, "_configured", False)
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    monkeypatch.setattr(metrics, "_bound", metrics._bound)


def test_configure_with_a_telemetry_dir_installs_the_file_providers(monkeypatch, unconfigured):
    installed: list[tuple[Path, str]] = []
    monkeypatch.setattr(trace_files, "install", lambda d, role: installed.append((d, role)))
    assert telemetry.configure({"TELEMETRY_DIR": "/tmp/t"}, role="orderctl") is True
    assert telemetry.configure({"TELEMETRY_DIR": "/tmp/t"}) is True
    assert installed == [(Path("/tmp/t"), "orderctl")]


def test_a_connection_string_wins_over_a_telemetry_dir(monkeypatch, unconfigured):
    import azure.monitor.opentelemetry

    calls: list[dict[str, object]] = []
    monkeypatch.setattr(
        azure.monitor.opentelemetry, "configure_azure_monitor", lambda **kw: calls.append(kw)
    )
    monkeypatch.setattr(trace_files, "install", lambda *a: pytest.fail("files too"))
    env = {"APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=x", "TELEMETRY_DIR": "d"}
    assert telemetry.configure(env) is True
    assert calls == [{"connection_string": "InstrumentationKey=x"}]


def test_a_blank_telemetry_dir_is_off(monkeypatch, unconfigured):
    monkeypatch.setattr(trace_files, "install", lambda *a: pytest.fail("installed"))
    assert telemetry.configure({"TELEMETRY_DIR": "  "}) is False


def test_spans_round_trip_through_the_files(tmp_path):
    tracer_provider, meter_provider = trace_files.file_providers(tmp_path, "host")
    try:
        tracer = tracer_provider.get_tracer("test")
        with tracer.start_as_current_span("submit", kind=SpanKind.CLIENT) as submit:
            attributes = {"order.id": "o-files-1", "messaging.destination.name": "orders"}
            with tracer.start_as_current_span("scheduler_intake", attributes=attributes):
                with tracer.start_as_current_span("http", attributes={"codes": (200, 503)}):
                    pass
        with tracer.start_as_current_span("other_order", attributes={"order.id": "o-other"}):
            pass
        assert tracer_provider.force_flush()
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()

    (path,) = tmp_path.glob("spans-host-*.jsonl")
    assert path.name == f"spans-host-{os.getpid()}.jsonl"
    found = {s.name: s for s in trace_files.read_spans(tmp_path, "o-files-1")}
    assert set(found) == {"submit", "scheduler_intake", "http"}
    trace_id = f"{submit.get_span_context().trace_id:032x}"
    assert {s.trace_id for s in found.values()} == {trace_id}
    assert found["submit"].parent_id is None and found["submit"].kind == "CLIENT"
    assert found["scheduler_intake"].parent_id == found["submit"].span_id
    assert found["http"].parent_id == found["scheduler_intake"].span_id
    assert found["http"].attributes == {"codes": [200, 503]}
    assert found["scheduler_intake"].attributes["messaging.destination.name"] == "orders"
    assert found["submit"].duration >= found["scheduler_intake"].duration
    assert found["submit"].role == "host"


def test_metrics_round_trip_through_the_files(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "_bound", None)
    tracer_provider, meter_provider = trace_files.file_providers(tmp_path, "orderctl")
    try:
        metrics.bind(meter_provider)
        metrics.order_started("order")
        metrics.order_started("order")
        attributes = (("step", "charge_payment"), ("outcome", "succeeded"), ("operation", "do"))
        metrics.record(
            metrics.Observation(metrics.STEP_DURATION, seconds, attributes)
            for seconds in (0.25, 0.75)
        )
        metrics.record_circuit_state("payment", "open")
        assert meter_provider.force_flush()
        metrics.order_started("order")  # the next interval holds only what happened in it
        assert meter_provider.force_flush()
    finally:
        meter_provider.shutdown()
        tracer_provider.shutdown()

    (path,) = tmp_path.glob("metrics-orderctl-*.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    started = [r for r in lines if r["name"] == "orders.started"]
    assert [(r["type"], r["value"], r["attributes"]) for r in started] == [
        ("sum", 2, {"workflow": "order"}),
        ("sum", 1, {"workflow": "order"}),
    ]
    (duration,) = [r for r in lines if r["name"] == "step.duration"]
    assert duration["type"] == "histogram" and duration["unit"] == "s"
    assert duration["bounds"] == list(metrics.DURATION_BUCKETS_S)
    assert sum(duration["buckets"]) == 2
    assert (duration["count"], duration["sum"], duration["min"], duration["max"]) == (
        2,
        1.0,
        0.25,
        0.75,
    )
    assert duration["attributes"] == {
        "step": "charge_payment",
        "outcome": "succeeded",
        "operation": "do",
    }
    circuit = [r for r in lines if r["name"] == "agent.circuit.state"]
    assert circuit and all(r["type"] == "gauge" and r["value"] == 2 for r in circuit)
    assert {r["role"] for r in lines} == {"orderctl"}


def test_a_torn_last_line_is_skipped(tmp_path):
    tracer_provider, meter_provider = trace_files.file_providers(tmp_path, "host")
    try:
        with tracer_provider.get_tracer("t").start_as_current_span(
            "scheduler_replies", attributes={"order.id": "o-torn"}
        ):
            pass
        tracer_provider.force_flush()
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()
    (path,) = tmp_path.glob("spans-*.jsonl")
    with path.open("a") as out:
        out.write('{"trace_id": "ab", "span_id": "cd", "name": "half')
    assert [s.name for s in trace_files.read_spans(tmp_path, "o-torn")] == ["scheduler_replies"]


def test_an_unwritable_telemetry_dir_says_what_to_do(tmp_path, unconfigured):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"TELEMETRY_DIR=.*cannot create that directory.*unset"):
        telemetry.configure({"TELEMETRY_DIR": str(blocker / "telemetry")})
