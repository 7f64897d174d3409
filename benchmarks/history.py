"""Flat with history: the same paced load against an empty store and against one holding many
finished orders, in one run. Prints one JSON document.

    python -m benchmarks.history [--orders 2000] [--rate 30] [--history 100000]
                                 [--workflow single_step] [--hosts 2] [--profile clean]

One local stack (Azurite in memory, the broker, the fake services, ``--hosts`` function hosts),
four phases:

1. ``warmup``: ``--warmup`` orders, so that both measured phases start with warm hosts;
2. ``empty``: ``--orders`` orders submitted at ``--rate`` per second; the store holds only the
   warm-up orders;
3. ``fill``: ``--history`` finished orders written straight into the orders table, one batch
   transaction per order (its details, state and timeline rows, made by the functional core and
   the state store's entity helpers, as if each had run: domain.lifecycle, adapters.store.rows).
   Finished orders have no active-index rows. The batches go through the app's own Table
   client (adapters.tables), as the hosts' writes do;
4. ``full``: the same load as ``empty``.

Per measured phase: ``orders_per_s`` (finished orders over first created to last finished),
``latency_s`` (created to final write: p50, p99, max), the Table and Service Bus operations per
order the hosts counted at the SDK, and CPU milliseconds per order of each process (the hosts,
Azurite, the broker): where a history would cost, it shows. Then ``throughput_ratio`` (full /
empty) and ``within_10_percent``. Exits 1 if an order of a measured phase did not finish.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from adapters.settings import Settings
from adapters.store.rows import details_entity, order_entity, timeline_entity
from adapters.tables import TableService
from devstack.observe import FinishWatch, host_operations, host_operations_after, process_cpu
from devstack.orders import open_store, send_orders
from devstack.stack.local_stack import LocalStack, StackInfo
from domain import events, lifecycle
from domain.messages import AgentRequest, AgentResponse, OrderSubmitted, utc_now
from domain.workflows import Workflow, resolve, workflow_ref
from orderctl.demo import QUICK_SETTINGS

POLL_S = 0.25
FILL_AT_ONCE = 6
"""Fill transactions in flight at once (and the Table client's connections)."""
TABLE_API_VERSION = "2019-02-02"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.history", description=__doc__)
    parser.add_argument("--orders", type=int, default=2000, help="orders per measured phase")
    parser.add_argument("--rate", type=float, default=30.0, help="orders submitted per second")
    parser.add_argument("--history", type=int, default=100_000, help="finished orders to add")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--workflow", default="single_step")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--profile", default="clean")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per phase")
    parser.add_argument("--workdir", type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(measure(parse_args(argv)))


async def measure(args: argparse.Namespace) -> int:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="history-"))
    stack = LocalStack(workdir, hosts=args.hosts, profile=args.profile, overrides=QUICK_SETTINGS)
    info = await stack.start(progress=lambda step: print(f"… {step}", file=sys.stderr))
    try:
        settings = Settings.from_env(info.settings)
        ref = workflow_ref(args.workflow, settings.current_version(args.workflow))
        workflow = resolve(settings.workflows(), ref)
        if args.warmup:
            await run_phase(info, workdir, "warmup", args.warmup, args)
        empty = await run_phase(info, workdir, "empty", args.orders, args)
        fill = await fill_history(info.settings, workflow, args.history)
        full = await run_phase(info, workdir, "full", args.orders, args)
    finally:
        stack.stop()
    ratio = full["orders_per_s"] / empty["orders_per_s"] if empty["orders_per_s"] else None
    report = {
        "orders": args.orders,
        "rate": args.rate,
        "workflow": args.workflow,
        "hosts": args.hosts,
        "profile": args.profile,
        "history": args.history,
        "empty": empty,
        "fill": fill,
        "full": full,
        "throughput_ratio": round(ratio, 3) if ratio is not None else None,
        "latency_p50_ratio": _ratio(full["latency_s"]["p50"], empty["latency_s"]["p50"]),
        "within_10_percent": ratio is not None and ratio >= 0.9,
    }
    print(json.dumps(report, indent=2))
    return 0 if empty["not_finished"] == full["not_finished"] == 0 else 1


# --------------------------------------------------------------------------------- load


