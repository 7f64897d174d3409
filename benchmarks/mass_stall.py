"""A mass stall on the local stack: N orders due at once, recovered by M hosts.

    python -m benchmarks.mass_stall [--orders 1000] [--hosts 1,2] [--rounds 3] [--period 2]
                                    [--retry-delay 60] [--timer-on-every-host]

For each round and each host count M, back to back on one machine, on a fresh stack
(:class:`devstack.stack.local_stack.LocalStack`: Azurite, the development broker, the fake
services; the quick settings of ``orderctl demo --quick``, with the Supervisor period
``--period``):

1. M function hosts run. As in Azure, where a timer runs on one instance of an app at a time,
   only host 0 runs the Supervisor's timer; every host runs the queue triggers, the commands
   trigger that recovers what a tick hands out among them (``--timer-on-every-host``: every
   host ticks too, sharing the buckets by lease, as the local stack does by default).
2. ``--orders`` orders are written in flight straight into the store, as intake writes them but
   with no request sent (their agents died), every one with the same CompleteBy T: at
   T + CLOCK_SKEW_TOLERANCE_SECONDS every one of them is due at once (the Supervisor acts on a
   deadline only once its clock is past it by the tolerance).
3. The benchmark waits until every order's index row has moved on (each order released for a
   retry), then reads each order's ``released`` timeline entry: who released it, and when.
   Released orders retry after ``--retry-delay`` (60 s by default, so that what the resumed
   orders do later is not measured as recovery; the quick settings' 1 s can be asked for).

Reading the JSON (one document on stdout; times in seconds):

- ``runs``: per round and host count: ``drain_s`` (from T plus the tolerance to the last
  release), ``first_s``, ``latency_s`` (each release minus the order's CompleteBy: p50, p95,
  max) against ``bound.detection_s`` (period + budget + period + tolerance), ``recoveries_per_s``
  and ``per_host`` (who released how many), ``operations_per_recovery`` (Table requests and
  Service Bus operations the hosts counted at the SDK over the drain, divided by the orders),
  ``cpu_s`` (CPU seconds of each process over the drain), ``machine`` (the share of all the
  machine's cores that was busy over the drain, and the share these processes had: ``busy``
  near 1 says the cores are what limits it) and the Supervisor's ticks over the drain as host 0
  logged them.
- ``summary``: per host count, medians over the rounds; ``speedup`` of the most hosts over one.
- ``model``: :mod:`benchmarks.recovery_model` calibrated on these measurements (CPU per
  recovery, operations per recovery) and on the published limits: 100,000 orders due at once
  drained by the fleet sizes of docs/capacity.md at the production period, and which limit binds.
- ``load_average_*`` (and each run's ``load_average`` before and after it), ``cpus``: the
  machine these numbers come from.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from adapters.settings import Settings
from adapters.store.records import OrderRecords
from benchmarks import recovery_model
from benchmarks.broker_throughput import process_cpu_seconds
from devstack.host.indexing import ServiceBusTrigger, index_app, load_app
from devstack.stack import processes
from devstack.stack.local_stack import LocalStack
from domain import events, lifecycle
from domain.messages import OrderSubmitted, utc_now
from domain.workflows import ORDER_WORKFLOW, Workflow
from orderctl.demo import QUICK_SETTINGS
from service import apply
from service.operations.supervisor import recovery_bound
from service.runtime import Runtime

SETTLE_S = 1.5
"""How long the hosts take to write their counters (every second) after the drain."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.mass_stall",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--hosts", default="1,2", help="host counts, run back to back")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--period", type=int, default=2, help="Supervisor period (divides 60)")
    parser.add_argument("--retry-delay", type=int, default=60, help="seconds before a retry")
    parser.add_argument("--timer-on-every-host", action="store_true")
    parser.add_argument("--workers", type=int, default=16, help="orders written at once")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per drain")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample each host with py-spy over the drain; report where its CPU went",
    )
    args = parser.parse_args(argv)
    if args.orders < 1 or args.rounds < 1 or 60 % args.period:
        parser.error("--orders and --rounds must be positive; --period must divide 60")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    counts = [int(n) for n in args.hosts.split(",") if n.strip()]
    if not counts or min(counts) < 1:
        raise SystemExit("--hosts: positive numbers, e.g. 1,2")
    load_before = os.getloadavg()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mass-stall-"))
    runs = []
    for round_ in range(args.rounds):
        for hosts in counts:
            before = os.getloadavg()
            run = asyncio.run(run_once(hosts, args, workdir / f"r{round_}-h{hosts}"))
            run["round"] = round_
            run["load_average"] = {"before": _rounded(before), "after": _rounded(os.getloadavg())}
            print(f"round {round_}, {hosts} host(s): {short(run)}", file=sys.stderr, flush=True)
            runs.append(run)
    summary = summarize(runs, counts)
    document = {
        "orders": args.orders,
        "period_s": args.period,
        "retry_delay_s": args.retry_delay,
        "timer": "every host" if args.timer_on_every_host else "host 0 only (as in Azure)",
        "cpus": os.cpu_count(),
        "load_average_before": _rounded(load_before),
        "load_average_after": _rounded(os.getloadavg()),
        "summary": summary,
        "model": recovery_model.report(recovery_model.calibrate(summary)),
        "runs": runs,
    }
    print(json.dumps(document, indent=2))
    return 0


