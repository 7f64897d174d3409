"""The local telemetry files: their record format, and one order's spans read back as trees.

With TELEMETRY_DIR set, each process appends JSON lines to ``spans-<role>-<pid>.jsonl`` and
``metrics-<role>-<pid>.jsonl`` in that directory, through :class:`FileSpanExporter` and
:class:`FileMetricExporter` (:func:`install`: :func:`adapters.telemetry.configure` calls it).
One line, one span (:func:`span_record`) or one data point (:func:`metric_records`), so files
from several processes can be read together, while they are being written (a torn last line is
skipped). This module imports the OpenTelemetry SDK; the app imports it only when it writes
files.

Reading is pure but for the directory listing: :func:`read_spans` finds one order's spans,
:func:`build_traces` arranges any set of spans into trees by parent, one per trace, in time
order. ``orderctl trace`` prints them; the dashboard's trace panel shows the same
(:mod:`dashboard.traces`).

**Which spans are the order's.** The app's span of every hop carries ``order.id``
(:func:`adapters.telemetry.consuming`). The order's spans are those, their ancestors (the client's
submit span, the host's invocation spans, the Supervisor tick that sent a retry) and their
descendants (the calls and sends made while handling the order). An ancestor's other
children (a tick that swept other orders too) are left out.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.metrics.export import Sum as SumData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

log = logging.getLogger("telemetry")

SPANS_GLOB: Final = "spans-*.jsonl"
METRICS_GLOB: Final = "metrics-*.jsonl"
ORDER_ID_ATTRIBUTE: Final = "order.id"


def file_name(kind: str, role: str, pid: int) -> str:
    """``spans-host-1234.jsonl``: one file per kind, role and process (no two writers)."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in role) or "process"
    return f"{kind}-{safe}-{pid}.jsonl"


# ------------------------------------------------------------------------------ writing


def _value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {str(k): _value(v) for k, v in (attributes or {}).items()}


