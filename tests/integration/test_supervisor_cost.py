"""The Supervisor's cost per tick follows the orders in flight, not the orders ever processed.

Table requests are counted at the SDK pipeline (core.op_counts) for one tick over the same
orders in flight, first with an empty history, then with 10,000 finished orders in the store.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from azure.data.tables import TableServiceClient

from core.messages import OrderSubmitted, encode, utc_now
from core.op_counts import COUNTS
from scheduler.intake import handle_submission
from supervisor.tick import run_tick
from tests.support.app import app_settings, make_runtime

IN_FLIGHT = 5
FINISHED = 10_000


def finished_process_row(order_id: str) -> dict:
    """What a scan of the orders table would have to wade through: one per finished order."""
    now = utc_now()
    return {
        "PartitionKey": order_id,
        "RowKey": "process",
        "OrderID": order_id,
        "Workflow": "order",
        "ProcessState": "Processed",
        "FailureCount": 0,
        "Attempt": 3,
        "CreatedAt": now - timedelta(days=1),
        "UpdatedAt": now - timedelta(days=1),
    }


def test_tick_cost_ignores_finished_orders(servicebus, azurite, unique_name):
    env = app_settings(
        servicebus, azurite.connection_string, lambda s: f"http://127.0.0.1:9/{s}", unique_name("c")
    )
    env["STEP_TIMEOUT_SECONDS"] = "600"  # nothing expires while the history is written
    rt = make_runtime(env, "supervisor")
    try:
        for _ in range(IN_FLIGHT):
            order = OrderSubmitted(
                order_id=f"o-{uuid.uuid4().hex[:12]}",
                customer_id="c-1",
                items=[{"sku": "S", "quantity": 1, "unit_price_cents": 100}],
                currency="EUR",
            )
            handle_submission(encode(order), rt)

        COUNTS.reset()
        quiet = run_tick(rt)
        cost_empty_history = COUNTS.snapshot()

        table = TableServiceClient.from_connection_string(
            azurite.connection_string
        ).get_table_client(rt.settings.orders_table)

        def write(i: int) -> None:
            table.create_entity(finished_process_row(f"done-{i:05d}"))

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(write, range(FINISHED)))

        COUNTS.reset()
        busy = run_tick(rt)
        cost_big_history = COUNTS.snapshot()
    finally:
        rt.close()

    assert quiet.scanned == busy.scanned == IN_FLIGHT
    assert cost_empty_history == cost_big_history
    # one index page plus one point read per order in flight
    assert sum(cost_big_history.values()) == 1 + IN_FLIGHT
