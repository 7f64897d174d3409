"""A Supervisor tick hands the rows it finds due out through the real broker, and another
instance recovers them as the Functions host hands it the message (the commands trigger's own
code, ``scheduler.functions.on_command``): Azurite, the development broker, two runtimes.

What each costs is counted at the SDK (``adapters.op_counts``): the tick adds, to its 19
requests with nothing due, one transaction and one send per message; each recovery is what the
tick's own recovery is (a point read, the order's transaction, the index row moved on, the
retry command).
"""

from __future__ import annotations

import json
import math

import pytest

from adapters.op_counts import COUNTS
from adapters.store.active_index import INDEX_BUCKETS
from devstack.host.servicebus_runner import to_function_message
from domain.messages import DueRows, encode
from scheduler.functions import on_command
from service import hand_out
from service.intake import handle_submission
from service.sweep import run_tick
from tests.support.app import QueueReader, make_runtime
from tests.support.pattern import new_order, queue

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

ORDERS = 40


def rows_of(message) -> set[str]:  # type: ignore[no-untyped-def]
    body = json.loads(b"".join(message.body))
    return {row["order_id"] for row in body.get("rows", [])}


def take_hand_outs(reader: QueueReader, commands: str, ids: set[str], count: int) -> list:
    """The ``count`` DueRows messages naming this test's orders, as received from the broker."""
    taken = []
    while len(taken) < count:
        message = reader.take_message(
            commands, lambda m: m.subject == "DueRows" and rows_of(m) <= ids, wait=30
        )
        assert message is not None, f"{len(taken)} of {count} hand-outs reached {commands}"
        taken.append(message)
    return taken


async def test_rows_handed_out_through_the_broker_are_recovered_once_by_another_instance(
    env, clock, reader
):
    supervisor = await make_runtime(env, "supervisor", clock)
    worker = await make_runtime(env, "app", clock)
    try:
        ids = set()
        for _ in range(ORDERS):
            order = new_order()
            await handle_submission(encode(order), supervisor)
            ids.add(order.order_id)
        clock.advance(6)  # every step deadline (5 s) passed

        COUNTS.reset()
        report = await run_tick(supervisor)
        tick = COUNTS.snapshot()

        assert (report.handed_out, report.handled, report.left) == (ORDERS, 0, 0)
        per_message = hand_out.rows_per_message(
            supervisor.settings.supervisor_period.total_seconds()
        )
        assert math.ceil(ORDERS / per_message) <= report.messages <= INDEX_BUCKETS
        # The roster read and 16 due-queries, the claim and the checkpoint as with nothing due;
        # then one transaction marking each message's rows and the message itself.
        assert tick == {
            "table.get": INDEX_BUCKETS + 1,
            "table.post": 2 + report.messages,
            "servicebus.send": report.messages,
        }
        commands = queue(supervisor, "commands")
        messages = take_hand_outs(reader, commands, ids, report.messages)
        assert set().union(*(rows_of(m) for m in messages)) == ids

        COUNTS.reset()
        for message in messages:
            await on_command(to_function_message(message), worker)
        recovered = COUNTS.snapshot()

        # Per message, one query reading its rows back and one transaction moving them on;
        # per order, its point read, its transaction and its retry.
        assert recovered == {
            "table.get": report.messages + ORDERS,
            "table.post": report.messages + ORDERS,
            "servicebus.send": ORDERS,
        }
        for order_id in ids:
            timeline = await supervisor.store.get_timeline(order_id)
            released = [e for e in timeline if e.event == "released"]
            assert len(released) == 1 and released[0].actor == f"supervisor:{worker.instance_id}"
        rows = [r async for r in supervisor.store.all_active() if r.order_id in ids]
        assert len(rows) == ORDERS and not any(r.dispatch_id for r in rows)

        # The same messages again (a redelivery): each reads its rows, finds them moved on.
        COUNTS.reset()
        for message in messages:
            await on_command(to_function_message(message), worker)
        assert COUNTS.snapshot() == {"table.get": report.messages}
    finally:
        await worker.close()
        await supervisor.close()


async def test_a_tick_with_a_handful_due_recovers_them_itself(env, clock, reader):
    rt = await make_runtime(env, "supervisor", clock)
    try:
        ids = set()
        for _ in range(3):
            order = new_order()
            await handle_submission(encode(order), rt)
            ids.add(order.order_id)
        clock.advance(6)
        report = await run_tick(rt)
        assert (report.handed_out, report.retried) == (0, 3)
        assert (
            reader.take_message(
                queue(rt, "commands"),
                lambda m: m.subject == DueRows.MESSAGE_TYPE and rows_of(m) & ids,
                wait=1,
            )
            is None
        )
    finally:
        await rt.close()
