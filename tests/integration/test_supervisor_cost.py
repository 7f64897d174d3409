"""The Supervisor's cost per tick follows the orders due, not those in flight or ever processed.

Table requests are counted at the SDK pipeline (adapters.op_counts) for one tick over the same
orders in flight, first with an empty history, then with 10,000 finished orders in the store,
then once the orders in flight are due.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import timedelta

import pytest
from azure.data.tables.aio import TableServiceClient

from adapters.op_counts import COUNTS
from adapters.store.active_index import INDEX_BUCKETS
from adapters.store.rows import order_entity
from domain import events, lifecycle
from domain.messages import OrderSubmitted, encode, utc_now
from domain.order import Order, StepState
from domain.states import ProcessState
from service.intake import handle_submission
from service.sweep import run_tick
from tests.support.app import app_settings, make_runtime

pytestmark = pytest.mark.anyio

IN_FLIGHT = 5
FINISHED = 10_000
WRITERS = 8


def new_submission() -> OrderSubmitted:
    return OrderSubmitted(
        order_id=f"o-{uuid.uuid4().hex[:12]}",
        customer_id="c-1",
        items=[{"sku": "S", "quantity": 1, "unit_price_cents": 100}],
        currency="EUR",
    )


def finished_order(rt) -> Order:
    """A Processed order as the store writes it, a day old: what a scan would wade through."""
    ctx = events.Context(
        workflow=rt.workflow("order"), now=utc_now() - timedelta(days=1), actor="scheduler:old"
    )
    created = lifecycle.submit(new_submission(), ctx).order
    assert created is not None
    steps = tuple(dataclasses.replace(s, state=StepState.SUCCEEDED) for s in created.steps)
    return dataclasses.replace(
        created,
        state=ProcessState.PROCESSED,
        locked_by=None,
        complete_by=None,
        steps=steps,
        outbox=(),
    )


async def write_history(connection_string: str, table_name: str, template: Order) -> None:
    """``FINISHED`` copies of ``template`` written by azure-data-tables (the reference client),
    ``WRITERS`` at once."""
    at_once = asyncio.Semaphore(WRITERS)
    async with TableServiceClient.from_connection_string(connection_string) as service:
        table = service.get_table_client(table_name)

        async def write(i: int) -> None:
            done = dataclasses.replace(template, order_id=f"done-{i:05d}")
            async with at_once:
                await table.create_entity(order_entity(done))

        await asyncio.gather(*(write(i) for i in range(FINISHED)))


async def test_tick_cost_ignores_finished_orders(servicebus, azurite, unique_name):
    env = app_settings(
        servicebus, azurite.connection_string, lambda s: f"http://127.0.0.1:9/{s}", unique_name("c")
    )
    env["STEP_QUEUE_SECONDS"] = "600"  # nothing expires while the history is written
    rt = await make_runtime(env, "supervisor")
    try:
        for _ in range(IN_FLIGHT):
            await handle_submission(encode(new_submission()), rt)

        COUNTS.reset()
        quiet = await run_tick(rt)
        cost_empty_history = COUNTS.snapshot()

        template = finished_order(rt)
        await write_history(azurite.connection_string, rt.settings.orders_table, template)

        COUNTS.reset()
        busy = await run_tick(rt)
        cost_big_history = COUNTS.snapshot()
    finally:
        await rt.close()

    assert quiet.due == busy.due == 0
    assert (busy.retried, busy.compensating, busy.failed, busy.flushed) == (0, 0, 0, 0)
    assert cost_empty_history == cost_big_history
    # One due-query per index bucket, plus the roster: one read, one claim and one checkpoint
    # batch. No order read, nothing else written, nothing sent.
    assert cost_big_history == {"table.get": INDEX_BUCKETS + 1, "table.post": 2}
