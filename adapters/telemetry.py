"""Tracing one order across queues: OpenTelemetry, exported to Application Insights in Azure,
or to JSON-lines files locally.

``configure()`` turns export on when APPLICATIONINSIGHTS_CONNECTION_STRING is set (the Azure
Monitor distro: exporter plus the azure-sdk and httpx instrumentations); else, when TELEMETRY_DIR
is set, it installs the OpenTelemetry SDK's tracer and meter providers writing to files in that
directory (``spans-<role>-<pid>.jsonl`` and ``metrics-<role>-<pid>.jsonl``, written by
:func:`file_providers`, in the format of :mod:`adapters.trace_files`, which ``orderctl trace`` and
the dashboard read), and turns on the Azure SDKs' own tracing as the distro does in Azure: a span
per Table request and per Service Bus send (``benchmarks.latency`` cuts an order's time by them).
Spans are written in batches every :data:`SPAN_FLUSH_S`, metrics every :data:`METRIC_FLUSH_S`,
and what is left when the process exits. Otherwise it does nothing: no exporter, the
OpenTelemetry API stays a no-op and :mod:`adapters.metrics` records nothing.

**Where the app's spans hang** (docs/deploy.md, "Telemetry"): each invocation's span belongs to
the Functions host, which parents it on the trace context the message carries. The Python
worker makes that invocation's context current before it calls a function, when the app setting
PYTHON_ENABLE_OPENTELEMETRY is true (infra/ sets it; the local host does the same, see
devstack/host/invoke.py). :func:`consuming` then opens the app's span as a child of the
host's invocation span, of kind INTERNAL: the host already reports the invocation as the
request, and a second SERVER or CONSUMER span would be a second request row. Were the host's
span in another trace than the message (a host that did not read the message's context), the
app's span links to the message's context, so the hop stays navigable. Without a current span
(the switch off, a handler called directly), the app's span is the first of the hop: a CONSUMER
child of the message's context.

Trace context travels in each message's application properties as W3C ``traceparent`` /
``tracestate``, plus ``Diagnostic-Id`` (the property the Azure SDKs and the Functions host
read). When the azure-servicebus SDK traces its sends (the distro's azure-sdk instrumentation,
on in Azure), the SDK opens a PRODUCER span per message under the app's span and writes that
span's context into the message, so the next hop's invocation is a child of the send; the app
then writes nothing itself. Otherwise :func:`inject` writes the app span's context. The keys
are ``bytes``, the way the SDK writes them (it adds these properties only when absent, checked
by ``bytes`` key, so ``str`` keys would give the AMQP map duplicate keys). ``extract`` accepts
``str`` or ``bytes`` keys and values (the SDK delivers ``bytes``; the Functions host and the
local host deliver ``str``).

**One order, one trace.** Intake stores the ``traceparent`` of its span on the order
(:func:`current_trace_parent`, ``Order.trace_parent``). Work on the order that no message of
the order started - the Supervisor's recovery (a timer carries no context) and operator actions
(an HTTP request, a CLI) - runs in :func:`continuing`: a span parented on that stored context,
so what it sends continues the order's trace, and linked to the span that asked for it (the
tick, the request), so that one stays navigable too. Parented rather than only linked because
Application Insights groups a transaction by its operation id (the trace id): a linked span in
a trace of its own would be a separate transaction that Transaction search on the order's
operation id does not show.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from domain.order import valid_trace_parent

CONNECTION_STRING_SETTING = "APPLICATIONINSIGHTS_CONNECTION_STRING"
TELEMETRY_DIR_SETTING = "TELEMETRY_DIR"
"""Local export: the directory the JSON-lines span and metric files are appended to."""
WORKER_SWITCH_SETTING = "PYTHON_ENABLE_OPENTELEMETRY"
"""The Python worker's switch: make the host's invocation context current in each call."""
TRACEPARENT = "traceparent"
DIAGNOSTIC_ID = "Diagnostic-Id"

log = logging.getLogger("telemetry")
tracer = trace.get_tracer("orders")

_propagator = TraceContextTextMapPropagator()
_configure_lock = threading.Lock()
_configured = False


def configure(environ: Mapping[str, str] | None = None, *, role: str = "host") -> bool:
    """Export to Application Insights when its connection string is set, else to files in
    TELEMETRY_DIR when that is set; True if either is enabled. ``role`` names the files
    (``host`` for the function app, ``orderctl`` for the CLI's own spans).

    Once per process. Skipped when a tracer provider is already installed: a Python worker that
    reads PYTHON_ENABLE_OPENTELEMETRY (or PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY) as "set
    up the distro" configures Azure Monitor itself before it imports the app, and configuring
    twice would export everything twice. With Entra ID authentication (local auth off) the
    exporter takes its credential from APPLICATIONINSIGHTS_AUTHENTICATION_STRING.
    """
    global _configured
    environ = os.environ if environ is None else environ
    connection = environ.get(CONNECTION_STRING_SETTING)
    directory = environ.get(TELEMETRY_DIR_SETTING, "").strip()
    if not connection and not directory:
        return False
    with _configure_lock:
        if _configured:
            return True
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            log.info("a tracer provider is already installed; not configuring telemetry")
        elif connection:
            from azure.monitor.opentelemetry import configure_azure_monitor

            configure_azure_monitor(connection_string=connection)
        else:  # local: the app's own files (imported here: the SDK costs ~50 ms at a start)
            from adapters import trace_files

            try:
                trace_files.install(Path(directory), role)
            except OSError as exc:
                raise ValueError(
                    f"{TELEMETRY_DIR_SETTING}={directory}: cannot create that directory ({exc}). "
                    f"Point {TELEMETRY_DIR_SETTING} at a writable directory, or unset it."
                ) from exc
        _bind_metrics()
        _configured = True
    return True


def _bind_metrics() -> None:
    """Turn :mod:`adapters.metrics` on when a real meter provider is installed (the distro's, the
    files', or the one a worker installed)."""
    from opentelemetry import metrics as otel_metrics
    from opentelemetry.sdk.metrics import MeterProvider

    from adapters import metrics

    if isinstance(otel_metrics.get_meter_provider(), MeterProvider):
        metrics.bind()


class _BytesKeySetter(Setter[MutableMapping[Any, Any]]):
    def set(self, carrier: MutableMapping[Any, Any], key: str, value: str) -> None:
        carrier[key.encode("ascii")] = value


class _PropertiesGetter(Getter[Mapping[Any, Any]]):
    """Reads application properties whose keys and values may be ``str`` or ``bytes``."""

    def get(self, carrier: Mapping[Any, Any], key: str) -> list[str] | None:
        value = carrier.get(key, carrier.get(key.encode("ascii")))
        if value is None and key == TRACEPARENT:  # sent by a client that set only Diagnostic-Id
            value = carrier.get(DIAGNOSTIC_ID, carrier.get(DIAGNOSTIC_ID.encode("ascii")))
        if value is None:
            return None
        return [value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)]

    def keys(self, carrier: Mapping[Any, Any]) -> list[str]:
        return [k.decode("ascii", "replace") if isinstance(k, bytes) else str(k) for k in carrier]


_setter = _BytesKeySetter()
_getter = _PropertiesGetter()


def inject(properties: MutableMapping[Any, Any], context: Context | None = None) -> None:
    """Write the current span's ``traceparent``/``tracestate`` and ``Diagnostic-Id``.

    Nothing is written when there is no valid current span (tracing off and no incoming
    context), nor when the Service Bus SDK traces its sends: its span for the message (a child
    of the current span) writes its own context, so the next hop hangs under the send.
    """
    if not trace.get_current_span(context).get_span_context().is_valid or sdk_traces_sends():
        return
    _propagator.inject(properties, context=context, setter=_setter)
    traceparent = properties.get(TRACEPARENT.encode("ascii"))
    if traceparent is not None:
        properties[DIAGNOSTIC_ID.encode("ascii")] = traceparent


def sdk_traces_sends() -> bool:
    """Whether the Azure SDKs trace through OpenTelemetry (azure-core's tracing plugin, which
    the Azure Monitor distro's azure-sdk instrumentation installs)."""
    from azure.core.settings import settings

    return settings.tracing_implementation() is not None


def extract(properties: Mapping[Any, Any] | None) -> Context:
    """The trace context a message carries (an empty context when it carries none)."""
    return _propagator.extract(properties or {}, getter=_getter)


def message_properties(message: Any) -> Mapping[Any, Any]:
    """A ``func.ServiceBusMessage``'s application properties (user_properties if those are empty).

    The Python worker fills both from the host's trigger metadata; test doubles may set one.
    """
    return (
        getattr(message, "application_properties", None)
        or getattr(message, "user_properties", None)
        or {}
    )


@contextmanager
def consuming(message: Any, name: str, queue: str) -> Iterator[Span]:
    """The app's span for handling ``message`` from ``queue``: under the host's invocation span
    when one is current, else a CONSUMER child of the sender's span (module docstring)."""
    attributes: dict[str, str] = {
        "messaging.system": "servicebus",
        "messaging.destination.name": queue,
        "messaging.operation.type": "process",
    }
    for key, field in (("order.id", "correlation_id"), ("messaging.message.id", "message_id")):
        if value := getattr(message, field, None):
            attributes[key] = str(value)
    sent = extract(message_properties(message))
    invocation = trace.get_current_span().get_span_context()
    if invocation.is_valid:
        sender = trace.get_current_span(sent).get_span_context()
        links = (
            [Link(sender)] if sender.is_valid and sender.trace_id != invocation.trace_id else None
        )
        span = tracer.start_as_current_span(
            name, kind=SpanKind.INTERNAL, attributes=attributes, links=links
        )
    else:
        span = tracer.start_as_current_span(
            name, context=sent, kind=SpanKind.CONSUMER, attributes=attributes
        )
    with span as current:
        yield current


def trace_parent_of(context: SpanContext) -> str | None:
    """``context`` as a W3C ``traceparent`` (version 00), or None for an invalid context."""
    if not context.is_valid:
        return None
    text = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    return valid_trace_parent(text)


def current_trace_parent() -> str | None:
    """The ``traceparent`` of the current span (intake's, when it creates an order)."""
    return trace_parent_of(trace.get_current_span().get_span_context())


def span_context_of(trace_parent: str | None) -> SpanContext | None:
    """The remote span context a stored ``traceparent`` names; None unless it is valid
    (:func:`domain.order.valid_trace_parent`)."""
    valid = valid_trace_parent(trace_parent)
    if valid is None:
        return None
    _, trace_id, span_id, flags = valid.split("-")
    return SpanContext(
        trace_id=int(trace_id, 16),
        span_id=int(span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(flags, 16)),
    )


@contextmanager
def continuing(
    name: str, order_id: str, trace_parent: str | None, attributes: Mapping[str, str] | None = None
) -> Iterator[Span]:
    """A span for work on order ``order_id`` that did not arrive in the order's trace: parented
    on ``trace_parent`` (the order's, as stored) and linked to the current span (module
    docstring). Already in that trace, or with no valid ``trace_parent`` (an order created
    before it was recorded), it is an ordinary child of the current span."""
    attrs = {**(attributes or {}), "order.id": order_id}
    origin = span_context_of(trace_parent)
    current = trace.get_current_span().get_span_context()
    if origin is None or (current.is_valid and current.trace_id == origin.trace_id):
        span = tracer.start_as_current_span(name, kind=SpanKind.INTERNAL, attributes=attrs)
    else:
        parent = trace.set_span_in_context(NonRecordingSpan(origin))
        links = [Link(current)] if current.is_valid else None
        span = tracer.start_as_current_span(
            name, context=parent, kind=SpanKind.INTERNAL, attributes=attrs, links=links
        )
    with span as started:
        yield started
