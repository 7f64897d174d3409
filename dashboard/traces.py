"""An order's span trees for the dashboard's trace panel, from the local telemetry files.

Locally (``orderctl up --telemetry``: the TELEMETRY_DIR setting) the app writes its spans to
files (:mod:`adapters.trace_files`); the panel shows the order's as a tree per trace, each span with
its offset and duration. In Azure there are no files: the spans are in Application Insights,
where the order's trace id is the operation id to search for (Transaction search), so the
answer says that instead. Reads only; nothing here writes. :mod:`adapters.trace_files` (which
imports the OpenTelemetry SDK) is imported on the first read, not with the app.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from adapters.trace_files import Node, Trace

MAX_SPANS: Final = 2000
"""Spans returned at most (the earliest): enough for an order retried many times, and a page
that stays fast; ``orderctl trace ID`` prints them all."""
IN_AZURE: Final = (
    "Spans are not kept by the app here: search the order's trace id as the operation id in "
    "Application Insights (Transaction search) to see them. Locally, start the stack with "
    "`orderctl up --telemetry` to see them on this page."
)
NO_SPANS_YET: Final = (
    "No spans of this order in the telemetry files yet: they are written every few seconds, "
    "and only while the stack runs with --telemetry."
)


def telemetry_dir(settings: Mapping[str, str]) -> Path | None:
    """The local telemetry directory the app writes to, if any (the TELEMETRY_DIR setting)."""
    from adapters.telemetry import TELEMETRY_DIR_SETTING

    value = (settings.get(TELEMETRY_DIR_SETTING) or "").strip()
    return Path(value) if value else None


def order_trace(order_id: str, directory: Path | None) -> dict[str, Any]:
    """The trace panel's data: ``local`` False (and what to do instead) without a directory,
    else the order's traces as trees (:func:`traces_body`)."""
    if directory is None:
        return {"order_id": order_id, "local": False, "hint": IN_AZURE, "traces": []}
    from adapters.trace_files import build_traces, read_spans

    spans = read_spans(directory, order_id) if directory.is_dir() else []
    kept = spans[:MAX_SPANS]
    return {
        "order_id": order_id,
        "local": True,
        "span_count": len(spans),
        "truncated": len(spans) > len(kept),
        "hint": None if spans else NO_SPANS_YET,
        "traces": traces_body(build_traces(kept)),
    }


def traces_body(traces: list[Trace]) -> list[dict[str, Any]]:
    """Each trace with its root spans as nested JSON, offsets from the first trace's start."""
    from adapters.trace_files import origin

    if not traces:
        return []
    first = traces[0].start
    return [
        {
            "trace_id": found.trace_id,
            "start": found.start.isoformat(),
            "offset_ms": _ms((found.start - first).total_seconds()),
            "duration_ms": _ms((found.end - found.start).total_seconds()),
            "why": origin(found) if n else None,
            "spans": [
                _node(root, min(r.span.start_ns for r in found.roots)) for root in found.roots
            ],
        }
        for n, found in enumerate(traces)
    ]


def _node(node: Node, base_ns: int) -> dict[str, Any]:
    span = node.span
    return {
        "name": span.name,
        "kind": span.kind,
        "role": span.role,
        "start": span.start.isoformat(),
        "offset_ms": _ms((span.start_ns - base_ns) / 1e9),
        "duration_ms": _ms(node.duration.total_seconds()),
        "status": span.status,
        "status_description": span.status_description,
        "attributes": dict(span.attributes),
        "orphan": node.orphan,
        "children": [_node(child, base_ns) for child in node.children],
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