def _rounded(load: Sequence[float]) -> list[float]:
    return [round(x, 2) for x in load]


def short(run: Mapping[str, Any]) -> str:
    return (
        f"drain {run['drain_s']} s, {run['recoveries_per_s']}/s, "
        f"released {run['released']}/{run['orders']}, load {os.getloadavg()[0]:.1f}"
    )


# ------------------------------------------------------------------------------ one run


def queue_functions() -> list[str]:
    """The app's Service Bus-triggered functions: what a host without the timer runs."""
    app, directory = load_app("function_app")
    settings = json.loads((processes.REPO_ROOT / "local.settings.json.example").read_text())
    functions = index_app(app, settings["Values"], directory=directory)
    return sorted(f.name for f in functions if isinstance(f.trigger, ServiceBusTrigger))


async def run_once(hosts: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    overrides = QUICK_SETTINGS | {
        "SUPERVISOR_SCHEDULE": f"*/{args.period} * * * * *",
        "RETRY_BASE_DELAY_SECONDS": str(args.retry_delay),
        "RETRY_MAX_DELAY_SECONDS": str(max(args.retry_delay, 4)),
    }
    every = args.timer_on_every_host
    stack = LocalStack(workdir, hosts=hosts if every else 1, profile="clean", overrides=overrides)
    info = await stack.start()
    extra = [] if every else [spawn_host(stack, n) for n in range(1, hosts)]
    settings = Settings.from_env(info.settings)
    rt = Runtime.from_settings(settings, OrderRecords, instance_id="bench@mass-stall")
    try:
        return await measure(rt, stack, extra, hosts, args)
    finally:
        await rt.close()
        processes.stop_all(extra)
        stack.stop()


_FUNCTIONS: list[str] = []


def spawn_host(stack: LocalStack, n: int) -> Any:
    """Host ``n`` running the queue triggers only (no timer: Azure runs it on one instance)."""
    if not _FUNCTIONS:
        _FUNCTIONS.extend(queue_functions())
    argv = [sys.executable, "-m", "devstack.host"]
    argv += ["--settings", str(stack.workdir / "local.settings.json")]
    argv += ["--concurrency", str(stack.concurrency or 4), "--stop-timeout", "3"]
    argv += ["--http-port", "-1", "--functions", ",".join(_FUNCTIONS)]
    argv += ["--stats-file", str(stack.workdir / f"host-{n}.stats.json")]
    log = stack.workdir / f"host-{n}.log"
    proc = processes.spawn(argv, log_path=log, cwd=processes.REPO_ROOT, env=os.environ.copy())
    if not processes.wait_until(lambda: "host started" in _read(log), timeout=90, proc=proc):
        processes.stop(proc)
        raise RuntimeError(f"functions host {n} did not start:\n{processes.tail(log)}")
    return proc


async def measure(
    rt: Runtime, stack: LocalStack, extra: list[Any], hosts: int, args: argparse.Namespace
) -> dict[str, Any]:
    bound = recovery_bound(rt.settings)
    skew = rt.settings.clock_skew
    lead = timedelta(seconds=max(15.0, args.orders / 40))  # to write them all before T
    deadline = utc_now() + lead
    created = await create_orders(rt, deadline, args.orders, args.workers)
    created_by = utc_now()
    pids = host_pids(stack, extra)
    actionable = deadline + skew
    await asyncio.sleep(max(0.0, (actionable - utc_now()).total_seconds() - 0.5))
    ops_before, cpu_before = operations(stack.workdir), cpu(stack, pids)
    machine_before = machine_cpu()
    log_mark = len(_read(stack.workdir / "host-0.log"))
    profiles = (
        [Profile.start(n, pid, stack.workdir) for n, pid in pids.items()] if args.profile else []
    )
    waited = await wait_moved_on(rt, set(created), actionable, args.timeout)
    cpu_after, machine_after = cpu(stack, pids), machine_cpu()
    profiled = {p.name: p.stop() for p in profiles}
    await asyncio.sleep(SETTLE_S)
    ops_after = operations(stack.workdir)
    released = await released_at(rt, created, args.workers)
    times = sorted((at - actionable).total_seconds() for at, _ in released.values())
    latencies = [(at - deadline).total_seconds() for at, _ in released.values()]
    by_pid = Counter(pid_of(actor) for _, actor in released.values())
    drain = max(times, default=math.nan)
    used = {name: round(cpu_after[name] - cpu_before.get(name, 0.0), 2) for name in cpu_after}
    ops = {k: v - ops_before.get(k, 0) for k, v in ops_after.items() if v - ops_before.get(k, 0)}
    host_cpu = sum(s for name, s in used.items() if name.startswith("host-"))
    return {
        "hosts": hosts,
        "orders": len(created),
        "created_late": (created_by - deadline).total_seconds() > 0,
        "released": len(released),
        "waited_s": round(waited, 2),
        "drain_s": round(drain, 3),
        "first_s": round(times[0], 3) if times else None,
        "drain_periods": round(drain / bound.period_s, 2),
        "recoveries_per_s": round(len(released) / drain, 1) if drain > 0 else None,
        "per_host": {
            name: by_pid.get(pid, 0) for name, pid in sorted(pids.items()) if name != "azurite"
        },
        "latency_s": stats(latencies, bound.detection_s),
        "bound": bound.as_dict(),
        "operations": ops,
        "operations_per_recovery": {k: round(v / max(1, len(released)), 3) for k, v in ops.items()},
        "cpu_s": used,
        "host_cpu_ms_per_recovery": round(1000 * host_cpu / max(1, len(released)), 3),
        "machine": machine_share(machine_before, machine_after, sum(used.values())),
        "ticks": ticks_logged(_read(stack.workdir / "host-0.log")[log_mark:]),
        **({"profile": profiled} if profiled else {}),
    }


async def create_orders(rt: Runtime, deadline: datetime, count: int, workers: int) -> list[str]:
    """``count`` orders in flight whose CompleteBy is ``deadline``, as intake writes them (one
    transaction each, its index row first), with no request sent."""
    run = f"ms{int(time.time()) % 100000:05d}"
    at_once = asyncio.Semaphore(workers)

    async def one(n: int) -> str:
        async with at_once:
            return await create_one(rt, f"{run}-{n:06d}", deadline)

    return list(await asyncio.gather(*(one(n) for n in range(count))))


async def create_one(rt: Runtime, order_id: str, deadline: datetime) -> str:
    submitted = OrderSubmitted(
        order_id=order_id,
        customer_id="c-1",
        items=[{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 100}],
        currency="EUR",
    )
    now = utc_now()
    budget = max(deadline - now, timedelta(milliseconds=1))
    base = rt.workflow(ORDER_WORKFLOW.name)
    steps = tuple(
        dataclasses.replace(s, complete_by_budget=budget, queue_budget=timedelta(0))
        for s in base.steps
    )
    flow = Workflow(name=base.name, steps=steps, retry=base.retry)
    ctx = events.Context(workflow=flow, now=now, actor="scheduler:bench")
    decision = lifecycle.submit(submitted, ctx)
    assert decision.order is not None and decision.entry is not None
    order = dataclasses.replace(decision.order, outbox=())  # sent, and never answered
    await rt.store.create(submitted, order, decision.entry, due=apply.due(rt, order))
    return order_id


async def wait_moved_on(rt: Runtime, ids: set[str], since: datetime, timeout: float) -> float:
    """Seconds from ``since`` until every row of ``ids`` has moved on past ``since`` (its order
    released and due again only after its retry), or ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        waiting = [
            row
            async for row in rt.store.all_active()
            if row.order_id in ids and (row.dispatch_id or row.due_at <= since)
        ]
        if not waiting:
            break
        await asyncio.sleep(0.25)
    return (utc_now() - since).total_seconds()


async def released_at(
    rt: Runtime, ids: Sequence[str], workers: int
) -> dict[str, tuple[datetime, str]]:
    """Each order's first ``released`` timeline entry: when, and by whom (its actor)."""
    at_once = asyncio.Semaphore(workers)

    async def one(order_id: str) -> tuple[str, tuple[datetime, str] | None]:
        async with at_once:
            timeline = await rt.store.get_timeline(order_id)
        entry = next((e for e in timeline if e.event == "released"), None)
        return order_id, None if entry is None else (entry.at, entry.actor)

    found = await asyncio.gather(*(one(order_id) for order_id in ids))
    return {order_id: seen for order_id, seen in found if seen is not None}


# ------------------------------------------------------------------------------ readings


class Profile:
    """``py-spy record`` on one host over the drain (``--profile``): its samples, by the
    function they were in and by where that function comes from."""

    def __init__(self, name: str, proc: Any, path: Path) -> None:
        self.name, self._proc, self._path = name, proc, path

    @classmethod
    def start(cls, name: str, pid: int, workdir: Path) -> Profile:
        path = workdir / f"{name}.pyspy.txt"
        argv = [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid)]
        argv += ["--format", "raw", "--rate", "200", "--nonblocking", "--output", str(path)]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return cls(name, proc, path)

    def stop(self) -> dict[str, Any]:
        self._proc.send_signal(signal.SIGINT)
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        return profile_summary(_read(self._path))


