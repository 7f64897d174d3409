"""How long the operator's reads take: the dead-letter listing and the overview's summary over a
history of finished orders. Prints one JSON document.

    python -m benchmarks.operator_reads [--rounds 3] [--history 10000]

Starts its own Azurite (in memory) and development broker (devstack/servicebus/Config.json), and
runs against them what ``GET /api/dead-letters`` and the overview run
(service.operations.dead_letters, service.operations.summary):

- ``dead_letters``: one cold listing (the links to the seven dead-letter queues not open yet:
  they are opened at once) and ``--rounds`` warm ones (the kept links reused);
- ``summary``: the overview's first snapshot over ``--history`` orders finished a day ago, with
  its Table requests (benchmarks.history's fill writes the history).

Each figure is set beside its target (``targets_s``; ``within_targets`` says whether all were
met). These were wall-time assertions of tests (test_dead_letter_speed, test_summary) until a
loaded machine made them fail; the tests now assert what the design guarantees (links opened,
peeks and requests made), and the times are measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from adapters.op_counts import COUNTS
from adapters.settings import Settings
from adapters.store.records import OrderRecords
from benchmarks.history import fill_history
from devstack.stack.azurite import AzuriteProcess
from devstack.stack.broker import DEFAULT_CONFIG, BrokerProcess
from devstack.stack.local_stack import base_settings
from orderctl.local import LocalOperations
from service.operations.summary import Summary
from service.runtime import Runtime, new_instance_id

TARGETS_S: Final = {"dead_letters_cold": 3.0, "dead_letters_warm": 1.0, "summary": 10.0}
SUMMARY_WINDOW_S: Final = 900


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.operator_reads", description=__doc__
    )
    parser.add_argument("--rounds", type=int, default=3, help="warm dead-letter listings")
    parser.add_argument("--history", type=int, default=10_000, help="finished orders")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="operator-reads-"))
    azurite = AzuriteProcess(workdir / "azurite")
    broker = BrokerProcess([DEFAULT_CONFIG], log_path=workdir / "broker.log")
    try:
        account = azurite.start()
        broker.start()
        env = base_settings() | {
            "StateStorage": account.connection_string,
            "ServiceBusConnection": broker.connection_string,
        }
        result = asyncio.run(measure(args, env))
    finally:
        broker.stop()
        azurite.stop()
    print(json.dumps(result, indent=2))
    return 0


async def measure(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    rt = Runtime.from_settings(
        Settings.from_env(env), OrderRecords, instance_id=new_instance_id("bench")
    )
    await rt.store.ensure_tables()
    try:
        dead_letters = await dead_letter_listings(rt, args.rounds)
        fill = await fill_history(env, rt.workflow("order"), args.history)
        summary = await first_summary(rt)
    finally:
        await rt.close()
    met = {
        "dead_letters_cold": dead_letters["cold_s"] <= TARGETS_S["dead_letters_cold"],
        "dead_letters_warm": max(dead_letters["warm_s"]) <= TARGETS_S["dead_letters_warm"],
        "summary": summary["seconds"] <= TARGETS_S["summary"],
    }
    return {
        "dead_letters": dead_letters,
        "history": fill,
        "summary": summary,
        "targets_s": TARGETS_S,
        "met": met,
        "within_targets": all(met.values()),
    }


async def dead_letter_listings(rt: Runtime, rounds: int) -> dict[str, Any]:
    ops = LocalOperations(rt)
    try:
        started = time.perf_counter()
        first = await ops.dead_letter_summary()
        cold = time.perf_counter() - started
        warm = []
        for _ in range(rounds):
            started = time.perf_counter()
            await ops.dead_letter_summary()
            warm.append(round(time.perf_counter() - started, 3))
    finally:
        await ops.close()
    return {"queues": len(first.queues), "cold_s": round(cold, 3), "warm_s": warm}


async def first_summary(rt: Runtime) -> dict[str, Any]:
    summary = Summary(lambda: rt)
    try:
        COUNTS.reset()
        started = time.perf_counter()
        snapshot = await summary.snapshot(SUMMARY_WINDOW_S)
        seconds = time.perf_counter() - started
        requests = COUNTS.snapshot()
    finally:
        await summary.close(wait=True)
    return {
        "seconds": round(seconds, 3),
        "table_requests": requests,
        "finished_in_window": snapshot["finished"]["processed"],
    }


if __name__ == "__main__":
    sys.exit(main())
