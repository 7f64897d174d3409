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
- **The tick hands out at the pace the fleet keeps** (:func:`service.hand_out.allowance`, over
  the 16 buckets together): at first ``first_hand_out`` rows a bucket, then twice what the fleet
  moved on in the last period while it moved on all it was given, else what it moved on. The
  first tick comes half a period after the stall on average. What the fleet did not move on by
  the next tick comes back due (a message's lease is 13 s at the production period) and waits
  for a later tick; a message of 32 rows is recovered in a small part of that lease.
- **Every limit is a rate**: per recovery, the Table requests and Service Bus operations the
  code makes (the integration tests pin them: the order's read and transaction and its retry
  command; per message of ``rows_per_message`` rows, a mark, a query and a move on, a send, a
  receive and a completion), against the account's 20,000 requests a second, the index
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
from service.hand_out import MAX_READ, Pace, allowance, rows_per_message

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


ORDER_TABLE_REQUESTS: Final = 2
"""Per recovery: the order's point read and its transaction
(tests/integration/test_supervisor_hand_out.py pins them)."""
RETRY_SENDS: Final = 1
"""Per recovery: the retry command it schedules."""
MESSAGE_TABLE_REQUESTS: Final = 3
"""Per DueRows message: the tick's mark, the instance's query and its move on."""
MESSAGE_CREDITS: Final = 3
"""Per DueRows message: its send, its receive and its completion (settlements counted)."""


@dataclass(frozen=True)
class Calibration:
    """What one recovery costs: its CPU as the local stack measured it; its requests as the
    code makes them (pinned by tests), at the message size of the modelled period."""

    host_cpu_ms: float
    """Host CPU per recovery (the hosts over the drain, divided by the orders)."""
    rows_per_message: int
    measured_per_host_per_s: float
    measured_table_requests: float
    measured_servicebus_credits: float
    """What the local run counted per recovery (its messages were smaller, at its period, and
    some rows were handed out twice): for comparison."""
    tick_s_per_message: float
    """The tick's time per message it handed out (its mark and its send: the sends go one after
    another), as host 0 logged it."""
    source: str

    @property
    def per_instance_per_s(self) -> float:
        return UTILISATION * 1000.0 / self.host_cpu_ms

    @property
    def table_requests(self) -> float:
        return ORDER_TABLE_REQUESTS + MESSAGE_TABLE_REQUESTS / self.rows_per_message

    @property
    def servicebus_credits(self) -> float:
        return RETRY_SENDS + MESSAGE_CREDITS / self.rows_per_message


def calibrate(
    summary: Mapping[str, Any], period_s: float = PRODUCTION_PERIOD_S
) -> Calibration | None:
    """From a mass_stall summary: the run with one host, which spends no CPU on idle peers;
    None if no run recovered every order."""
    counts = sorted(int(k) for k in summary if k.isdigit() and summary[k].get("runs"))
    if not counts:
        return None
    one = summary[str(counts[0])]
    ops = one["operations_per_recovery"]
    credits = ("servicebus.send", "servicebus.receive", "servicebus.complete")
    return Calibration(
        host_cpu_ms=one["host_cpu_ms_per_recovery"],
        rows_per_message=rows_per_message(period_s),
        measured_per_host_per_s=one["recoveries_per_s_per_host"],
        measured_table_requests=round(sum(v for k, v in ops.items() if k.startswith("table.")), 3),
        measured_servicebus_credits=round(sum(v for k, v in ops.items() if k in credits), 3),
        tick_s_per_message=one["tick_s_per_message"],
        source=f"benchmarks.mass_stall, {counts[0]} host(s), median of {one['runs']} runs",
    )


@dataclass(frozen=True)
class Limit:
    name: str
    per_s: float


def limits(
    calibration: Calibration, instances: int, period_s: float, *, standard: bool = True
) -> list[Limit]:
    """Each limit as recoveries a second, lowest first. ``standard``: a Standard namespace
    (else Premium, whose messaging units have no credit limit and no published rate)."""
    per_bucket = TABLE_PARTITION_ENTITIES_PER_S / (
        INDEX_WRITES_PER_RECOVERY + INDEX_READS_PER_RECOVERY
    )
    claim_s = 0.875 * period_s  # adapters.settings: supervisor_claim
    tick = claim_s / calibration.tick_s_per_message * calibration.rows_per_message / period_s
    found = [
        Limit(CPU, instances * calibration.per_instance_per_s),
        Limit("Table account", TABLE_ACCOUNT_PER_S / calibration.table_requests),
        Limit("Table partition (index buckets)", INDEX_BUCKETS * per_bucket),
        Limit("the tick's hand-out (one instance)", tick),
    ]
    if standard:
        credits = SB_STANDARD_CREDITS_PER_S / calibration.servicebus_credits
        found.append(Limit("Service Bus Standard credits", credits))
    return sorted(found, key=lambda limit: limit.per_s)


def drain_s(due: int, rate: float, period_s: float) -> float:
    """Seconds from the stall until the last of ``due`` rows is recovered, at ``rate`` a second
    once handed out, each tick handing out what :func:`service.hand_out.allowance` allows it
    (the 16 buckets held by one instance, the rows spread evenly over them)."""
    idle = Pace(returned=0, moved_on=0, rate=0.0)
    paces = [idle] * INDEX_BUCKETS
    left, queued, elapsed = due, 0.0, period_s / 2
    while left > 0 or queued > 0:
        cap = min(allowance(paces, period_s), INDEX_BUCKETS * MAX_READ)
        handed = min(left, cap)
        left -= handed
        queued += handed
        capacity = rate * period_s
        if queued <= capacity:  # all moved on within the period
            elapsed += queued / rate
            if left == 0:
                return elapsed
            elapsed += period_s - queued / rate
            moved_on, returned, queued = queued, 0, 0.0
        else:  # the rest comes back due at the lease's end
            moved_on, returned = capacity, queued - capacity
            queued -= capacity
            elapsed += period_s
        share = [math.ceil(moved_on / INDEX_BUCKETS)] * INDEX_BUCKETS
        back = [math.ceil(returned / INDEX_BUCKETS)] * INDEX_BUCKETS
        paces = [Pace(r, m, m / period_s) for r, m in zip(back, share, strict=True)]
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

    def rows(standard: bool) -> list[dict[str, Any]]:
        found = []
        for instances in fleets:
            lowest = limits(calibration, instances, period_s, standard=standard)[0]
            found.append(
                {
                    "instances": instances,
                    "recoveries_per_s": round(lowest.per_s, 1),
                    "binds": lowest.name,
                    "drain_s": {
                        str(n): round(drain_s(n, lowest.per_s, period_s), 1) for n in orders
                    },
                }
            )
        return found

    return {
        "calibration": asdict(calibration)
        | {
            "per_instance_per_s": round(calibration.per_instance_per_s, 1),
            "table_requests": round(calibration.table_requests, 3),
            "servicebus_credits": round(calibration.servicebus_credits, 3),
        },
        "period_s": period_s,
        "limits_per_s": {
            limit.name: round(limit.per_s, 1)
            for limit in limits(calibration, 1, period_s)
            if limit.name != CPU
        },
        "standard": rows(standard=True),
        "premium": rows(standard=False),
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
    calibration = calibrate(json.loads(args.calibration.read_text())["summary"], args.period)
    orders = [int(n) for n in args.orders.split(",")]
    print(json.dumps(report(calibration, orders=orders, period_s=args.period), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
