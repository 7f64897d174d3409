"""Recording the spans a test makes, on the process's one tracer provider."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@contextmanager
def recording(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    """The process's SDK tracer provider, installed if none is (a provider can be set only
    once, and another test module of this worker may have set it), exporting to ``exporter``
    too until the block ends; then the exporter keeps nothing more."""
    current = trace.get_tracer_provider()
    installed = current if isinstance(current, TracerProvider) else TracerProvider()
    if installed is not current:
        trace.set_tracer_provider(installed)
    installed.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        yield installed
    finally:
        exporter.shutdown()
