"""Reading the local telemetry files back (adapters.trace_files): one order's spans, arranged in
trees by parent whatever order the files list them in, with parts missing or written twice."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.trace_files import (
    Node,
    SpanRecord,
    build_traces,
    order_spans,
    parse_span,
    read_spans,
)


def span(
    span_id: str,
    parent_id: str | None = None,
    *,
    trace_id: str = "t1",
    start: int = 0,
    end: int | None = None,
    name: str = "",
    order_id: str | None = None,
) -> SpanRecord:
    attributes = {"order.id": order_id} if order_id else {}
    return SpanRecord(
        trace_id=trace_id,
        span_id=span_id,
        parent_id=parent_id,
        name=name or span_id,
        kind="INTERNAL",
        start_ns=start,
        end_ns=start + 10 if end is None else end,
        attributes=attributes,
    )


@st.composite
def forests(draw: st.DrawFn) -> list[SpanRecord]:
    """1-3 traces, each a random tree; a child starts no earlier than its parent."""
    spans: list[SpanRecord] = []
    for t in range(draw(st.integers(1, 3))):
        base = draw(st.integers(0, 10**6))
        size = draw(st.integers(1, 12))
        starts: list[int] = []
        for i in range(size):
            parent = draw(st.integers(0, i - 1)) if i else None
            start = (starts[parent] if parent is not None else base) + draw(st.integers(0, 500))
            starts.append(start)
            parent_id = f"{t}-{parent}" if parent is not None else None
            spans.append(span(f"{t}-{i}", parent_id, trace_id=f"trace-{t}", start=start))
    return spans


def flatten(nodes: tuple[Node, ...] | list[Node]) -> list[Node]:
    return [n for root in nodes for n in root.walk()]


def placed_parents(spans: list[SpanRecord]) -> dict[str, str | None]:
    """Each span id and the span id it was placed under (None: a root)."""
    placed: dict[str, str | None] = {}
    for found in build_traces(spans):
        for root in found.roots:
            placed[root.span.span_id] = None
            for node in root.walk():
                for child in node.children:
                    placed[child.span.span_id] = node.span.span_id
    return placed


@settings(max_examples=200, deadline=None)
@given(spans=forests(), seed=st.randoms(use_true_random=False))
def test_the_trees_do_not_depend_on_the_order_spans_are_read_in(spans, seed) -> None:
    shuffled = list(spans)
    seed.shuffle(shuffled)
    traces = build_traces(shuffled)
    assert placed_parents(shuffled) == {s.span_id: s.parent_id for s in spans}
    assert len(traces) == len({s.trace_id for s in spans})
    assert [t.start for t in traces] == sorted(t.start for t in traces)
    for found in traces:
        assert len(found.roots) == 1 and not found.roots[0].orphan
        for node in found.roots[0].walk():
            starts = [c.start for c in node.children]
            assert starts == sorted(starts)
            assert all(c.span.trace_id == found.trace_id for c in node.children)


@settings(max_examples=200, deadline=None)
@given(
    spans=forests(),
    keep=st.lists(st.booleans(), min_size=1),
    twice=st.lists(st.booleans(), min_size=1),
    seed=st.randoms(use_true_random=False),
)
def test_missing_and_doubled_spans_each_appear_once(spans, keep, twice, seed) -> None:
    """Spans lost (a process killed before it flushed) or exported twice: every span read is
    in the trees exactly once, under its own parent when that was read, else a marked root."""
    kept = [s for i, s in enumerate(spans) if keep[i % len(keep)]]
    read = kept + [s for i, s in enumerate(kept) if twice[i % len(twice)]]
    seed.shuffle(read)
    traces = build_traces(read)
    nodes = flatten([r for t in traces for r in t.roots])
    assert Counter(n.span.span_id for n in nodes) == Counter({s.span_id: 1 for s in kept})
    present = {s.span_id for s in kept}
    placed = placed_parents(read)
    for node in nodes:
        parent_id = node.span.parent_id
        if parent_id in present:
            assert placed[node.span.span_id] == parent_id
        else:
            assert placed[node.span.span_id] is None
            assert node.orphan == (parent_id is not None)


def test_corrupt_parent_ids_that_loop_still_show_every_span_once() -> None:
    spans = [span("a", "b", start=1), span("b", "a", start=2), span("c", "a", start=3)]
    nodes = flatten([r for t in build_traces(spans) for r in t.roots])
    assert sorted(n.span.span_id for n in nodes) == ["a", "b", "c"]


def test_an_orders_spans_are_its_own_their_ancestors_and_descendants() -> None:
    """A Supervisor tick that swept two orders: each order's view has the tick, not the other
    order's hops; a call made while handling the order has no order id but is included."""
    spans = [
        span("tick", start=0, name="supervisor_tick"),
        span("cmd-a", "tick", start=1, name="scheduler_commands", order_id="A"),
        span("http-a", "cmd-a", start=2, name="POST"),
        span("cmd-b", "tick", start=1, name="scheduler_commands", order_id="B"),
        span("http-b", "cmd-b", start=2, name="POST"),
        span("invocation", "http-a", start=3, name="payment_agent"),
        span("agent-a", "invocation", start=4, name="payment_agent", order_id="A"),
        span("unrelated", start=5, name="scheduler_intake", order_id="C"),
    ]
    random.Random(7).shuffle(spans)
    assert {s.span_id for s in order_spans(spans, "A")} == {
        "tick",
        "cmd-a",
        "http-a",
        "invocation",
        "agent-a",
    }
    assert {s.span_id for s in order_spans(spans, "B")} == {"tick", "cmd-b", "http-b"}
    assert order_spans(spans, "nobody") == []


