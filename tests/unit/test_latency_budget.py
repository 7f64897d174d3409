"""benchmarks.latency cuts an order's time into hops from its spans: each handler's span into its
Table requests, sends, remote call and own work; the gaps from a send to the next handler into
the queues. Checked on hand-made spans whose hops are known."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from adapters.trace_files import SpanRecord
from benchmarks.latency import budgets, medians, summary
from benchmarks.peers import paced

REMOTE = "http://127.0.0.1:9000"
TABLES = "http://127.0.0.1:10002/devstoreaccount1"
T0 = 1_700_000_000.0
_ids = itertools.count(1)


def span(
    name: str,
    start_ms: float,
    end_ms: float,
    parent: SpanRecord | None = None,
    *,
    kind: str = "CLIENT",
    trace: str = "t1",
    **attributes: Any,
) -> SpanRecord:
    return SpanRecord(
        trace_id=trace,
        span_id=f"{next(_ids):016x}",
        parent_id=parent.span_id if parent else None,
        name=name,
        kind=kind,
        start_ns=int((T0 + start_ms / 1000) * 1e9),
        end_ns=int((T0 + end_ms / 1000) * 1e9),
        attributes=attributes,
    )


def handler(
    name: str, start: float, end: float, parent: SpanRecord | None, order: str, trace: str
) -> SpanRecord:
    return span(
        name,
        start,
        end,
        parent,
        kind="INTERNAL",
        trace=trace,
        **{"messaging.destination.name": "q", "order.id": order},
    )


def one_step_order(order: str = "o-1", trace: str = "t1", shift: float = 0.0) -> list[SpanRecord]:
    """Submitted at 0: intake 10-20 (table 11-15, send 16-19), agent 25-40 (call 27-33, send
    34-38), reply handling 45-60 (table 46-52, send 53-57)."""
    s = shift
    intake = handler("scheduler_intake", 10 + s, 20 + s, None, order, trace)
    agent = handler("inventory_agent", 25 + s, 40 + s, intake, order, trace)
    replies = handler("scheduler_replies", 45 + s, 60 + s, agent, order, trace)
    return [
        intake,
        span("POST", 11 + s, 15 + s, intake, trace=trace, **{"url.full": f"{TABLES}/$batch"}),
        span("ServiceBus.send", 16 + s, 19 + s, intake, trace=trace),
        agent,
        span("POST", 27 + s, 33 + s, agent, trace=trace, **{"url.full": f"{REMOTE}/inventory"}),
        span("ServiceBus.send", 34 + s, 38 + s, agent, trace=trace),
        replies,
        span("POST", 46 + s, 52 + s, replies, trace=trace, **{"url.full": f"{TABLES}/$batch"}),
        span("ServiceBus.send", 53 + s, 57 + s, replies, trace=trace),
    ]


def at(ms: float) -> datetime:
    return datetime.fromtimestamp(T0 + ms / 1000, UTC)


def test_every_hop_of_a_one_step_order() -> None:
    hops = budgets(one_step_order(), {"o-1": at(0)}, REMOTE)["o-1"]
    expected = {
        "submit_to_intake": 10,
        "intake": (16 - 10) - 4,  # up to its send's start: the rest is beside the next hop
        "request_queue": 25 - 16,
        "agent": (34 - 25) - 6,
        "remote_call": 6,
        "reply_queue": 45 - 34,
        "reply_handling": 15 - 6 - 4,
        "table": 4 + 6,
        "send": 4,  # the last handler's; the others' are in the queue hops
        "total": 60,
    }
    assert {k: round(v * 1000, 3) for k, v in hops.items()} == expected
    assert sum(v for k, v in expected.items() if k != "total") == expected["total"]


def test_an_order_whose_trace_is_incomplete_or_retried_is_left_out() -> None:
    spans = one_step_order()
    no_reply = [s for s in spans if s.name != "scheduler_replies"]
    assert budgets(no_reply, {"o-1": at(0)}, REMOTE) == {}
    agent = next(s for s in spans if s.name == "inventory_agent")
    retried = [*spans, handler("inventory_agent", 70, 80, agent, "o-1", "t1")]
    assert budgets(retried, {"o-1": at(0)}, REMOTE) == {}
    assert budgets(spans, {"someone-else": at(0)}, REMOTE) == {}


def test_orders_are_told_apart_by_trace_and_summarised_in_milliseconds() -> None:
    spans = one_step_order("o-1", "t1") + one_step_order("o-2", "t2", shift=100)
    per_order = budgets(spans, {"o-1": at(0), "o-2": at(90)}, REMOTE)
    assert per_order["o-2"]["submit_to_intake"] == pytest.approx(0.020, abs=1e-6)
    assert per_order["o-2"]["total"] == pytest.approx(0.070, abs=1e-6)
    table = summary(per_order)
    assert table["submit_to_intake"]["p99"] == pytest.approx(20, abs=0.2)
    assert table["remote_call"] == {"p50": 6.0, "p99": 6.0}
    assert medians([table, table])["total"] == table["total"]


def test_a_paced_order_is_built_when_its_slot_comes_not_a_slot_earlier() -> None:
    """benchmarks.peers stamps ``submitted_at`` when it builds an order: built before the wait
    for its slot, every paced order's latency would include up to a slot (1/rate)."""
    rate = 50.0
    built: list[float] = []

    def orders() -> Iterator[int]:
        for n in range(5):
            built.append(time.monotonic())
            yield n

    async def take() -> tuple[float, list[int]]:
        started = time.monotonic()
        return started, [n async for n in paced(orders(), rate)]

    started, taken = asyncio.run(take())
    assert taken == [0, 1, 2, 3, 4]
    for n, at_ in enumerate(built):
        assert at_ >= started + n / rate - 0.002, (
            f"order {n} built {started + n / rate - at_} s early"
        )