def span_record(span: ReadableSpan, role: str, pid: int) -> dict[str, Any]:
    """The JSON object a finished span is written as."""
    context = span.get_span_context()
    assert context is not None, "a finished span has a context"
    parent = span.parent
    return {
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "name": span.name,
        "kind": span.kind.name,
        "start_ns": span.start_time or 0,
        "end_ns": span.end_time or span.start_time or 0,
        "status": span.status.status_code.name,
        "status_description": span.status.description,
        "attributes": _attributes(span.attributes),
        "links": [
            {"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
            for link in span.links
        ],
        "role": role,
        "pid": pid,
    }


def metric_records(data: MetricsData, role: str, pid: int) -> Iterator[dict[str, Any]]:
    """One JSON object per data point: a sum's or gauge's ``value``; a histogram's ``count``,
    ``sum``, ``min``, ``max`` and buckets. Counters and histograms are exported as deltas."""
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                common = {"name": metric.name, "unit": metric.unit, "role": role, "pid": pid}
                for point in metric.data.data_points:
                    record: dict[str, Any] = {
                        "time": _iso(point.time_unix_nano),
                        **common,
                        "attributes": _attributes(point.attributes),
                    }
                    if isinstance(metric.data, HistogramData):
                        record |= {
                            "type": "histogram",
                            "count": point.count,
                            "sum": point.sum,
                            "min": point.min,
                            "max": point.max,
                            "bounds": list(point.explicit_bounds),
                            "buckets": list(point.bucket_counts),
                        }
                    elif isinstance(metric.data, SumData | Gauge):
                        kind = "sum" if isinstance(metric.data, SumData) else "gauge"
                        record |= {"type": kind, "value": point.value}
                    else:
                        continue
                    yield record


def _iso(unix_ns: int) -> str:
    return datetime.fromtimestamp(unix_ns / 1e9, UTC).isoformat()


class _JsonLines:
    """Appends JSON lines to one file, a batch per write (readers see whole lines)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def append(self, records: Iterable[Mapping[str, Any]]) -> bool:
        text = "".join(json.dumps(r, default=str, separators=(",", ":")) + "\n" for r in records)
        if not text:
            return True
        try:
            with self._lock, self.path.open("a", encoding="utf-8") as out:
                out.write(text)
            return True
        except OSError as exc:
            log.warning("telemetry: cannot append to %s: %s", self.path, exc)
            return False


class FileSpanExporter(SpanExporter):
    def __init__(self, path: Path, role: str, pid: int) -> None:
        self._out = _JsonLines(path)
        self._role, self._pid = role, pid

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        ok = self._out.append(span_record(span, self._role, self._pid) for span in spans)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class FileMetricExporter(MetricExporter):
    def __init__(self, path: Path, role: str, pid: int) -> None:
        # Counters and histograms as deltas: each line is what happened in its interval, and
        # lines from many processes add up. Gauges stay cumulative: their last value repeats.
        delta = AggregationTemporality.DELTA
        super().__init__(preferred_temporality={Counter: delta, Histogram: delta})
        self._out = _JsonLines(path)
        self._role, self._pid = role, pid

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        ok = self._out.append(metric_records(metrics_data, self._role, self._pid))
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


# ------------------------------------------------------------------------------ reading


def install(directory: Path, role: str) -> None:
    """Make this process's files in ``directory`` the global tracer and meter providers."""
    from azure.core.settings import settings

    tracer_provider, meter_provider = file_providers(directory, role)
    trace.set_tracer_provider(tracer_provider)
    # The Azure SDKs' own spans, as the distro's azure-sdk instrumentation records them in Azure.
    settings.tracing_implementation = "opentelemetry"
    otel_metrics.set_meter_provider(meter_provider)
    log.info("telemetry: writing spans and metrics to %s", directory)


SPAN_FLUSH_S: Final = 2.0
METRIC_FLUSH_S: Final = 5.0


def file_providers(
    directory: Path,
    role: str,
    *,
    span_flush_s: float = SPAN_FLUSH_S,
    metric_flush_s: float = METRIC_FLUSH_S,
) -> tuple[Any, Any]:
    """An SDK TracerProvider and MeterProvider appending JSON lines to this process's files in
    ``directory`` (created if missing), through batch processors; both flush at exit. Installs
    nothing: :func:`install` makes them the global providers."""
    directory.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    resource = Resource.create({"service.name": f"orders-{role}", "process.pid": pid})
    spans = FileSpanExporter(directory / file_name("spans", role, pid), role, pid)
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(
        BatchSpanProcessor(spans, schedule_delay_millis=span_flush_s * 1000)
    )
    points = FileMetricExporter(directory / file_name("metrics", role, pid), role, pid)
    reader = PeriodicExportingMetricReader(points, export_interval_millis=metric_flush_s * 1000)
    return tracer_provider, MeterProvider(metric_readers=[reader], resource=resource)


@dataclass(frozen=True, slots=True)
class SpanRecord:
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    status: str = "UNSET"
    status_description: str | None = None
    role: str = ""

    @property
    def start(self) -> datetime:
        return datetime.fromtimestamp(self.start_ns / 1e9, UTC)

    @property
    def duration(self) -> timedelta:
        return timedelta(microseconds=max(0, self.end_ns - self.start_ns) / 1000)


def parse_span(line: str) -> SpanRecord | None:
    """A span from one line of a spans file; None for anything else (a torn last line)."""
    try:
        raw = json.loads(line)
        attributes = raw.get("attributes") or {}
        if not isinstance(attributes, dict):
            return None
        return SpanRecord(
            trace_id=str(raw["trace_id"]),
            span_id=str(raw["span_id"]),
            parent_id=str(raw["parent_id"]) if raw.get("parent_id") else None,
            name=str(raw["name"]),
            kind=str(raw.get("kind", "INTERNAL")),
            start_ns=int(raw["start_ns"]),
            end_ns=int(raw.get("end_ns") or raw["start_ns"]),
            attributes=attributes,
            status=str(raw.get("status") or "UNSET"),
            status_description=raw.get("status_description"),
            role=str(raw.get("role") or ""),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def span_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(SPANS_GLOB))


def iter_spans(directory: Path) -> Iterator[SpanRecord]:
    for path in span_files(directory):
        with path.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                span = parse_span(line)
                if span is not None:
                    yield span


def read_spans(directory: Path, order_id: str) -> list[SpanRecord]:
    """Every span of ``order_id`` in the files in ``directory`` (module docstring)."""
    return order_spans(iter_spans(directory), order_id)


def order_spans(spans: Iterable[SpanRecord], order_id: str) -> list[SpanRecord]:
    """Of ``spans``, the order's: those naming it, their ancestors and their descendants."""
    by_id: dict[str, SpanRecord] = {}
    children: dict[str, list[str]] = {}
    seeds: list[str] = []
    for span in spans:
        if span.span_id in by_id:
            continue  # the same span exported twice
        by_id[span.span_id] = span
        if span.parent_id is not None:
            children.setdefault(span.parent_id, []).append(span.span_id)
        if span.attributes.get(ORDER_ID_ATTRIBUTE) == order_id:
            seeds.append(span.span_id)
    chosen: set[str] = set()
    stack = list(seeds)
    while stack:
        span_id = stack.pop()
        if span_id not in chosen:
            chosen.add(span_id)
            stack.extend(children.get(span_id, ()))
    for seed in seeds:
        parent = by_id[seed].parent_id
        while parent is not None and parent in by_id and parent not in chosen:
            chosen.add(parent)  # without its other children: they may be other orders'
            parent = by_id[parent].parent_id
    return sorted((by_id[s] for s in chosen), key=lambda s: (s.start_ns, s.span_id))


# ---------------------------------------------------------------------------- the trees


@dataclass(slots=True)
class Node:
    """One span in a tree. ``orphan``: its parent span is not among those read (not written
    yet, or lost with a process killed before it flushed)."""

    span: SpanRecord
    children: list[Node] = field(default_factory=list)
    orphan: bool = False

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def kind(self) -> str:
        return self.span.kind

    @property
    def start(self) -> datetime:
        return self.span.start

    @property
    def duration(self) -> timedelta:
        return self.span.duration

    @property
    def attributes(self) -> Mapping[str, Any]:
        return self.span.attributes

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            yield from child.walk()


@dataclass(frozen=True, slots=True)
class Trace:
    trace_id: str
    roots: tuple[Node, ...]

    @property
    def start(self) -> datetime:
        return min(root.start for root in self.roots)

    @property
    def end(self) -> datetime:
        return max(n.start + n.duration for root in self.roots for n in root.walk())


def build_traces(spans: Sequence[SpanRecord]) -> list[Trace]:
    """``spans`` as trees by parent, one :class:`Trace` per trace id, earliest first; children
    in start order. Each span appears once (the first copy of one exported twice); a span whose
    parent is missing is a root marked ``orphan``. The order of ``spans`` does not matter."""
    unique: dict[str, SpanRecord] = {}
    for span in sorted(spans, key=_order):
        unique.setdefault(span.span_id, span)
    nodes = {span_id: Node(span) for span_id, span in unique.items()}
    roots: dict[str, list[Node]] = {}
    for node in sorted(nodes.values(), key=lambda n: _order(n.span)):
        parent_id = node.span.parent_id
        parent = nodes.get(parent_id) if parent_id is not None else None
        if (
            parent is not None
            and parent.span.trace_id == node.span.trace_id
            and not _loops(node, nodes)
        ):
            parent.children.append(node)
        else:
            node.orphan = parent_id is not None
            roots.setdefault(node.span.trace_id, []).append(node)
    traces = [Trace(trace_id, tuple(found)) for trace_id, found in roots.items()]
    return sorted(traces, key=lambda t: (t.start, t.trace_id))


def _order(span: SpanRecord) -> tuple[int, str]:
    return (span.start_ns, span.span_id)


def _loops(node: Node, nodes: Mapping[str, Node]) -> bool:
    """Whether following parents from ``node`` comes back to it (corrupt ids): such a node is
    made a root, so every span is printed once and the walk ends."""
    seen = {node.span.span_id}
    parent_id = node.span.parent_id
    while parent_id is not None and parent_id in nodes:
        if parent_id in seen:
            return True
        seen.add(parent_id)
        parent_id = nodes[parent_id].span.parent_id
    return False


def origin(found: Trace) -> str:
    """How a trace holding part of an order began, in words: why those hops are not in the
    order's first trace."""
    root = min(found.roots, key=lambda n: (n.span.start_ns, n.span.span_id))
    if root.orphan:
        return (
            f"its first span ({root.name}) names a parent that is not in the files: not "
            "written yet (a few seconds), or lost with a process that was killed"
        )
    if root.name == "supervisor_tick":
        return (
            "the Supervisor's timer tick recovered the order (a retry, a resend or an undo) "
            "without the order's trace context: the order records none (created before "
            "orders recorded it, or without tracing), so what the tick sent starts a trace"
        )
    if root.kind == "SERVER":
        return (
            f"an HTTP request ({root.name}) started it: an operator action on an order that "
            "records no trace context (created before orders recorded it, or without tracing)"
        )
    queue = root.attributes.get("messaging.destination.name") or next(
        (
            c.attributes.get("messaging.destination.name")
            for c in root.children
            if c.name == root.name
        ),
        None,
    )
    if root.kind == "CONSUMER" and queue:
        return (
            f"a message on {queue} arrived without the order's trace context ({root.name}): "
            "its sender traced nothing, e.g. an operator action run in orderctl or the demo "
            "process, or a sender without telemetry"
        )
    return f"it starts at {root.name}, which did not carry the order's trace context"
