"""Outage run: one remote service answers nothing but 503 for a while, with a backlog of orders
waiting on it; once it is back, every order must end Processed (an outage delays orders, it does
not fail them), and every invariant of the chaos run must hold. Prints one JSON document; exits 1
if an order did not end Processed or an invariant failed.

    python -m benchmarks.outage [--orders 200] [--service payment] [--outage-seconds 60]

How it holds: each agent's circuit breaker opens after a few consecutive failures; while it is
open, the agent answers "deferred, retry at T" without calling, and the Scheduler re-arms the step
for T without counting a failure (domain.lifecycle).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.chaos import check_invariants, make_orders, still_pending
from devstack.observe import host_invocations
from devstack.orders import open_store, send_orders
from devstack.stack.local_stack import LocalStack
from orderctl.demo import QUICK_SETTINGS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.outage", description=__doc__)
    parser.add_argument("--orders", type=int, default=200)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument(
        "--service", default="payment", choices=["inventory", "payment", "shipping"]
    )
    parser.add_argument("--outage-seconds", type=float, default=60.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--workdir", type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


async def run(args: argparse.Namespace) -> int:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="outage-"))
    stack = LocalStack(workdir, hosts=args.hosts, profile="clean", overrides=QUICK_SETTINGS)
    info = await stack.start(progress=lambda step: print(f"… {step}", file=sys.stderr))
    try:
        down = {"services": {args.service: {"transient_rate": 1.0}}}
        await set_profile(info.fakes_url, down)
        orders = make_orders(args.orders, "order")
        ids = {o.order_id for o in orders}
        store = open_store(info.settings)
        started = time.monotonic()
        await send_orders(info.settings, orders)
        print(f"… {args.service} is down for {args.outage_seconds:.0f} s", file=sys.stderr)
        await asyncio.sleep(args.outage_seconds)
        await set_profile(info.fakes_url, {})
        recovered = time.monotonic()
        print(f"… {args.service} is back", file=sys.stderr)
        pending = set(ids)
        while pending and time.monotonic() - started < args.timeout:
            pending = await still_pending(store, pending)
            await asyncio.sleep(0.5)
        finished = time.monotonic()
        report = await check_invariants(info, store, ids)
        processed = report["states"].get("Processed", 0)
        report |= {
            "orders": args.orders,
            "service_down": args.service,
            "outage_s": args.outage_seconds,
            "drained_after_recovery_s": round(finished - recovered, 1),
            "retries": host_invocations(workdir, "scheduler_commands"),
            "all_processed": processed == args.orders,
        }
        await store.close()
    finally:
        stack.stop()
    print(json.dumps(report, indent=2))
    return 0 if report["invariants_hold"] and report["all_processed"] else 1


async def set_profile(fakes_url: str, profile: dict) -> None:
    """The fakes' fault profile (``{}``: clean)."""
    async with httpx.AsyncClient(timeout=10) as http:
        (await http.post(f"{fakes_url}/_profile", json=profile)).raise_for_status()


if __name__ == "__main__":
    sys.exit(main())
