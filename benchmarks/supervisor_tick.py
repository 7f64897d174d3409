"""What one Supervisor tick costs against how many orders are in flight and how many are due.

    python -m benchmarks.supervisor_tick [--in-flight 0,1000,5000] [--due 100]

Runs the real tick (service/sweep.py) against the Table store on a fresh in-memory Azurite,
with the in-memory bus (the sends are counted, not delivered). Orders are created as intake
creates them (domain.lifecycle.submit + one create transaction), with a long step budget so none
is due; then ``--due`` more with a budget that has passed, which the tick must recover. Table
requests are counted at the SDK pipeline (adapters.op_counts). Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from adapters import clients
from adapters.op_counts import COUNTS
from adapters.settings import Connection, Settings
from adapters.store.active_index import INDEX_BUCKETS
from adapters.store.records import OrderRecords
from devstack.memory import MemoryBus
from devstack.stack.azurite import AzuriteProcess
from domain import events, lifecycle
from domain.messages import OrderSubmitted, utc_now
from domain.workflows import ORDER_WORKFLOW, Workflow
from service import apply
from service.runtime import Runtime
from service.sweep import run_tick

QUEUES = {
    name: name
    for name in ("orders", "commands", "responses", "alerts", "inventory", "payment", "shipping")
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.supervisor_tick", description=__doc__
    )
    parser.add_argument("--in-flight", default="0,1000,5000", help="orders in flight, ascending")
    parser.add_argument("--due", type=int, default=100)
    parser.add_argument("--workers", type=int, default=8, help="orders created at once")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    azurite = AzuriteProcess(Path(tempfile.mkdtemp(prefix="tick-")))
    account = azurite.start()
    try:
        results = asyncio.run(measure(args, account.connection_string))
    finally:
        azurite.stop()
    print(json.dumps({"buckets": INDEX_BUCKETS, "ticks": results}, indent=2))
    return 0


async def measure(args: argparse.Namespace, connection_string: str) -> list[dict[str, object]]:
    """One tick at each number of orders in flight, then one with ``--due`` orders due."""
    rt = await runtime(connection_string)
    try:
        results = []
        created = 0
        for in_flight in [int(n) for n in args.in_flight.split(",")]:
            await create(rt, in_flight - created, budget=timedelta(hours=1), workers=args.workers)
            created = in_flight
            results.append({"in_flight": in_flight, "due": 0, **await tick(rt)})
        await create(rt, args.due, budget=timedelta(seconds=1), workers=args.workers)
        await asyncio.sleep(1.5)
        results.append({"in_flight": created + args.due, "due": args.due, **await tick(rt)})
        return results
    finally:
        await rt.close()


async def runtime(connection_string: str) -> Runtime:
    settings = Settings(
        queues=QUEUES,
        service_urls={},
        servicebus=Connection("servicebus"),
        storage=Connection("storage", connection_string=connection_string),
        clock_skew=timedelta(0),  # one machine, one clock
    )
    store = OrderRecords(clients.table_service(settings.storage))
    await store.ensure_tables()
    return Runtime(
        settings=settings,
        store=store,
        bus=MemoryBus(),  # type: ignore[arg-type]
        workflows=settings.workflows(),
        instance_id="supervisor-bench",
        rng=random.Random(1),
    )


async def create(rt: Runtime, count: int, *, budget: timedelta, workers: int) -> None:
    """``count`` orders as intake creates them, ``workers`` at once."""
    steps = tuple(
        replace(step, complete_by_budget=budget, queue_budget=timedelta(0))
        for step in ORDER_WORKFLOW.steps
    )
    flow = Workflow(name=ORDER_WORKFLOW.name, steps=steps, retry=ORDER_WORKFLOW.retry)
    run = uuid.uuid4().hex[:6]
    at_once = asyncio.Semaphore(workers)

    async def one(n: int) -> None:
        submitted = OrderSubmitted(
            order_id=f"tick-{run}-{n:06d}",
            customer_id="c-1",
            items=[{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 100}],
            currency="EUR",
        )
        ctx = events.Context(workflow=flow, now=utc_now(), actor="scheduler:bench")
        decision = lifecycle.submit(submitted, ctx)
        assert decision.order is not None and decision.entry is not None
        async with at_once:
            await rt.store.create(
                submitted, decision.order, decision.entry, due=apply.due(rt, decision.order)
            )

    await asyncio.gather(*(one(n) for n in range(count)))


async def tick(rt: Runtime) -> dict[str, object]:
    COUNTS.reset()
    started = time.perf_counter()
    report = await run_tick(rt)
    elapsed = time.perf_counter() - started
    return {
        "tick_s": round(elapsed, 3),
        "table_requests": sum(COUNTS.snapshot().values()),
        "by_kind": COUNTS.snapshot(),
        "recovered": report.retried + report.compensating + report.failed,
        "rows_due": report.due,
    }


if __name__ == "__main__":
    sys.exit(main())
