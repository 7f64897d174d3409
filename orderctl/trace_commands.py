"""`orderctl trace`: an order's spans, read from the telemetry files the hosts write,
as a tree across every queue hop, with durations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from devstack.stack.local_stack import DEFAULT_WORKDIR, StackInfo, telemetry_dir
from orderctl.app import app, emit, fail, output
from orderctl.options import Json, Wide, Workdir
from orderctl.output import TraceSpanView, TraceTreeView, TraceView
from orderctl.plain_text import printable


@app.command("trace")
def trace_order(
    order_id: Annotated[str, typer.Argument(help="the order whose spans to show")],
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            metavar="DIR",
            help="the telemetry files' directory [default: the stack's, WORKDIR/telemetry]",
            show_default=False,
        ),
    ] = None,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Print an order's spans as a tree, from its submission or intake to its last reply,
    across every queue hop, with durations. Reads the files `orderctl up --telemetry` (or
    `demo --telemetry`) has the hosts write; spans reach them within a few seconds."""
    from adapters.trace_files import build_traces, read_spans
    from domain.ids import InvalidId, validate_order_id

    screen = output(json_out, wide)
    try:
        validate_order_id(order_id)
    except InvalidId as error:
        raise fail(f"not an order id: {error}", 2) from None
    if directory is None:
        directory = telemetry_dir(workdir.resolve(), StackInfo.read(workdir.resolve()))
    if not directory.is_dir():
        raise fail(
            f"no telemetry directory {directory}: start the stack with `orderctl up "
            "--telemetry` (or `orderctl demo --telemetry`), run the order, then trace it; "
            "or name the directory with --dir",
            2,
        )
    spans = read_spans(directory, order_id)
    if not spans:
        raise fail(
            f"no spans for order {order_id} in {directory}: it ran without telemetry, or its "
            "spans are not written yet (hosts write them every 2 s). Telemetry is on for a "
            "stack started with `orderctl up --telemetry`",
            2,
        )
    view = trace_view(order_id, directory, build_traces(spans))
    emit(view, show_trace, screen)


def trace_view(order_id: str, directory: Path, traces: list[Any]) -> TraceView:
    from adapters.trace_files import origin

    def span_view(node: Any, start: Any) -> TraceSpanView:
        return TraceSpanView(
            name=node.name,
            kind=node.kind,
            role=node.span.role,
            start=node.start,
            offset_ms=round((node.start - start).total_seconds() * 1000, 3),
            duration_ms=round(node.duration.total_seconds() * 1000, 3),
            status=node.span.status,
            attributes=dict(node.attributes),
            orphan=node.orphan,
            children=[span_view(child, start) for child in node.children],
        )

    first = traces[0].start
    return TraceView(
        order_id=order_id,
        directory=str(directory),
        span_count=sum(1 for t in traces for root in t.roots for _ in root.walk()),
        traces=[
            TraceTreeView(
                trace_id=found.trace_id,
                start=found.start,
                offset_ms=round((found.start - first).total_seconds() * 1000, 3),
                duration_ms=round((found.end - found.start).total_seconds() * 1000, 3),
                why="" if n == 0 else origin(found),
                spans=[span_view(root, found.start) for root in found.roots],
            )
            for n, found in enumerate(traces)
        ],
    )


def show_trace(view: TraceView, screen: Console) -> None:
    from rich.tree import Tree

    many = len(view.traces) > 1
    screen.print(
        Text.assemble(
            "order ", (printable(view.order_id), "bold"), f": {view.span_count} spans",
            f" in {len(view.traces)} traces" if many else "", f" (from {view.directory})",
        )
    )  # fmt: skip
    if many:
        screen.print(
            Text(
                "its hops are in several traces, in time order below: each says why it is "
                "not part of the first",
                style="dim",
            )
        )
    for n, found in enumerate(view.traces):
        head = Text.assemble(
            (f"trace {found.trace_id}", "bold"),
            f"  {duration_text(found.duration_ms)}",
            (f"  +{found.offset_ms / 1000:.3f} s after the first" if n else "", "dim"),
        )
        screen.print()
        screen.print(head)
        if found.why:
            screen.print(Text(f"why a trace of its own: {printable(found.why)}", style="yellow"))
        for root in found.spans:
            tree = Tree(span_label(root), guide_style="dim")
            add_spans(tree, span_children(root))
            screen.print(tree)


def span_children(span: TraceSpanView) -> list[TraceSpanView]:
    """What hangs under ``span`` as printed: an invocation's app span (same name) is folded
    into its line, so its children are the invocation's."""
    inner = app_span(span)
    if inner is None:
        return span.children
    others = [c for c in span.children if c is not inner]
    return sorted(others + inner.children, key=lambda c: c.offset_ms)


def app_span(span: TraceSpanView) -> TraceSpanView | None:
    """The app's span under a host's invocation span (adapters.telemetry.consuming), if any."""
    if span.kind not in ("CONSUMER", "SERVER"):
        return None
    return next((c for c in span.children if c.name == span.name and c.kind == "INTERNAL"), None)


def add_spans(tree: Any, spans: list[TraceSpanView]) -> None:
    for span in spans:
        add_spans(tree.add(span_label(span)), span_children(span))


def span_label(span: TraceSpanView) -> Text:
    inner = app_span(span)
    shown = inner or span
    parts: list[Any] = [
        (f"+{span.offset_ms / 1000:.3f} s ", "dim"),
        (printable(span.name), "bold"),
        "  ",
        (duration_text(shown.duration_ms), "cyan"),
    ]
    if inner is not None:
        parts.append((f" (invocation {duration_text(span.duration_ms)})", "dim"))
    else:
        parts.append((f" {span.kind.lower()}", "dim"))
    queue = shown.attributes.get("messaging.destination.name")
    if queue:
        parts.append(f"  queue {printable(str(queue))}")
    if span.role and span.role != "host":
        parts.append((f"  [{printable(span.role)}]", "dim"))
    failed = next((s for s in (span, shown) if s.status == "ERROR"), None)
    if failed is not None:
        parts.append(("  failed", "bold red"))
    if span.orphan:
        parts.append(("  (its parent span was not found)", "yellow"))
    return Text.assemble(*parts)


def duration_text(ms: float) -> str:
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.1f} ms"
