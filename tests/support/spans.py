"""Recording the spans a test makes, on the process's one tracer provider."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class _Until(SpanExporter):
    """Hands spans to ``exporter`` until turned off; never shuts it down, so a module-scoped
    block entered again (xdist may run a module's tests in two runs, another module's between)
    records into the same exporter."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter
        self.on = True

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.exporter.export(spans) if self.on else SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.on = False


@contextmanager
def recording(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    """The process's SDK tracer provider, installed if none is (a provider can be set only
    once, and another test module of this worker may have set it), exporting to ``exporter``
    too until the block ends; then the exporter is given nothing more by this block."""
    current = trace.get_tracer_provider()
    installed = current if isinstance(current, TracerProvider) else TracerProvider()
    if installed is not current:
        trace.set_tracer_provider(installed)
    until = _Until(exporter)
    installed.add_span_processor(SimpleSpanProcessor(until))
    try:
        yield installed
    finally:
        until.on = False
