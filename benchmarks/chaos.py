"""Chaos run: SIGKILL function hosts at random while orders flow through flaky remote services,
then check every invariant of the design. Prints one JSON document; exits 1 if any invariant
fails.

    python -m benchmarks.chaos [--orders 200] [--hosts 2] [--kill-every 5] [--profile flaky]

Invariants checked (DESIGN.md):
- every order ends Processed, or Error with an alert;
- no remote effect happened twice for one idempotency key (the fakes' ledger);
- no order stalled longer than step budget + one Supervisor period + the longest retry delay
  (+ the supervisor lease a killed leader leaves behind, + the time a killed host takes to
  come back), measured on each order's timeline.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

from core.messages import OrderSubmitted
from core.settings import Settings
from core.states import ProcessState
from devstack.demo import QUICK_SETTINGS
from devstack.observe import alerted_orders, all_active, duplicated_effects
from devstack.orders import open_store, send_orders
from devstack.stack.local_stack import LocalStack
from supervisor.leader import LEASE_SECONDS

SUPERVISOR_PERIOD_S = 2.0  # QUICK_SETTINGS' */2 schedule
RESTART_ALLOWANCE_S = 15.0  # a killed host is back and receiving within this


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    parser.add_argument("--orders", type=int, default=200)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds between kills")
    parser.add_argument("--profile", default="flaky")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
    stack = LocalStack(
        workdir, hosts=args.hosts, profile=args.profile, seed=args.seed, overrides=QUICK_SETTINGS
    )
    info = stack.start(progress=lambda step: print(f"… {step}", file=sys.stderr))
    try:
        run = uuid.uuid4().hex[:6]
        orders = [
            OrderSubmitted(
                order_id=f"chaos-{run}-{n:05d}",
                customer_id="customer-1",
                items=[{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 500}],
                currency="EUR",
            )
            for n in range(args.orders)
        ]
        ids = {o.order_id for o in orders}
        store = open_store(info.settings)
        started = time.monotonic()
        send_orders(info.settings, orders)
        kills = 0
        # The first kill comes early, while the first orders are surely still in flight.
        next_kill = started + min(args.kill_every, 2.0)
        pending = set(ids)
        while pending and time.monotonic() - started < args.timeout:
            if time.monotonic() >= next_kill:
                victim = rng.randrange(args.hosts)
                stack.kill_host(victim)
                kills += 1
                print(f"… killed host {victim}, restarting it", file=sys.stderr)
                stack.restart_host(victim)
                next_kill = time.monotonic() + args.kill_every
            active = {row.order_id for row in all_active(store)}
            for order_id in [o for o in pending if o not in active][:100]:
                process = store.find_process(order_id)
                if process is not None and process.state.terminal:
                    pending.discard(order_id)
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        report = check_invariants(info, store, ids, pending)
        report |= {
            "orders": args.orders,
            "hosts": args.hosts,
            "kills": kills,
            "profile": args.profile,
            "elapsed_s": round(elapsed, 1),
        }
        store.close()
    finally:
        stack.stop()
    print(json.dumps(report, indent=2))
    return 0 if report["invariants_hold"] else 1


def check_invariants(info, store, ids: set[str], pending: set[str]) -> dict:
    settings = Settings.from_env(info.settings)
    flow = settings.workflows()["order"]
    budget = max(step.complete_by_budget.total_seconds() for step in flow.steps)
    bound = (
        budget
        + SUPERVISOR_PERIOD_S
        + flow.retry.cap.total_seconds()
        + LEASE_SECONDS
        + RESTART_ALLOWANCE_S
    )
    alerted = alerted_orders(info.settings)
    states: dict[str, int] = {}
    errors_without_alert = []
    max_stall = 0.0
    for order_id in sorted(ids):
        process = store.find_process(order_id)
        state = process.state if process else None
        states[str(state)] = states.get(str(state), 0) + 1
        if state is ProcessState.ERROR and order_id not in alerted:
            errors_without_alert.append(order_id)
        times = [entry.at for entry in store.get_timeline(order_id)]
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
        max_stall = max([max_stall, *gaps])
    duplicates = duplicated_effects(info.fakes_url, ids)
    return {
        "states": states,
        "not_terminal": sorted(pending),
        "errors_without_alert": errors_without_alert,
        "duplicated_effects": duplicates,
        "max_stall_s": round(max_stall, 1),
        "stall_bound_s": round(bound, 1),
        "invariants_hold": not pending
        and not errors_without_alert
        and duplicates == 0
        and max_stall <= bound,
    }


if __name__ == "__main__":
    sys.exit(main())
