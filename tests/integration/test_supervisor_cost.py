"""The Supervisor's cost per tick follows the orders due, not those in flight or ever processed.

Each Table request of one tick over the same orders in flight is recorded with its table and
kind (tests.support.table_requests), first with an empty history, then with finished orders in
the store. The tick reads the active-order index and its lease roster only: it makes no request
of the orders table, so the finished orders cannot cost it anything, and the two ticks' requests
are the same. The history is a little over one page of a listing (Azure and Azurite answer at
most 1,000 rows a page), so a tick that walked the orders would also make one request more.
Requests are counted, not timed: the count is the same on a loaded machine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import timedelta

import pytest

from adapters import clients
from adapters.store.active_index import INDEX_BUCKETS
from adapters.store.rows import order_entity
from adapters.tables import TableService
from domain import events, lifecycle
from domain.messages import OrderSubmitted, encode, utc_now
from domain.order import Order, StepState
from domain.states import ProcessState
from service.intake import handle_submission
from service.sweep import run_tick
from tests.support.app import app_settings, make_runtime
from tests.support.table_requests import RequestLog, tally

pytestmark = pytest.mark.anyio

IN_FLIGHT = 5
FINISHED = 1_200
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
    """``FINISHED`` copies of ``template``, ``WRITERS`` at once, by a client of their own (its
    requests are not the tick's)."""
    at_once = asyncio.Semaphore(WRITERS)
    async with TableService.from_connection_string(connection_string) as service:
        table = service.get_table_client(table_name)

        async def write(i: int) -> None:
            done = dataclasses.replace(template, order_id=f"done-{i:05d}")
            async with at_once:
                await table.create_entity(order_entity(done))

        await asyncio.gather(*(write(i) for i in range(FINISHED)))


async def test_tick_cost_ignores_finished_orders(servicebus, azurite, unique_name, monkeypatch):
    env = app_settings(
        servicebus, azurite.connection_string, lambda s: f"http://127.0.0.1:9/{s}", unique_name("c")
    )
    env["STEP_QUEUE_SECONDS"] = "600"  # nothing expires while the history is written
    log = RequestLog(
        {
            env["ORDERS_TABLE"]: "orders",
            env["ACTIVE_ORDERS_TABLE"]: "active",
            env["SUPERVISION_TABLE"]: "supervision",
        }
    )
    monkeypatch.setattr(clients, "COUNTS", log)
    rt = await make_runtime(env, "supervisor")
    try:
        for _ in range(IN_FLIGHT):
            await handle_submission(encode(new_submission()), rt)

        log.take()
        quiet = await run_tick(rt)
        cost_empty_history = tally(log.take())

        template = finished_order(rt)
        await write_history(azurite.connection_string, rt.settings.orders_table, template)

        log.take()
        busy = await run_tick(rt)
        cost_big_history = tally(log.take())
    finally:
        await rt.close()

    assert quiet.due == busy.due == 0
    assert (busy.retried, busy.compensating, busy.failed, busy.flushed) == (0, 0, 0, 0)
    assert "orders" not in cost_big_history, "the tick touched the orders table"
    assert cost_empty_history == cost_big_history
    # One due-query per index bucket, plus the roster: one read, one claim and one checkpoint
    # batch. No order read, nothing else written, nothing sent.
    assert cost_big_history == {
        "active": {"query": INDEX_BUCKETS},
        "supervision": {"batch": 2, "query": 1},
    }
