"""A model of how long a mass stall takes to drain in Azure: stated as a model, calibrated on
what ``benchmarks.mass_stall`` measured and on the published limits of Table Storage and
Service Bus (docs/capacity.md has them with their sources).

    python -m benchmarks.recovery_model [--calibration mass_stall.json] [--orders 100000]

It is a model, not a measurement. What it assumes:

- **An instance recovers at the pace of one core.** A Flex Consumption instance of 2,048 MB has
  about one core and runs one Python worker; the commands trigger runs many recoveries at once
  (``maxConcurrentCalls`` 16 messages of up to 32 rows, ``SUPERVISOR_CONCURRENCY`` rows of each
  at a time), so the network's latency is overlapped and the core is what limits an instance:
  ``UTILISATION`` / (host CPU per recovery, as the local hosts spent it). The local hosts'
  CPU includes what only the local stack spends in them (the local host's own trigger code);
  Azure's network calls cost the same CPU in the SDK or more (TLS), so this is no lower bound.
- **The tick hands out at the pace the fleet keeps** (:mod:`service.hand_out`): each of the 16
  buckets starts at ``FIRST_HAND_OUT`` rows per period and doubles while the fleet moved on all
  it was given, else hands out what was moved on. The first tick comes half a period after the
  stall on average.
- **Every limit is a rate**: per recovery, the Table requests and Service Bus operations the
  local run counted at the SDK, against the account's 20,000 requests a second, the index
  bucket's 2,000 entities a second (each recovery writes its row twice: the hand-out and the
  move on; the tick reads it once), and a Standard namespace's 1,000 credits a second (a send or
  a receive: one credit per message; settlements counted too, as docs/capacity.md does for the
  worse case). The fleet's rate is the lowest of these.
- **Only the recovery is modelled.** A recovered order retries after its retry delay and then
  does its own work, which spends the namespace's credits like any order (docs/capacity.md:
  about 14 per three-step order on Standard, whose 1,000 a second carry about 70 such orders a
  second). A hundred thousand orders resumed at once take Standard 20 minutes and more whatever
  the Supervisor does, and while they run they take the credits the recovery needs: after a
  stall that size, the namespace must be Premium (no credit limit; its messaging units are
  sized by CPU, for which Microsoft publishes no messages-per-second figure).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from adapters.store.active_index import INDEX_BUCKETS
from service.hand_out import FIRST_HAND_OUT, MAX_READ, ROWS_PER_MESSAGE

TABLE_ACCOUNT_PER_S: Final = 20_000
"""Requests a second per storage account (Scalability targets for Table storage)."""
TABLE_PARTITION_ENTITIES_PER_S: Final = 2_000
"""Entities a second per partition: one index bucket."""
SB_STANDARD_CREDITS_PER_S: Final = 1_000
"""Credits a second per Standard namespace; a send or receive costs one per message."""
PRODUCTION_PERIOD_S: Final = 15.0
FLEETS: Final = (1, 2, 5, 10, 20, 50, 100)
"""Instance counts: up to the Bicep's maximumInstanceCount (docs/capacity.md)."""
UTILISATION: Final = 0.8
"""Of an instance's core, what the model lets recoveries use (the rest: the host, the GC)."""
INDEX_WRITES_PER_RECOVERY: Final = 2
INDEX_READS_PER_RECOVERY: Final = 1
CPU: Final = "instances' CPU"


@dataclass(frozen=True)
class Calibration:
    """What one recovery costs, as the local stack measured it."""

    host_cpu_ms: float
    """Host CPU per recovery (all hosts, over the drain, divided by the orders)."""
    table_requests: float
    servicebus_credits: float
    """Sends and receives, and settlements (the worse case of docs/capacity.md)."""
    measured_per_host_per_s: float
    source: str

    @property
    def per_instance_per_s(self) -> float:
        return UTILISATION * 1000.0 / self.host_cpu_ms


