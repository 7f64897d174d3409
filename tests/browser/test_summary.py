"""The overview's summary (service/operations/summary.py) against Azurite: what it counts, and that
its
cost follows what is in flight, in Error or finished within the window, not the history.

No browser here: these run with the integration tests (``-m "not browser"`` keeps them).
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest

from adapters.op_counts import COUNTS
from adapters.tables import TableService
from benchmarks.history import fill_history, finished_rows
from benchmarks.history import new_order as history_order
from domain.messages import utc_now
from service.operations.summary import Summary
from service.runtime import Runtime
from tests.support.app import app_settings, make_runtime
from tests.support.names import unique_name

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(300),
]

HISTORY = 1_200
"""Over one page of a listing (1,000 rows): a summary that walked the history would make a
request more. How long a summary over 10,000 takes: ``python -m benchmarks.operator_reads``."""
RECENT = 25


async def filled(rt: Runtime, env: dict[str, str]) -> dict:
    """HISTORY orders finished a day ago, and RECENT finished a few minutes ago."""
    workflow = rt.workflow("order@1")
    report = await fill_history(env, workflow, HISTORY)
    recent_at = utc_now() - timedelta(minutes=3)
    async with TableService.from_connection_string(env["StateStorage"]) as service:
        orders = service.get_table_client(rt.settings.orders_table)
        for n in range(RECENT):
            rows = finished_rows(history_order("recent-", n, "order"), workflow, recent_at)
            await orders.submit_transaction([("create", row) for row in rows])
    return report


async def test_a_summary_reads_the_window_not_the_history(servicebus, azurite):
    env = app_settings(
        servicebus, azurite.connection_string, lambda s: f"http://127.0.0.1:9/{s}", unique_name("s")
    )
    rt = await make_runtime(env, "summary")
    try:
        report = await filled(rt, env)
        snapshot, later, cost = await summarized(rt)
    finally:
        await rt.close()
    assert report["orders"] == HISTORY
    # Read in the background, from the queues this worker's tests share: what earlier tests
    # left there is counted too, so only their arrival is asserted.
    assert "total" in later["dead_letters"] and "open" in later["alerts"], later
    finished = snapshot["finished"]
    assert finished["processed"] == RECENT and not finished["partial"]
    assert finished["requests"] == 1, "one query answers the window, whatever the history"
    assert sum(b["processed"] for b in finished["buckets"]) == RECENT
    assert finished["p50_s"] is not None and finished["retries"] == 0
    assert snapshot["in_flight"]["total"] == 0 and snapshot["errors"]["total"] == 0
    # The active index, the Error index, the Processed window, the Supervisor's roster, the
    # agents' circuit rows: one request each (alerts and dead letters are Service Bus peeks,
    # read in the background).
    assert sum(cost.values()) == 5, cost
    circuits = snapshot["circuits"]
    assert [a["agent"] for a in circuits["agents"]] == ["inventory", "payment", "shipping"]
    assert (circuits["rows"], circuits["partial"], circuits["reaped"]) == (0, False, 0)


async def summarized(rt: Runtime) -> tuple[dict, dict, dict[str, int]]:
    """A first summary (what it cost), and one once the background parts are in."""
    summary = Summary(lambda: rt)
    try:
        COUNTS.reset()
        snapshot = await summary.snapshot(900)
        cost = COUNTS.snapshot()
        assert snapshot["dead_letters"] == {"pending": True}, "read in the background"
        deadline = time.monotonic() + 60
        while (await summary.snapshot(900))["dead_letters"].get("pending"):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        later = await summary.snapshot(900)
    finally:
        await summary.close(wait=True)
    return snapshot, later, cost