_AREAS = (
    ("adapters/tables", "our Table client"),
    ("azure/servicebus", "Service Bus SDK"),
    ("uamqp", "Service Bus SDK"),
    ("devstack/host", "local host (dev only)"),
    ("pydantic", "pydantic"),
    ("opentelemetry", "telemetry"),
    ("aiohttp", "aiohttp"),
    ("azure/core", "azure-core"),
    ("domain/", "domain"),
    ("service/", "service"),
    ("adapters/", "adapters"),
    ("asyncio", "asyncio"),
    ("json", "json"),
    ("ssl", "ssl"),
)


def profile_summary(raw: str) -> dict[str, Any]:
    """From py-spy's collapsed stacks: the share of samples by area (the innermost frame of
    ours or a library's that each sample was in) and the functions most samples were in."""
    leaves: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        n = int(count)
        total += n
        leaves[frames[-1]] += n
        areas[_area(frames)] += n
    if not total:
        return {"samples": 0}
    return {
        "samples": total,
        "by_area": {a: round(n / total, 3) for a, n in areas.most_common()},
        "top_functions": {f: round(n / total, 3) for f, n in leaves.most_common(15)},
    }


def _area(frames: Sequence[str]) -> str:
    for frame in reversed(frames):
        for marker, area in _AREAS:
            if marker in frame:
                return area
    return "other"


