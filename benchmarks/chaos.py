"""Chaos run: put the stack through nemeses (hosts killed, paused past their locks and leases,
skewed clocks, throttled and ambiguous storage, broker restarts) while orders flow through
faulty remote services, then check every invariant of the design. Prints one JSON document;
exits 1 if any fails.

    python -m benchmarks.chaos [--orders 1000] [--hosts 2] [--nemesis kill]
                               [--kill-min 3 --kill-max 7] [--skew-max 10]
                               [--storage-rates throttle=0.03,...] [--profile stress] [--seed 7]
                               [--lock-seconds 20]

``--nemesis`` takes any of ``pause,skew,storage,broker,kill`` (default ``kill``); what each does,
and the record of it in ``nemeses`` (every action with its target, start and end; the counts of
kills, pauses, skewed hosts, storage faults and broker restarts), is benchmarks/nemeses.py.

Every order names the ``order-status`` queue as its reply queue, so status updates are checked
too. Invariants (DESIGN.md), each reported as a count that must be 0:

- ``lost``: submitted but never created; ``stuck``: not Processed or Error at the end;
- ``duplicate_effects``: a forward or undo effect applied twice for one key (fakes' ledger);
- ``errors_without_one_alert``: an Error order without exactly one terminal alert;
- ``undo_without_do``: an undo that reversed nothing at the service;
- ``effects_left_after_compensation``: an Error order with a forward effect still in place;
- ``errors_whose_failing_step_succeeded``: an order failed at the threshold on a step whose
  forward call did take effect at the service, with a failed attempt of that step that was not
  the service's own (ours, or given up on unanswered): a failure we counted that did not happen.
  One whose every failed attempt was the service's (it timed out each time, and a late call
  landed: what the profile's hangs are for) is the pattern working and is reported apart, in
  ``threshold_failures_at_service_that_landed``;
- ``status_sequences_incomplete``: an order whose status updates did not all arrive, 0, 1, 2,
  ... up to StatusSeq - 1, in order; or whose last update does not say the state it ended in;
  or where not exactly one update says it finished (Processed or Error);
- ``compensation_incomplete_unrefused``: an Error order that gave up undoing although no
  service refused its undo (a compensation budget spent within a run is one too: the run is
  far shorter than the budget);
- ``recovery_over_bound``: the Supervisor acted on an order later after its deadline than the
  bound computed from the settings (:func:`service.operations.supervisor.recovery_bound`,
  ``detection_s``)
  plus a host restart (both hosts may be down at once). Measured from each Supervisor timeline
  entry and the deadline it names;
- ``stall_over_bound``: the longest gap between two timeline entries of an order (not counting
  a deferral's wait for the service's ``retry_at``) exceeds ``stall_s`` plus a host restart;
- with ``skew``, both bounds grow by the spread of the hosts' clocks (``skew_allowance_s``):
  the deadline an entry names and the entry's own time may come from two hosts' clocks, so the
  gap between them is measured off by up to that much;
- ``lock_lost``: messages whose peek-lock was lost, counted by the broker (its stats file,
  devstack/servicebus/stats.py). A lock is *lost* when it expires while the receiver it was
  given to is alive: its link still attached, or closed by a client that was still running, or
  closed by the broker on an error. A lock that expires after its receiver's connection dropped
  without an AMQP close (the host was SIGKILLed) is not lost: that expiry is how Service Bus
  hands a dead consumer's messages to another, and it is expected here (``expired_after_crash``).
  Neither is an abandon (a function that raised) or a release. The broker is the judge because
  it sees every lock and outlives the hosts; it also counts each redelivery by what ended the
  delivery before it (``locks.broker.redelivered_after``: ``abandoned``, ``holder_crashed``,
  ``lock_lost``, ``released``, ``deferred``). The hosts' own view (``locks.hosts``: renewals
  that stopped early, settlements refused with ``MessageLockLostError``, messages received
  again) is reported as a cross-check; a killed host's last second of counts dies with it.
  The counts of every broker process of the run are added up (a restarted broker keeps its
  predecessor's, devstack/servicebus/stats.py). A lock that expires while its holder is paused
  is lost by design of the nemesis: locks counted lost while a host was paused (or within
  ``LOCK_STATS_LAG_S`` after) are reported as ``lock_lost_while_paused``, not judged.

Also reported, not judged: the longest gap between two completed sweeps of one bucket (under a
burst larger than a tick's budget, buckets are cut short while the oldest rows are served
first), the Supervisor's ticks from the hosts' logs, and whose failure each failed attempt was
(``failed_attempts``, from the orders' step records: the request reached the service, never
left our side, or is still unanswered), with the orders that failed at the threshold split the
same way (``failure_threshold_orders``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import re
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from azure.servicebus.aio import ServiceBusClient

from adapters.settings import Settings
from adapters.store.records import OrderRecords
from benchmarks.nemeses import (
    DEFAULT_STORAGE_RATES,
    NEMESES,
    Nemeses,
    parse_nemeses,
    pause_seconds,
    skew_offsets,
)
from devstack import observe
from devstack.faults.storage_proxy import FaultRates
from devstack.orders import open_orders_table, open_store, send_orders
from devstack.servicebus import stats as broker_stats
from devstack.stack.local_stack import LocalStack
from domain.messages import OrderSubmitted
from domain.order import (
    TERMINAL_ALERT_REASONS,
    Failures,
    Order,
    StepRecord,
    StepState,
    TimelineEntry,
)
from domain.states import ProcessState
from orderctl.demo import QUICK_SETTINGS
from service.operations.supervisor import recovery_bound

RESTART_ALLOWANCE_S = 15.0  # a killed host is back and receiving within this
BROKER_STATS_FILE = "broker.stats.json"  # beside broker.port in the stack's workdir
STATS_SETTLE_S = 1.5  # the broker and the hosts rewrite their stats files every second
HOST_LOCK_COUNTERS = (
    "lock_lost",
    "lock_renewal_failures",
    "lock_lost_on_settle",
    "redelivered",
    "settle_errors",
)
REPLY_QUEUE = "order-status"
_FAILING_STEP = re.compile(r"^do (\w+) attempt")
_FAILURE_CODE = re.compile(r"failed: (\w+)")
_DEADLINE = re.compile(r"passed CompleteBy (\S+)$|since (\S+) with no progress for (\d+)s$")
_RETRY_DUE = re.compile(r"retry due (\S+)")
_INCOMPLETE = "compensation incomplete"  # domain.lifecycle._give_up's last error
_UNDO_REFUSED = " refused: "  # domain.lifecycle._on_undo_answer: "undo of <step> refused: ..."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument(
        "--nemesis",
        type=_nemeses,
        default=("kill",),
        help=f"comma-separated, any of {','.join(NEMESES)} (default: kill)",
    )
    parser.add_argument("--kill-min", type=float, default=3.0, help="seconds between kills")
    parser.add_argument("--kill-max", type=float, default=7.0)
    parser.add_argument("--skew-max", type=int, default=10, help="seconds a host's clock is off")
    parser.add_argument(
        "--storage-rates",
        type=_rates,
        default=DEFAULT_STORAGE_RATES,
        help=f"the storage proxy's fault rates (default {DEFAULT_STORAGE_RATES})",
    )
    parser.add_argument(
        "--lock-seconds",
        type=int,
        help="every queue's message lock (default: the entity config's minute); a pause "
        "lasts this plus 5 s",
    )
    parser.add_argument("--profile", default="stress")
    parser.add_argument("--workflow", default="order")
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", type=Path)
    return parser.parse_args(argv)


def _nemeses(text: str) -> tuple[str, ...]:
    try:
        return parse_nemeses(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _rates(text: str) -> FaultRates:
    try:
        return FaultRates.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


async def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
    chosen = args.nemesis
    offsets = skew_offsets(rng, args.hosts, args.skew_max) if "skew" in chosen else None
    stack = LocalStack(
        workdir,
        hosts=args.hosts,
        profile=args.profile,
        seed=args.seed,
        overrides=QUICK_SETTINGS | skew_tolerance(offsets),
        persist="broker" in chosen,  # a restarted broker comes back with its messages
        clock_offsets=offsets,
        storage_faults=args.storage_rates if "storage" in chosen else None,
        lock_seconds=args.lock_seconds,
    )
    info = await stack.start(progress=lambda step: print(f"… {step}", file=sys.stderr))
    try:
        orders = make_orders(args.orders, args.workflow)
        ids = {o.order_id for o in orders}
        store = open_store(info.settings)
        started = time.monotonic()
        nemeses = Nemeses(
            stack,
            chosen,
            rng,
            kill_every=(args.kill_min, args.kill_max),
            pause_s=pause_seconds(Settings.from_env(info.settings), stack.broker_config()),
            started=started,
        )
        await send_orders(info.settings, orders)
        pending = set(ids)
        finished_at = started
        sweeps = SweepWatch()
        host_locks = HostLockWatch(workdir)
        broker_locks = BrokerLockWatch(workdir / BROKER_STATS_FILE)
        while (pending or not nemeses.quiet()) and (time.monotonic() - started < args.timeout):
            await sweeps.sample(store)
            host_locks.sample()
            broker_locks.sample()
            await nemeses.act(orders_pending=bool(pending))
            if pending:
                pending = await still_pending(store, pending)
                finished_at = time.monotonic()
            await asyncio.sleep(0.5)
        nemeses.finish()
        await sweeps.sample(store)
        await asyncio.sleep(STATS_SETTLE_S)
        host_locks.sample()
        broker_locks.sample()
        elapsed = finished_at - started
        clocks = Clocks.of(stack.clock_offsets, host_locks)
        report = await judge(info, store, ids, sweeps, workdir, clocks=clocks)
        report = with_lock_loss(report, broker_locks, host_locks, nemeses)
        done = nemeses.report(workdir)
        report |= {
            "orders": args.orders,
            "workflow": args.workflow,
            "hosts": args.hosts,
            "kills": done["counts"]["kills"],
            "nemeses": done,
            "profile": args.profile,
            "seed": args.seed,
            "elapsed_s": round(elapsed, 1),
            "orders_per_s": round(args.orders / elapsed, 2) if elapsed else None,
        }
        await store.close()
    finally:
        stack.stop()
    print(json.dumps(report, indent=2))
    return 0 if report["invariants_hold"] else 1


def make_orders(count: int, workflow: str) -> list[OrderSubmitted]:
    run = uuid.uuid4().hex[:6]
    return [
        OrderSubmitted(
            order_id=f"chaos-{run}-{n:05d}",
            customer_id=f"customer-{n % 97}",
            items=[{"sku": f"SKU-{n % 13}", "quantity": 1 + n % 3, "unit_price_cents": 500}],
            currency="EUR",
            reply_to=REPLY_QUEUE,
            workflow=workflow,
        )
        for n in range(count)
    ]


def skew_tolerance(offsets: dict[int, int] | None) -> dict[str, str]:
    """The app's tolerated clock skew for hosts run ``offsets`` seconds off: the widest gap
    between two of them (and the host clock, which the stack's other processes keep)."""
    if not offsets:
        return {}
    spread = max(0, *offsets.values()) - min(0, *offsets.values())
    return {"CLOCK_SKEW_TOLERANCE_SECONDS": str(spread)}


async def still_pending(store: OrderRecords, pending: set[str]) -> set[str]:
    """The orders of ``pending`` not yet finished (their index row is gone only once they are
    terminal and owe nothing; a point read confirms it)."""
    active = {row.order_id async for row in store.all_active()}
    left = set(pending)
    for order_id in [o for o in pending if o not in active][:200]:
        order = await store.find(order_id)
        if order is not None and order.state.terminal:
            left.discard(order_id)
    return left


def stall_bound(settings: Settings) -> float:
    return recovery_bound(settings).stall_s + RESTART_ALLOWANCE_S


def recovery_latency(entry: TimelineEntry) -> float | None:
    """Seconds from the deadline a Supervisor entry names to the entry; None for other entries."""
    if not entry.actor.startswith("supervisor:"):
        return None
    match = _DEADLINE.search(entry.detail.split("; ")[0])
    if match is None:
        return None
    if match[1]:
        deadline = datetime.fromisoformat(match[1])
    else:
        deadline = datetime.fromisoformat(match[2]) + timedelta(seconds=int(match[3]))
    return (entry.at - deadline).total_seconds()


def waited_from(entry: TimelineEntry) -> datetime:
    """When an order starts waiting after ``entry``: a deferral waits for the service's
    ``retry_at`` as asked, so its stall counts from then."""
    match = _RETRY_DUE.search(entry.detail) if entry.event == "deferred" else None
    return max(entry.at, datetime.fromisoformat(match[1])) if match else entry.at


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"count": 0}
    return {
        "count": len(ordered),
        "p50": round(ordered[len(ordered) // 2], 2),
        "p99": round(ordered[int(len(ordered) * 0.99)], 2),
        "max": round(ordered[-1], 2),
    }


_TICK = re.compile(r"supervisor tick: TickReport\((?P<fields>[^)]*)\)")


def tick_log_summary(workdir: Path) -> dict[str, float]:
    """From the hosts' logs: the ticks that found something due or ran out of budget."""
    ticks = []
    for log in workdir.glob("host-*.log*"):
        for match in _TICK.finditer(log.read_text(errors="replace")):
            fields = dict(part.split("=") for part in match["fields"].split(", "))
            ticks.append({k: float(v) for k, v in fields.items()})
    return {
        "logged": len(ticks),
        "cut_short": sum(1 for t in ticks if t["swept"] < t["held"]),
        "max_due": max((t["due"] for t in ticks), default=0),
        "max_duration_s": max((t["duration_s"] for t in ticks), default=0),
        "max_lag_s": round(max((t["lag_s"] for t in ticks), default=0), 1),
        "rows_found": sum(t["due"] for t in ticks),
        "rows_handled": sum(t.get("handled", 0) for t in ticks),
        "rows_handled_per_tick_s": round(
            sum(t.get("handled", 0) for t in ticks)
            / max(sum(t["duration_s"] for t in ticks), 1e-9),
            1,
        ),
    }


class SweepWatch:
    """Per bucket, the checkpoints the Supervisor recorded, and the longest gap between two."""

    def __init__(self) -> None:
        self.swept: dict[int, list[datetime]] = defaultdict(list)
        self.by: dict[tuple[int, datetime], str] = {}
        self.max_lag = 0.0

    async def sample(self, store: OrderRecords) -> None:
        for lease in (await store.supervision.read()).buckets:
            self.max_lag = max(self.max_lag, lease.lag_s)
            seen = self.swept[lease.bucket]
            if lease.swept_at is not None and (not seen or seen[-1] != lease.swept_at):
                seen.append(lease.swept_at)
                self.by[(lease.bucket, lease.swept_at)] = lease.swept_by

    def report(self, settings: Settings) -> dict[str, object]:
        bound = recovery_bound(settings)
        gaps = {
            bucket: max(((b - a).total_seconds() for a, b in itertools.pairwise(times)), default=0)
            for bucket, times in self.swept.items()
        }
        worst = max(gaps, key=gaps.__getitem__, default=None)
        between: list[str] = []
        if worst is not None and len(self.swept[worst]) > 1:
            times = self.swept[worst]
            a, b = max(itertools.pairwise(times), key=lambda p: p[1] - p[0])
            between = [f"{t.time()} by {self.by[(worst, t)]}" for t in (a, b)]
        return {
            "max_sweep_gap_s": round(gaps[worst], 1) if worst is not None else None,
            "max_sweep_gap_bucket": worst,
            "max_sweep_gap_between": between,
            "sweep_gap_bound_s": round(2 * bound.period_s + bound.budget_s, 1),
            "sweeps_seen": sum(len(t) for t in self.swept.values()),
            "max_lag_recorded_s": round(self.max_lag, 1),
            "recovery_bound": bound.as_dict(),
        }


class HostLockWatch:
    """The hosts' lock counters, summed over every host process the run saw.

    A restarted host rewrites its stats file from 0, so each file is read often and the last
    counters seen per (file, pid) are kept.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.latest: dict[tuple[str, int], dict[str, int]] = {}

    def sample(self) -> None:
        for path in self.workdir.glob("host-*.stats.json"):
            try:
                document = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being replaced; read again next time
            functions = document.get("functions", {}).values()
            self.latest[(path.name, int(document.get("pid", 0)))] = {
                key: sum(int(f.get(key, 0)) for f in functions) for key in HOST_LOCK_COUNTERS
            }

    def totals(self) -> dict[str, int]:
        summed = {key: sum(c[key] for c in self.latest.values()) for key in HOST_LOCK_COUNTERS}
        summed["host_processes"] = len(self.latest)
        return summed


@dataclass(frozen=True)
class Clocks:
    """The hosts' wall-clock offsets (the ``skew`` nemesis), by the process id that ends the
    instance id their timeline entries name (``supervisor:<host name>.<pid>``)."""

    offsets: dict[str, int]
    spread_s: int

    @classmethod
    def of(cls, by_host: dict[int, int], host_locks: HostLockWatch) -> Clocks:
        """From the offsets by host number and the PIDs each host had (its stats files)."""
        offsets = {
            str(pid): by_host.get(int(name.removeprefix("host-").split(".")[0]), 0)
            for name, pid in host_locks.latest
        }
        spread = max(by_host.values(), default=0) - min(by_host.values(), default=0)
        return cls(offsets, spread)

    def offset(self, actor: str) -> int:
        return self.offsets.get(actor.rsplit(".", 1)[-1], 0)

    def early_recoveries(self, order_id: str, timeline: list[TimelineEntry]) -> list[dict]:
        """Supervisor entries that, on real time, came before the deadline they name: the
        entry's time less its host's offset, against the deadline less the offset of the host
        that wrote the entry before it (the claim or release that set that deadline)."""
        found = []
        for before, entry in itertools.pairwise(timeline):
            latency = recovery_latency(entry)
            if latency is None:
                continue
            real = latency - self.offset(entry.actor) + self.offset(before.actor)
            if real < 0:
                found.append(
                    {
                        "order_id": order_id,
                        "early_s": round(-real, 1),
                        "entry": f"{entry.actor} {entry.event}: {entry.detail}"[:200],
                        "after": f"{before.actor} {before.event}"[:120],
                    }
                )
        return found


NO_SKEW = Clocks({}, 0)


class BrokerLockWatch:
    """The broker's lock counters over every broker process of the run, and when (monotonic)
    each growth of ``lock_lost`` was first seen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.documents: list[dict[str, Any]] = []
        self.lost_seen: list[tuple[float, int]] = []

    def sample(self) -> None:
        documents = broker_stats.read_all(self.path)
        if not documents:
            return  # being replaced; read again next time
        lost = _lock_lost(documents)
        if lost > _lock_lost(self.documents):
            self.lost_seen.append((time.monotonic(), lost - _lock_lost(self.documents)))
        self.documents = documents

    def totals(self) -> dict[str, Any] | None:
        """The counters added up over the broker's processes (None without a stats file)."""
        if not self.documents:
            return None
        return broker_stats.totals(d.get("totals", {}) for d in self.documents) | {
            "broker_processes": len(self.documents)
        }


def _lock_lost(documents: list[dict[str, Any]]) -> int:
    return sum(int(d.get("totals", {}).get("lock_lost", 0)) for d in documents)


def with_lock_loss(
    report: dict, broker_locks: BrokerLockWatch, host_locks: HostLockWatch, nemeses: Nemeses
) -> dict:
    """Add the ``lock_lost`` invariant (the broker's count, less the locks that expired while
    their holder was paused) and both views of lock loss."""
    broker = broker_locks.totals()
    counts = report["invariants"]
    while_paused = sum(n for at, n in broker_locks.lost_seen if nemeses.paused_around(at))
    if broker is None:
        counts["lock_stats_missing"] = 1  # cannot judge lock loss: fail rather than pass
    else:
        counts["lock_lost"] = int(broker.get("lock_lost", 0)) - while_paused
        broker["lock_lost_while_paused"] = while_paused
    report["locks"] = {"broker": broker, "hosts": host_locks.totals()}
    report["invariants_hold"] = not any(counts.values())
    return report


async def judge(  # type: ignore[no-untyped-def]
    info,
    store: OrderRecords,
    ids: set[str],
    sweeps: SweepWatch,
    workdir: Path,
    *,
    clocks: Clocks = NO_SKEW,
) -> dict:
    """Every invariant, the Supervisor's sweeps as sampled, and its ticks from the host logs."""
    report = await check_invariants(info, store, ids, clocks=clocks)
    report |= sweeps.report(Settings.from_env(info.settings))
    report["supervisor_ticks"] = tick_log_summary(workdir)
    return report


async def check_invariants(  # type: ignore[no-untyped-def]
    info, store: OrderRecords, ids: set[str], *, clocks: Clocks = NO_SKEW
) -> dict:
    """``clocks``: the hosts' clock offsets; both bounds grow by their spread (see the module's
    docstring), and Supervisor entries are put back on real time to find early recoveries."""
    settings = Settings.from_env(info.settings)
    async with open_orders_table(info.settings) as table:
        timelines = await observe.timelines(table, observe.common_prefix(ids))
    bound = stall_bound(settings) + clocks.spread_s
    recovery_limit = recovery_bound(settings).detection_s + RESTART_ALLOWANCE_S + clocks.spread_s
    early: list[dict[str, object]] = []
    ledger = await observe.read_ledger(info.fakes_url)
    alerts = await terminal_alerts(info.settings)
    statuses = await drain_statuses(info.settings)
    states: Counter[str] = Counter()
    error_causes: Counter[str] = Counter()
    errors: set[str] = set()
    lost, stuck, wrong_alerts, spurious, incomplete = [], [], [], [], []
    service_failed: list[dict[str, Any]] = []
    max_stall = 0.0
    longest: dict[str, object] = {}
    recoveries: list[float] = []
    effects = observe.forward_effects(ledger, ids)
    found: list[Order] = []
    for order_id in sorted(ids):
        order = await store.find(order_id)
        if order is None:
            lost.append(order_id)
            continue
        found.append(order)
        states[order.state.value] += 1
        if not order.state.terminal:
            stuck.append(order_id)
        if order.state is ProcessState.ERROR:
            errors.add(order_id)
            code = _FAILURE_CODE.search(order.compensation_reason or "")
            error_causes[f"{order.compensation_cause}{f': {code[1]}' if code else ''}"] += 1
            if alerts[order_id] != 1:
                wrong_alerts.append((order_id, alerts[order_id]))
            failing = _FAILING_STEP.match(order.compensation_reason or "")
            if order.compensation_cause == "failure_threshold" and failing:
                step = order.step(failing.group(1))
                if (order_id, step.name, step.forward_key(order_id)) in effects:
                    timeline = [
                        f"{e.at.time()} {e.event}: {e.detail[:160]}"
                        for e in timelines.get(order_id, [])
                    ]
                    if all_at_service(step.forward_failures):
                        service_failed.append({"order_id": order_id, "timeline": timeline})
                    else:
                        spurious.append({"order_id": order_id, "timeline": timeline})
        elif alerts[order_id]:
            wrong_alerts.append((order_id, alerts[order_id]))
        problem = status_problem(statuses.get(order_id, []), order.status_seq, order.state)
        if problem is not None:
            incomplete.append((order_id, problem))
        timeline = timelines.get(order_id, [])
        recoveries += [r for e in timeline if (r := recovery_latency(e)) is not None]
        early += clocks.early_recoveries(order_id, timeline)
        for a, b in itertools.pairwise(timeline):
            gap = (b.at - waited_from(a)).total_seconds()
            if gap > max_stall:
                max_stall = gap
                longest = {
                    "order_id": order_id,
                    "from": f"{a.event}: {a.detail}"[:300],
                    "to": f"{b.event}: {b.detail}"[:300],
                }
    left_in_place = observe.effects_left_in_place(ledger, errors)
    left_examples = [
        {
            "effect": effect,
            "timeline": [
                f"{e.at.time()} {e.actor} {e.event}: {e.detail[:160]}"
                for e in timelines.get(effect[1], [])
            ],
        }
        for effect in left_in_place[:3]
    ]
    counts = {
        "lost": len(lost),
        "stuck": len(stuck),
        "duplicate_effects": observe.duplicated_effects(ledger, ids),
        "errors_without_one_alert": len(wrong_alerts),
        "undo_without_do": len(observe.undo_without_do(ledger, ids)),
        "effects_left_after_compensation": len(left_in_place),
        "errors_whose_failing_step_succeeded": len(spurious),
        "status_sequences_incomplete": len(incomplete),
        "compensation_incomplete_unrefused": sum(
            1 for o in found if _incomplete(o) and _UNDO_REFUSED not in (o.last_error or "")
        ),
        "recovery_over_bound": sum(1 for r in recoveries if r > recovery_limit),
        "stall_over_bound": int(max_stall > bound),
    }
    return {
        "states": dict(states),
        "error_causes": dict(error_causes.most_common()),
        "invariants": counts,
        "examples": {
            "stuck": stuck[:5],
            "errors_without_one_alert": wrong_alerts[:5],
            "errors_whose_failing_step_succeeded": spurious[:5],
            "effects_left_after_compensation": left_examples,
            "status_sequences_incomplete": incomplete[:3],
        },
        "max_stall_s": round(max_stall, 1),
        "longest_stall": longest,
        "stall_bound_s": round(bound, 1),
        "recovery_latency_s": _quantiles(recoveries),
        "recovery_bound_s": round(recovery_limit, 1),
        "skew_allowance_s": clocks.spread_s,
        "early_recoveries": {
            "count": len(early),
            "max_early_s": max((e["early_s"] for e in early), default=0),
            "examples": early[:3],
        },
        "threshold_failures_at_service_that_landed": {
            "count": len(service_failed),
            "examples": service_failed[:3],
        },
        "compensation_incomplete": sum(1 for o in found if _incomplete(o)),
        "failed_attempts": failed_attempts(found),
        "failure_threshold_orders": threshold_failures(found),
        "invariants_hold": not any(counts.values()),
    }


def _index(step: StepRecord) -> int:
    return step.index


def _incomplete(order: Order) -> bool:
    return (order.last_error or "").startswith(_INCOMPLETE)


def failed_attempts(orders: list[Order]) -> dict[str, dict[str, int]]:
    """Failed attempts, forward and undo, by whose failure each was (domain.order.Failures)."""
    split: dict[str, Counter[str]] = {"forward": Counter(), "undo": Counter()}
    for order in orders:
        for step in order.steps:
            for direction, failures in (
                ("forward", step.forward_failures),
                ("undo", step.undo_failures),
            ):
                split[direction]["at_service"] += failures.at_service
                split[direction]["on_our_side"] += failures.on_our_side
                split[direction]["unanswered"] += len(failures.unanswered)
    return {direction: dict(counts) for direction, counts in split.items()}


def all_at_service(failures: Failures) -> bool:
    """Every failed attempt was the service's own (it failed or did not answer in time), none
    ours and none given up on unanswered."""
    return failures.total > 0 and not failures.on_our_side and not failures.unanswered


def threshold_failures(orders: list[Order]) -> dict[str, int]:
    """The orders compensated at the failure threshold, by what their failing step's failed
    attempts were: all at the service, at least one never left our side, or neither but some
    never answered (whose failure is not known)."""
    split: Counter[str] = Counter()
    for order in orders:
        if order.compensation_cause != "failure_threshold":
            continue
        # The step in flight when it failed: the last one requested (those after it never were).
        failing = max((s for s in order.steps if s.state is not StepState.PENDING), key=_index)
        failures = failing.forward_failures
        if failures.on_our_side:
            split["any_on_our_side"] += 1
        elif failures.unanswered:
            split["unknown"] += 1
        else:
            split["all_at_service"] += 1
    return {"total": sum(split.values()), **split}


async def terminal_alerts(settings: dict[str, str]) -> Counter[str]:
    """Per order, the terminal alerts (one per entry into Error) on the alerts queue (peeked)."""
    found: Counter[str] = Counter()
    async for body in observe.peek_all(settings, Settings.from_env(settings).queue("alerts")):
        alert = json.loads(body)
        if alert.get("order_id") and alert.get("reason") in TERMINAL_ALERT_REASONS:
            found[alert["order_id"]] += 1
    return found


def status_problem(
    updates: list[tuple[int, str]], status_seq: int, state: ProcessState
) -> str | None:
    """What is wrong with the (sequence, state) updates an order's submitter received, in
    arrival order, for an order that issued ``status_seq`` of them and is ``state`` now."""
    sequences = [sequence for sequence, _ in updates]
    if sequences != list(range(status_seq)):
        return f"received {sequences[:12]} of {status_seq}"
    if updates and updates[-1][1] != state.value:
        return f"the last says {updates[-1][1]}, the order is {state.value}"
    finished = [s for s, says in updates if says in (ProcessState.PROCESSED, ProcessState.ERROR)]
    if len(finished) != 1:
        return f"updates {finished} say the order finished"
    return None


async def drain_statuses(settings: dict[str, str]) -> dict[str, list[tuple[int, str]]]:
    """Receive every status update on the reply queue; per order, (sequence, state) in arrival
    order. A resend of one already seen (after a crash, past duplicate detection) is skipped,
    as a receiver would."""
    seen: dict[str, list[tuple[int, str]]] = defaultdict(list)
    async with (
        ServiceBusClient.from_connection_string(settings["ServiceBusConnection"]) as client,
        client.get_queue_receiver(REPLY_QUEUE, max_wait_time=2) as receiver,
    ):
        while batch := await receiver.receive_messages(max_message_count=250, max_wait_time=2):
            for message in batch:
                update = json.loads(b"".join(message.body))
                updates = seen[update["order_id"]]
                if update["sequence"] not in (sequence for sequence, _ in updates):
                    updates.append((update["sequence"], update["state"]))
                await receiver.complete_message(message)
    return seen


if __name__ == "__main__":
    sys.exit(main())