def test_lines_that_are_not_spans_are_skipped(tmp_path: Path) -> None:
    good = {
        "trace_id": "t",
        "span_id": "s",
        "parent_id": None,
        "name": "scheduler_intake",
        "kind": "CONSUMER",
        "start_ns": 1_700_000_000_000_000_000,
        "end_ns": 1_700_000_000_004_000_000,
        "attributes": {"order.id": "ORD-1"},
    }
    lines = [
        json.dumps(good),
        "not json",
        json.dumps({**good, "span_id": "x", "start_ns": "soon"}),
        json.dumps({**good, "span_id": "y", "attributes": ["a"]}),
        json.dumps([1, 2]),
        '{"trace_id": "t", "span',
    ]
    (tmp_path / "spans-host-1.jsonl").write_text("\n".join(lines))
    (tmp_path / "metrics-host-1.jsonl").write_text(json.dumps(good))  # not a spans file
    (found,) = read_spans(tmp_path, "ORD-1")
    assert found.name == "scheduler_intake"
    assert found.duration.total_seconds() == 0.004
    assert parse_span("") is None


def test_an_empty_or_missing_directory_has_no_spans(tmp_path: Path) -> None:
    assert read_spans(tmp_path, "ORD-1") == []
    assert read_spans(tmp_path / "absent", "ORD-1") == []


def test_origin_says_why_a_trace_is_separate() -> None:
    from adapters.trace_files import origin

    def only(*spans: SpanRecord) -> str:
        (found,) = build_traces(list(spans))
        return origin(found)

    assert "Supervisor's timer tick" in only(span("t", name="supervisor_tick"))
    assert "not in the files" in only(span("c", "gone", name="scheduler_commands"))
    invocation = SpanRecord("t", "i", None, "payment_agent", "CONSUMER", 0, 5, {})
    app_span = SpanRecord(
        "t", "a", "i", "payment_agent", "INTERNAL", 1, 4, {"messaging.destination.name": "pay-q"}
    )
    assert "a message on pay-q arrived without the order's trace context" in only(
        invocation, app_span
    )
    server = SpanRecord("t", "h", None, "operator_resubmit", "SERVER", 0, 5, {})
    assert "HTTP request (operator_resubmit)" in only(server)