def host_pids(stack: LocalStack, extra: Sequence[Any]) -> dict[str, int]:
    names = [name for name in stack.components() if name.startswith("host-")]
    pids = {name: stack.pid(name) for name in names}
    pids |= {f"host-{n + 1}": proc.pid for n, proc in enumerate(extra)}
    return pids


def cpu(stack: LocalStack, hosts: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds so far of each host, Azurite and the broker."""
    pids = dict(hosts) | {name: stack.pid(name) for name in ("azurite", "broker")}
    return {name: process_cpu_seconds(pid) for name, pid in pids.items()}


def machine_cpu() -> tuple[float, float, float]:
    """The machine's CPU seconds so far, busy and in all (every core, from /proc/stat), and the
    monotonic time they were read at."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - idle) / tick, sum(fields) / tick, time.monotonic()


def machine_share(
    before: tuple[float, float, float], after: tuple[float, float, float], ours_s: float
) -> dict[str, float]:
    """Over the drain, the share of all the machine's cores that was busy (``busy``: near 1,
    the cores are what limits the drain), and the share this benchmark's processes had
    (``ours``; the rest went to whatever else ran on the machine)."""
    busy, total = after[0] - before[0], after[1] - before[1]
    cores_s = (after[2] - before[2]) * (os.cpu_count() or 1)
    return {
        "busy": round(busy / total, 3) if total > 0 else 0.0,
        "ours": round(ours_s / cores_s, 3) if cores_s > 0 else 0.0,
    }


def operations(workdir: Path) -> dict[str, int]:
    """Storage requests and Service Bus operations the hosts counted, added up."""
    total: Counter[str] = Counter()
    for path in workdir.glob("host-*.stats.json"):
        try:
            total.update(json.loads(path.read_text()).get("operations", {}))
        except (OSError, ValueError):
            continue
    return dict(total)


_ACTOR_PID = re.compile(r"\.(\d+)\.[0-9a-f]+$")


def pid_of(actor: str) -> int:
    """The process id in an instance id (``role@host.pid.random``)."""
    found = _ACTOR_PID.search(actor)
    return int(found.group(1)) if found else 0


_TICK = re.compile(r"supervisor tick: TickReport\((.*)\)")


def ticks_logged(log: str) -> list[dict[str, float]]:
    """The Supervisor ticks host 0 logged (those that found rows due): what each handed out."""
    wanted = (
        "due",
        "handed_out",
        "messages",
        "returned",
        "left",
        "handled",
        "hand_out_s",
        "duration_s",
    )
    ticks = []
    for match in _TICK.finditer(log):
        fields = dict(re.findall(r"(\w+)=([\d.]+)", match.group(1)))
        ticks.append({name: float(fields.get(name, 0)) for name in wanted})
    return ticks


def stats(values: Sequence[float], bound_s: float) -> dict[str, Any]:
    ordered = sorted(values)

    def at(q: float) -> float | None:
        return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 3) if ordered else None

    return {
        "p50": at(0.5),
        "p95": at(0.95),
        "max": at(1.0),
        "over_bound": sum(v > bound_s for v in values),
    }