async def run_phase(
    info: StackInfo, workdir: Path, phase: str, count: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Submit ``count`` orders at ``args.rate``/s, wait for all to finish, report."""
    print(f"… {phase}: {count} orders at {args.rate:g}/s", file=sys.stderr)
    run = uuid.uuid4().hex[:6]
    orders = [new_order(f"{phase}-{run}-", n, args.workflow) for n in range(count)]
    ops_before, cpu_before = host_operations(workdir), process_cpu(info.pids)
    watch = FinishWatch([o.order_id for o in orders], reads_per_poll=200)
    async with open_store(info.settings) as store:
        started = time.monotonic()
        sender = asyncio.create_task(send_orders(info.settings, orders, rate=args.rate))
        try:
            while watch.unfinished and time.monotonic() - started < args.timeout:
                await watch.poll(store)
                await asyncio.sleep(POLL_S)
            await sender
        finally:
            sender.cancel()  # done by now, unless the watch failed: then stop sending
    ended = time.time()
    cpu_after = process_cpu(info.pids)
    ops_after = await host_operations_after(workdir, ended)
    return phase_report(watch.finals.values(), count) | {
        "operations_per_order": per_order(ops_before, ops_after, count),
        "cpu_ms_per_order": {
            name: round((cpu_after[name] - cpu_before.get(name, 0.0)) * 1000 / count, 2)
            for name in sorted(cpu_after)
        },
    }


def new_order(prefix: str, n: int, workflow: str) -> OrderSubmitted:
    return OrderSubmitted(
        order_id=f"{prefix}{n:06d}",
        customer_id=f"customer-{n % 97}",
        items=[{"sku": f"SKU-{n % 13}", "quantity": 1 + n % 3, "unit_price_cents": 999}],
        currency="EUR",
        workflow=workflow,
    )


def phase_report(finals: Any, count: int) -> dict[str, Any]:
    finished = list(finals)
    latencies = sorted((o.updated_at - o.created_at).total_seconds() for o in finished)
    span = (
        (max(o.updated_at for o in finished) - min(o.created_at for o in finished)).total_seconds()
        if finished
        else 0.0
    )
    return {
        "orders": count,
        "finished": len(finished),
        "not_finished": count - len(finished),
        "seconds": round(span, 1),
        "orders_per_s": round(len(finished) / span, 2) if span > 0 else 0.0,
        "latency_s": quantiles(latencies),
    }


def quantiles(ordered: list[float]) -> dict[str, float | None]:
    if not ordered:
        return {"p50": None, "p99": None, "max": None}
    return {
        "p50": round(ordered[len(ordered) // 2], 3),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
        "max": round(ordered[-1], 3),
    }


def per_order(before: Mapping[str, int], after: Mapping[str, int], count: int) -> dict:
    return {
        kind: round((after[kind] - before.get(kind, 0)) / count, 2)
        for kind in sorted(after)
        if after[kind] != before.get(kind, 0)
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


# --------------------------------------------------------------------------------- fill


def finished_rows(submitted: OrderSubmitted, workflow: Workflow, at: datetime) -> list[dict]:
    """The rows of ``submitted`` once every step succeeded, as the state store writes them:
    decided by the functional core, turned into entities by the store's helpers."""
    ctx = events.Context(workflow=workflow, now=at, actor="scheduler:history")
    decision = lifecycle.submit(submitted, ctx)
    order, entries = decision.order, [decision.entry]
    while order is not None and not order.state.terminal:
        decision = lifecycle.decide(order, events.Replied(success(decision)), ctx)
        order = decision.order
        entries.append(decision.entry)
    assert order is not None and order.state.terminal, "a finished order"
    return [
        details_entity(submitted, submitted.content_hash()),
        order_entity(order),
        *(timeline_entity(submitted.order_id, e) for e in entries if e is not None),
    ]


def success(decision: events.Decision) -> AgentResponse:
    """The agent's answer to the request a decision sends: the step took effect."""
    request = next(o.message for o in decision.send if isinstance(o.message, AgentRequest))
    return AgentResponse(
        order_id=request.order_id,
        step=request.step,
        operation=request.operation,
        attempt=request.attempt,
        idempotency_key=request.idempotency_key,
        outcome="succeeded",
        result={"order_id": request.order_id, "status": "done"},
        responded_at=request.requested_at,
    )


async def fill_history(settings: dict[str, str], workflow: Workflow, count: int) -> dict[str, Any]:
    """Write ``count`` finished orders, a day old, one batch transaction each, ``FILL_AT_ONCE``
    at a time."""
    print(f"… fill: {count} finished orders", file=sys.stderr)
    config = Settings.from_env(settings)
    service = TableService.from_connection_string(
        settings["StateStorage"], max_connections=FILL_AT_ONCE
    )
    table = service.get_table_client(config.orders_table)
    at = utc_now() - timedelta(days=1)
    run = uuid.uuid4().hex[:6]
    batches = (
        finished_rows(new_order(f"done-{run}-", n, workflow.name), workflow, at)
        for n in range(count)
    )

    async def writer() -> int:
        """Write the next batch until none is left (the writers share ``batches``)."""
        rows = 0
        for batch in batches:
            rows += len(await table.submit_transaction([("create", row) for row in batch]))
        return rows

    started = time.monotonic()
    try:
        rows = sum(await asyncio.gather(*(writer() for _ in range(FILL_AT_ONCE))))
    finally:
        await service.close()
    seconds = time.monotonic() - started
    return {
        "orders": count,
        "rows": rows,
        "seconds": round(seconds, 1),
        "orders_per_s": round(count / seconds, 1),
    }


if __name__ == "__main__":
    sys.exit(main())
