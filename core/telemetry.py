"""Tracing one order across queues: OpenTelemetry, exported to Application Insights in Azure.

``configure()`` turns export on when APPLICATIONINSIGHTS_CONNECTION_STRING is set (the Azure
Monitor distro: exporter plus the azure-sdk and httpx instrumentations) and does nothing
otherwise: no exporter, and the OpenTelemetry API stays a no-op.

Trace context travels in each message's application properties as W3C ``traceparent`` /
``tracestate``, plus ``Diagnostic-Id`` (the property the Azure SDKs and the Functions host
read). The keys are written as ``bytes``, the way the azure-servicebus SDK writes them itself:
its own tracing adds these properties only when absent, checked by ``bytes`` key, so ``str``
keys would give the AMQP map duplicate keys. ``extract`` accepts ``str`` or ``bytes`` keys and
values (the SDK delivers ``bytes``; the Functions host and the local host deliver ``str``).

``consuming`` gives each handled message a CONSUMER span parented on the message's context, so
the spans of one order (intake, each agent step, each reply) share one trace.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

CONNECTION_STRING_SETTING = "APPLICATIONINSIGHTS_CONNECTION_STRING"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
DIAGNOSTIC_ID = "Diagnostic-Id"

log = logging.getLogger("telemetry")
tracer = trace.get_tracer("orders")

_propagator = TraceContextTextMapPropagator()
_configure_lock = threading.Lock()
_configured = False


def configure(environ: Mapping[str, str] | None = None) -> bool:
    """Export to Application Insights when its connection string is set; True if enabled.

    Once per process. Skipped when a tracer provider is already installed (the Functions
    Python worker configures Azure Monitor itself when PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY
    is set; configuring twice would export everything twice).
    """
    global _configured
    environ = os.environ if environ is None else environ
    if not environ.get(CONNECTION_STRING_SETTING):
        return False
    with _configure_lock:
        if _configured:
            return True
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            from azure.monitor.opentelemetry import configure_azure_monitor

            configure_azure_monitor(connection_string=environ[CONNECTION_STRING_SETTING])
        else:
            log.info("a tracer provider is already installed; not configuring Azure Monitor")
        _configured = True
    return True


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
    context).
    """
    _propagator.inject(properties, context=context, setter=_setter)
    traceparent = properties.get(TRACEPARENT.encode("ascii"))
    if traceparent is not None:
        properties[DIAGNOSTIC_ID.encode("ascii")] = traceparent


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
    """A CONSUMER span for handling ``message`` from ``queue``, child of the sender's span."""
    attributes: dict[str, str] = {
        "messaging.system": "servicebus",
        "messaging.destination.name": queue,
        "messaging.operation.type": "process",
    }
    order_id = getattr(message, "correlation_id", None)
    if order_id:
        attributes["order.id"] = str(order_id)
    message_id = getattr(message, "message_id", None)
    if message_id:
        attributes["messaging.message.id"] = str(message_id)
    with tracer.start_as_current_span(
        name,
        context=extract(message_properties(message)),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
    ) as span:
        yield span