def summarize(runs: Sequence[Mapping[str, Any]], counts: Sequence[int]) -> dict[str, Any]:
    """Per host count, the medians over the rounds."""
    by_hosts: dict[str, Any] = {}
    for hosts in counts:
        mine = [r for r in runs if r["hosts"] == hosts and r["released"] == r["orders"]]
        if not mine:
            by_hosts[str(hosts)] = {"runs": 0}
            continue

        def median(key: str, of: Sequence[Mapping[str, Any]] = mine) -> float:
            return round(statistics.median(float(r[key]) for r in of), 3)

        kinds = sorted({k for r in mine for k in r["operations_per_recovery"]})
        by_hosts[str(hosts)] = {
            "runs": len(mine),
            "drain_s": median("drain_s"),
            "drain_periods": median("drain_periods"),
            "recoveries_per_s": median("recoveries_per_s"),
            "recoveries_per_s_per_host": round(median("recoveries_per_s") / hosts, 1),
            "host_cpu_ms_per_recovery": median("host_cpu_ms_per_recovery"),
            "latency_max_s": round(statistics.median(r["latency_s"]["max"] for r in mine), 3),
            "operations_per_recovery": {
                k: round(statistics.median(r["operations_per_recovery"].get(k, 0) for r in mine), 3)
                for k in kinds
            },
            "cpu_s": {
                name: round(statistics.median(r["cpu_s"].get(name, 0.0) for r in mine), 2)
                for name in sorted({n for r in mine for n in r["cpu_s"]})
            },
            "machine": {
                k: round(statistics.median(r["machine"][k] for r in mine), 3)
                for k in ("busy", "ours")
            },
            "tick_s_per_message": round(
                statistics.median(
                    t["hand_out_s"] / t["messages"]
                    for r in mine
                    for t in r["ticks"]
                    if t["messages"]
                ),
                4,
            ),
            "bound_s": mine[0]["bound"]["detection_s"],
            "period_s": mine[0]["bound"]["period_s"],
        }
    fewest, most = str(min(counts)), str(max(counts))
    rates = [by_hosts[k].get("recoveries_per_s") for k in (fewest, most)]
    if fewest != most and all(rates):
        by_hosts["speedup"] = round(rates[1] / rates[0], 2)
    return by_hosts


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


if __name__ == "__main__":
    sys.exit(main())