def calibrate(summary: Mapping[str, Any]) -> Calibration | None:
    """From a mass_stall summary: the run with one host, which spends no CPU on idle peers;
    None if no run recovered every order."""
    counts = sorted(int(k) for k in summary if k.isdigit() and summary[k].get("runs"))
    if not counts:
        return None
    one = summary[str(counts[0])]
    ops = one["operations_per_recovery"]
    table = sum(v for k, v in ops.items() if k.startswith("table."))
    credits = sum(
        v
        for k, v in ops.items()
        if k in ("servicebus.send", "servicebus.receive", "servicebus.complete")
    )
    return Calibration(
        host_cpu_ms=one["host_cpu_ms_per_recovery"],
        table_requests=round(table, 3),
        servicebus_credits=round(credits, 3),
        measured_per_host_per_s=one["recoveries_per_s_per_host"],
        source=f"benchmarks.mass_stall, {counts[0]} host(s), median of {one['runs']} runs",
    )


@dataclass(frozen=True)
class Limit:
    name: str
    per_s: float


def limits(calibration: Calibration, instances: int) -> list[Limit]:
    """Each limit as recoveries a second, lowest first."""
    per_bucket = TABLE_PARTITION_ENTITIES_PER_S / (
        INDEX_WRITES_PER_RECOVERY + INDEX_READS_PER_RECOVERY
    )
    found = [
        Limit(CPU, instances * calibration.per_instance_per_s),
        Limit("Table account", TABLE_ACCOUNT_PER_S / calibration.table_requests),
        Limit("Table partition (index buckets)", INDEX_BUCKETS * per_bucket),
        Limit(
            "Service Bus Standard credits",
            SB_STANDARD_CREDITS_PER_S / calibration.servicebus_credits,
        ),
    ]
    return sorted(found, key=lambda limit: limit.per_s)


def drain_s(due: int, rate: float, period_s: float) -> float:
    """Seconds from the stall until the last of ``due`` rows is recovered, at ``rate`` a second
    once handed out, the hand-out pacing itself as :mod:`service.hand_out` does."""
    per_bucket_cap = FIRST_HAND_OUT
    left, queued, elapsed = due, 0.0, period_s / 2
    while left > 0 or queued > 0:
        cap = min(INDEX_BUCKETS * per_bucket_cap, INDEX_BUCKETS * MAX_READ)
        handed = min(left, cap)
        left -= handed
        queued += handed
        capacity = rate * period_s
        if queued <= capacity:
            elapsed += queued / rate
            if left == 0:
                return elapsed
            elapsed += period_s - queued / rate
            moved_on, queued = queued, 0.0
            per_bucket_cap = max(FIRST_HAND_OUT, math.ceil(2 * moved_on / INDEX_BUCKETS))
        else:
            queued -= capacity
            elapsed += period_s
            per_bucket_cap = max(FIRST_HAND_OUT, math.ceil(capacity / INDEX_BUCKETS))
    return elapsed


def report(
    calibration: Calibration | None,
    *,
    orders: Sequence[int] = (1_000, 10_000, 100_000),
    fleets: Sequence[int] = FLEETS,
    period_s: float = PRODUCTION_PERIOD_S,
) -> dict[str, Any]:
    if calibration is None:
        return {"calibration": None, "note": "no run recovered every order: nothing to go on"}
    rows = []
    for instances in fleets:
        found = limits(calibration, instances)
        rate = found[0].per_s
        rows.append(
            {
                "instances": instances,
                "recoveries_per_s": round(rate, 1),
                "binds": found[0].name,
                "drain_s": {str(n): round(drain_s(n, rate, period_s), 1) for n in orders},
            }
        )
    return {
        "calibration": asdict(calibration)
        | {"per_instance_per_s": round(calibration.per_instance_per_s, 1)},
        "period_s": period_s,
        "limits_per_s": {
            limit.name: round(limit.per_s, 1)
            for limit in limits(calibration, 1)
            if limit.name != CPU
        },
        "rows_per_message": ROWS_PER_MESSAGE,
        "fleets": rows,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.recovery_model", description=__doc__
    )
    parser.add_argument(
        "--calibration", type=Path, required=True, help="a benchmarks.mass_stall JSON document"
    )
    parser.add_argument("--orders", default="1000,10000,100000")
    parser.add_argument("--period", type=float, default=PRODUCTION_PERIOD_S)
    args = parser.parse_args(argv)
    calibration = calibrate(json.loads(args.calibration.read_text())["summary"])
    orders = [int(n) for n in args.orders.split(",")]
    print(json.dumps(report(calibration, orders=orders, period_s=args.period), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
