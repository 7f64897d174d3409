"""Soak: many orders at a steady rate while hosts are killed; memory, leftovers, invariants.

    python -m benchmarks.soak [--orders 10000] [--rate 8] [--hosts 3]
                              [--kill-min 3 --kill-max 7] [--profile stress] [--seed 7]

Orders are submitted at ``--rate`` per second (paced, by a task beside the watch) through the fault
profile while a function host other than host 0 is SIGKILLed and restarted every
``--kill-min``..``--kill-max`` seconds. Host 0 is never killed: it is the one whose memory is
followed for the whole run. Every 5 s the resident memory (RSS, with child processes) of host
0, Azurite and the broker is sampled. Prints one JSON document:

- ``rss_mib``: per process, after warm-up (the first sample past ``--warmup`` seconds), in the
  middle, at the end, and the peak;
- ``invariants``: those of :mod:`benchmarks.chaos` (lost, stuck, duplicated effects, alerts,
  undo without do, effects left, recovery latency, stalls), each a count that must be 0;
- ``leftovers``: rows that should be gone once every order is finished: active-index rows,
  Error-index rows of orders not in Error, Supervisor member rows of instances dead for longer
  than the reaping delay. Each must be 0.

Exits 1 if an invariant fails or anything is left over.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from adapters.settings import Settings
from adapters.store.records import OrderRecords
from benchmarks.chaos import SweepWatch, judge, make_orders, still_pending
from devstack.orders import open_store, send_orders
from devstack.stack.local_stack import LocalStack
from domain.messages import utc_now
from domain.states import ProcessState
from orderctl.demo import QUICK_SETTINGS
from service.leases import REAP_AFTER_LEASES

SAMPLE_EVERY_S = 5.0
WATCHED = ("host-0", "azurite", "broker")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--orders", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=8.0, help="orders submitted per second")
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--kill-min", type=float, default=3.0)
    parser.add_argument("--kill-max", type=float, default=7.0)
    parser.add_argument("--profile", default="stress")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before memory counts")
    parser.add_argument("--timeout", type=float, default=7200.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.hosts < 2:
        raise SystemExit("--hosts must be at least 2: host 0 is never killed")
    return asyncio.run(run(args))


async def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="soak-"))
    stack = LocalStack(
        workdir, hosts=args.hosts, profile=args.profile, seed=args.seed, overrides=QUICK_SETTINGS
    )
    info = await stack.start(progress=lambda step: print(f"… {step}", file=sys.stderr))
    memory: dict[str, list[tuple[float, float]]] = defaultdict(list)
    try:
        orders = make_orders(args.orders, "order")
        ids = {o.order_id for o in orders}
        store = open_store(info.settings)
        started = time.monotonic()
        sender = asyncio.create_task(send_orders(info.settings, orders, rate=args.rate))
        kills, next_kill, next_sample = 0, started + args.kill_min, started
        pending = set(ids)
        sweeps = SweepWatch()
        while (pending or not sender.done()) and time.monotonic() - started < args.timeout:
            now = time.monotonic()
            if now >= next_sample:
                for name in WATCHED:
                    memory[name].append((now - started, rss_mib(info.pids[name])))
                await sweeps.sample(store)
                next_sample = now + SAMPLE_EVERY_S
            if now >= next_kill:
                victim = rng.randrange(1, args.hosts)
                stack.kill_host(victim)
                stack.restart_host(victim)
                kills += 1
                next_kill = time.monotonic() + rng.uniform(args.kill_min, args.kill_max)
            pending = await still_pending(store, pending)
            if len(pending) % 500 == 0 or not pending:
                print(f"… {len(pending)} orders to go, {kills} kills", file=sys.stderr)
            await asyncio.sleep(1.0)
        finished = time.monotonic() - started
        await sender
        for name in WATCHED:
            memory[name].append((finished, rss_mib(info.pids[name])))
        report = await judge(info, store, ids, sweeps, workdir)
        report["leftovers"] = await leftovers(store, ids, Settings.from_env(info.settings))
        report["rss_mib"] = {name: summary(rss, args.warmup) for name, rss in memory.items()}
        report |= {
            "orders": args.orders,
            "rate": args.rate,
            "hosts": args.hosts,
            "kills": kills,
            "profile": args.profile,
            "seed": args.seed,
            "elapsed_s": round(finished, 1),
            "orders_per_s": round(args.orders / finished, 2),
        }
        report["invariants_hold"] = not any(report["invariants"].values()) and not any(
            report["leftovers"].values()
        )
        await store.close()
    finally:
        stack.stop()
    print(json.dumps(report, indent=2))
    return 0 if report["invariants_hold"] else 1


async def leftovers(store: OrderRecords, ids: set[str], settings: Settings) -> dict[str, int]:
    active = [row async for row in store.all_active()]
    stray_errors = 0
    after = None
    while True:
        page = await store.errors.page(1000, after=after)
        for row in page.rows:
            order = await store.find(row.order_id) if row.order_id in ids else None
            if order is None or order.state is not ProcessState.ERROR:
                stray_errors += 1
        if page.last_key is None:
            break
        after = page.last_key
    # Member rows are reaped by the holder of bucket 0 a few per tick, once long expired; allow
    # two more leases for the reaping itself.
    dead_for = settings.supervisor_lease * (REAP_AFTER_LEASES + 2)
    now = utc_now()
    members = (await store.supervision.read()).members
    return {
        "active_index_rows": len(active),
        "error_index_rows_not_in_error": stray_errors,
        "supervisor_members_long_dead": sum(1 for m in members if m.until < now - dead_for),
    }


def summary(samples: list[tuple[float, float]], warmup: float) -> dict[str, float]:
    warm = [rss for at, rss in samples if at >= warmup] or [samples[-1][1]]
    return {
        "after_warmup": round(warm[0], 1),
        "middle": round(warm[len(warm) // 2], 1),
        "end": round(warm[-1], 1),
        "peak": round(max(warm), 1),
    }


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants, in MiB (0 if it is gone)."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(entry))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, ()))
        try:
            with open(f"/proc/{current}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


if __name__ == "__main__":
    sys.exit(main())
