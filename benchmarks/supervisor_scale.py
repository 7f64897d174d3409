"""How fast several Supervisor instances sharing the index's buckets detect overdue orders.

    python -m benchmarks.supervisor_scale [--instances 1,2,4] [--orders 400] [--period 2]
                                          [--kill] [--kill-mode idle|mid-tick]

For each instance count N, on fresh tables of one private in-memory Azurite (``--store memory``
runs the same against one shared in-memory store instead, for a quick check of the logic):

1. N Supervisor instances start, each a task on one event loop with its own
   :class:`service.runtime.Runtime` (own ``instance_id``, own Table clients) over the same tables
   and one in-memory bus; each also takes the rows ticks hand out (DueRows on the commands
   queue), as its commands trigger would (:mod:`service.recovery`). Each ticks on the
   schedule grid like the Functions timer: at every multiple of the period in wall-clock UTC,
   skipping an occurrence while its previous tick still runs. A tick is the
   real :func:`service.sweep.run_tick` with the period, lease and budget of
   ``supervisor_schedule = "*/<period> * * * * *"``.
2. ``--orders`` orders are created in flight (as intake creates them), their CompleteBy
   deadlines spread evenly over a window of ``--window-periods`` periods starting
   ``--warmup-periods`` periods after the instances start (time for the leases to settle).
   Nobody answers them, so each is released for a retry by whichever Supervisor sweeps it.
3. With ``--kill``, one instance dies in the middle of the window (not for N = 1: nobody would
   take over): the one holding the most buckets at its latest tick half a period before.
   ``idle`` (default) simulates a SIGKILL between two ticks: the task stops half a period
   after a tick time, its leases are not released. ``mid-tick`` simulates one during a tick:
   its last tick claims its leases (for less than a period) and dies before sweeping and
   before the checkpoint that would extend them.
4. When every order was released (or the window's end plus the bound has passed), the
   instances stop and each order's timeline is read.

Reading the JSON (one document on stdout, times in seconds):

- ``latency_s``: detection latency per order = time of the Supervisor's ``released`` timeline
  entry minus the order's CompleteBy; ``p50``/``p95``/``max`` and how many exceed
  ``bound.detection_s`` (:func:`service.operations.supervisor.recovery_bound`: period + budget +
  period).
  With N instances ticking on one grid an order waits at most a period for the next tick, plus
  the time the tick takes to reach it.
- ``per_instance``: per instance, ticks run, occurrences skipped (a tick ran past the next one),
  buckets held at its last tick and in the roster at the end, orders it released, mean and max
  tick duration, mean Table requests per tick (counted at the SDK pipeline per instance, as
  :mod:`adapters.op_counts` counts them for the process), claim attempts, lost claim races
  (ETag conflicts, re-read and retried) and ticks that gave up claiming.
- ``held_by_tick``: buckets each instance held at each grid occurrence (seconds from start);
  ``converged_at_s``: the first occurrence from which on every instance ticking held at most
  its fair share (``ceil(16 / instances ticking)``) and all 16 buckets were held (after a kill:
  the survivors' new shares); ``first_converged_at_s``: the first such occurrence at all.
- ``kill``: the victim, the buckets it held when it died, and the detection latency of the
  orders in those buckets that it did not release itself (all were overdue when it died or
  became due later): their ``max_latency_s`` against ``bound_s`` (``within_bound``).
- ``table_requests_total``: every Table request of the run (creation, ticks, reads after).
- ``cpus``, ``load_average_*``: Azurite, the instances and the creators share this machine;
  on a loaded one the ticks run out of budget and the latencies measure the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import dataclasses
import json
import logging
import math
import os
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from adapters.op_counts import COUNTS, OperationCounts
from adapters.settings import Connection, Settings
from adapters.store.active_index import INDEX_BUCKETS, index_partition
from adapters.store.records import OrderRecords
from adapters.store.rows import ConcurrencyConflict
from adapters.store.supervision import BucketLease, Member, Roster, Sweep
from adapters.tables import TableService
from benchmarks.supervisor_tick import QUEUES
from devstack.memory import MemoryBus, MemoryStore
from devstack.stack.azurite import AzuriteProcess
from domain import events, lifecycle
from domain.messages import DueRows, OrderSubmitted, utc_now
from domain.workflows import ORDER_WORKFLOW, Workflow
from service import apply
from service.operations.supervisor import RecoveryBound, recovery_bound
from service.operations.supervisor import lag as roster_lag
from service.recovery import handle_due_rows
from service.runtime import Runtime
from service.sweep import run_tick
from service.sweep_report import TickReport

KillMode = Literal["idle", "mid-tick"]
GAVE_UP = "supervisor roster kept changing"
"""What service.sweep logs when a tick lost every claim attempt (it sweeps nothing)."""
TICKING: contextvars.ContextVar[str] = contextvars.ContextVar("ticking", default="")
"""The instance whose task (and the tasks it starts) runs: the instances share one thread."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.supervisor_scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--instances", default="1,2,4", help="instance counts to run, e.g. 1,2,4")
    parser.add_argument("--orders", type=int, default=400, help="orders per instance count")
    parser.add_argument(
        "--period", type=int, default=2, help="Supervisor period in seconds (divides 60)"
    )
    parser.add_argument("--kill", action="store_true", help="kill one instance mid-window")
    parser.add_argument("--kill-mode", choices=("idle", "mid-tick"), default="idle")
    parser.add_argument("--warmup-periods", type=float, default=3.0)
    parser.add_argument("--window-periods", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=8, help="orders created or read at once")
    parser.add_argument("--store", choices=("azurite", "memory"), default="azurite")
    args = parser.parse_args(argv)
    if args.orders < 1 or args.period < 1 or args.window_periods <= 0:
        parser.error("--orders, --period and --window-periods must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    counts = [int(n) for n in args.instances.split(",") if n.strip()]
    if not counts or min(counts) < 1:
        raise SystemExit("--instances: positive numbers, e.g. 1,2,4")
    load_before = os.getloadavg()
    azurite: AzuriteProcess | None = None
    connection: str | None = None
    if args.store == "azurite":
        azurite = AzuriteProcess(Path(tempfile.mkdtemp(prefix="scale-")))
        connection = azurite.start().connection_string
    gave_up = _GaveUpCounter()
    tick_log = logging.getLogger("service.sweep")
    level = tick_log.level
    tick_log.addHandler(gave_up)
    tick_log.setLevel(logging.INFO)
    try:
        runs = [asyncio.run(run_one(n, args, connection, gave_up)) for n in counts]
    finally:
        tick_log.removeHandler(gave_up)
        tick_log.setLevel(level)
        if azurite is not None:
            azurite.stop()
    document = {
        "store": args.store,
        "period_s": args.period,
        "orders": args.orders,
        "window_s": args.window_periods * args.period,
        "warmup_s": args.warmup_periods * args.period,
        "buckets": INDEX_BUCKETS,
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "kill": args.kill,
        "kill_mode": args.kill_mode if args.kill else None,
        "runs": runs,
    }
    print(json.dumps(document, indent=2))
    return 0


# ------------------------------------------------------------------------------ instances


class _GaveUpCounter(logging.Handler):
    """Counts, per instance (:data:`TICKING`), the ticks that gave up claiming (they sweep
    nothing)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.by_instance: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(GAVE_UP):
            self.by_instance[TICKING.get()] += 1
        elif record.levelno >= logging.ERROR:
            self.errors[TICKING.get()] += 1


class CountingSupervision:
    """The roster of one instance, counting its claims and the races it lost."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.claims = 0
        self.conflicts = 0
        self.checkpoints = 0
        self.checkpoints_lost = 0
        self.killed = False
        """Set to crash the next tick between its claim and its checkpoint (a SIGKILL)."""

    async def read(self) -> Roster:
        roster: Roster = await self._inner.read()
        return roster

    async def claim(
        self,
        member: Member,
        hold: Sequence[BucketLease],
        release: Sequence[BucketLease],
        reap: Sequence[Member] = (),
    ) -> dict[int, str]:
        self.claims += 1
        try:
            etags: dict[int, str] = await self._inner.claim(member, hold, release, reap)
        except ConcurrencyConflict:
            self.conflicts += 1
            raise
        return etags

    async def checkpoint(
        self, sweeps: Sequence[Sweep], by: str, *, others: Sequence[BucketLease] = ()
    ) -> int:
        if self.killed:
            raise RuntimeError("killed mid-tick: the tick never reaches its checkpoint")
        recorded: int = await self._inner.checkpoint(sweeps, by, others=others)
        self.checkpoints += len(sweeps) + len(others)
        self.checkpoints_lost += len(sweeps) + len(others) - recorded
        return recorded


class _StoreView:
    """A store shared with other instances, seen through this instance's own roster wrapper."""

    def __init__(self, inner: Any, supervision: CountingSupervision) -> None:
        self._inner = inner
        self.supervision = supervision

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@dataclass
class TickRecord:
    occurrence: float
    """The grid time (epoch seconds) this tick ran for."""
    started: float
    report: TickReport | None
    error: str | None
    requests: dict[str, int]
    last: bool = False
    """The victim's final tick (``mid-tick`` kill: claimed, then died before sweeping)."""


@dataclass
class Instance:
    """One Supervisor instance: a task ticking on the schedule grid."""

    name: str
    rt: Runtime
    roster: CountingSupervision
    requests: OperationCounts | None
    period: float
    stop: asyncio.Event
    dies_at: float | None = None
    kill_mode: KillMode = "idle"
    ticks: list[TickRecord] = field(default_factory=list)
    skipped: int = 0
    died_at: float | None = None
    task: asyncio.Task[None] | None = None
    recovered_from_hand_outs: int = 0
    hand_outs: HandOuts | None = None
    consumer: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=self.name)
        if self.hand_outs is not None:
            self.consumer = asyncio.create_task(self._consume(), name=f"{self.name}-commands")

    async def _consume(self) -> None:
        """Take the rows ticks handed out (DueRows on the commands queue), as the commands
        trigger of this instance would, until told to stop or killed."""
        assert self.hand_outs is not None
        TICKING.set(self.name)
        while not self.stop.is_set() and self.died_at is None:
            message = self.hand_outs.take()
            if message is None:
                await asyncio.sleep(0.02)
                continue
            outcomes = await handle_due_rows(self.rt, message, caused_by=None)
            self.recovered_from_hand_outs += outcomes.retried + outcomes.compensating
            self.recovered_from_hand_outs += outcomes.failed

    async def _run(self) -> None:
        TICKING.set(self.name)
        next_at = next_grid(time.time(), self.period)
        while True:
            wake = next_at
            if self.dies_at is not None and self.kill_mode == "idle":
                wake = min(next_at, self.dies_at)
            if await self._sleep_until(wake):
                return
            if self.dies_at is not None and wake >= self.dies_at:
                if self.kill_mode == "mid-tick":
                    self.roster.killed = True
                    await self._tick(next_at, budget_s=0.0, last=True)
                self.died_at = time.time()  # SIGKILL: no lease is released
                return
            await self._tick(next_at)
            following = next_grid(time.time(), self.period)
            self.skipped += max(0, round((following - next_at) / self.period) - 1)
            next_at = following

    async def _sleep_until(self, when: float) -> bool:
        """Wait until wall-clock ``when``; True if told to stop meanwhile."""
        while (remaining := when - time.time()) > 0:
            try:
                await asyncio.wait_for(self.stop.wait(), remaining)
            except TimeoutError:
                continue
            return True
        return self.stop.is_set()

    async def _tick(
        self, occurrence: float, *, budget_s: float | None = None, last: bool = False
    ) -> None:
        before = self.requests.snapshot() if self.requests else {}
        started = time.time()
        report: TickReport | None = None
        error: str | None = None
        try:
            report = await run_tick(self.rt, budget_s=budget_s)
        except Exception as exc:  # the Functions host logs a failed invocation and goes on
            error = f"{type(exc).__name__}: {exc}"[:300]
        after = self.requests.snapshot() if self.requests else {}
        delta = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
        self.ticks.append(TickRecord(occurrence, started, report, error, delta, last))

    def recovered(self) -> int:
        return self.recovered_from_hand_outs + sum(
            t.report.retried + t.report.compensating + t.report.failed
            for t in list(self.ticks)
            if t.report is not None
        )


class HandOuts:
    """The commands queue of the shared in-memory bus, as its consumers see it: each DueRows
    message taken by one of them."""

    def __init__(self, bus: MemoryBus, queue: str) -> None:
        self._bus = bus
        self._queue = queue
        self._seen = 0

    def take(self) -> DueRows | None:
        while self._seen < len(self._bus.sent):
            sent = self._bus.sent[self._seen]
            self._seen += 1
            if sent.queue == self._queue and isinstance(sent.message, DueRows):
                return sent.message
        return None


def next_grid(now: float, period: float) -> float:
    """The first schedule occurrence strictly after ``now`` (multiples of the period)."""
    return (math.floor(now / period) + 1) * period


# ------------------------------------------------------------------------------ one run


@dataclass(frozen=True)
class Created:
    order_id: str
    complete_by: datetime
    bucket: int
    late: bool
    """Created after the deadline it was meant to have (CompleteBy is then a moment later)."""


class Backend:
    """Fresh tables (or a fresh in-memory store) for one instance count, and stores over them."""

    def __init__(self, connection: str | None, tag: str) -> None:
        self.connection = connection
        self.tables = {
            "orders_table": f"o{tag}",
            "active_table": f"a{tag}",
            "supervision_table": f"s{tag}",
        }
        self.memory = MemoryStore() if connection is None else None

    def settings(self, period: int) -> Settings:
        return Settings(
            queues=QUEUES,
            service_urls={},
            servicebus=Connection("servicebus"),
            storage=Connection("storage", connection_string=self.connection),
            supervisor_schedule=f"*/{period} * * * * *",
            clock_skew=timedelta(0),  # every instance here runs on this machine's one clock
            **self.tables,
        )

    def store(self, requests: OperationCounts | None = None) -> Any:
        if self.memory is not None:
            return self.memory
        assert self.connection is not None
        process_hook = COUNTS.request_hook("table")
        own_hook = requests.request_hook("table") if requests is not None else None

        def hook(request: Any) -> None:
            process_hook(request)
            if own_hook is not None:
                own_hook(request)

        service = TableService.from_connection_string(self.connection, request_hook=hook)
        return OrderRecords(service, owns_service=True, **self.tables)


async def run_one(
    n: int, args: argparse.Namespace, connection: str | None, gave_up: _GaveUpCounter
) -> dict[str, Any]:
    period = float(args.period)
    tag = f"n{n}{uuid.uuid4().hex[:8]}"
    backend = Backend(connection, tag)
    settings = backend.settings(args.period)
    bound = recovery_bound(settings)
    bus = MemoryBus()
    observer = Runtime(
        settings=settings,
        store=backend.store(),
        bus=bus,  # type: ignore[arg-type]
        workflows=settings.workflows(),
        instance_id=f"bench-{tag}",
    )
    await observer.store.ensure_tables()
    COUNTS.reset()
    gave_up.by_instance.clear()
    gave_up.errors.clear()

    stop = asyncio.Event()
    instances = [new_instance(f"sup{i}-{tag}", i, backend, settings, bus, stop) for i in range(n)]
    hand_outs = HandOuts(bus, settings.queue("commands"))
    for instance in instances:
        instance.hand_outs = hand_outs
    started = time.time()
    window_start = started + args.warmup_periods * period
    window = args.window_periods * period
    window_end = window_start + window
    deadlines = [
        datetime.fromtimestamp(window_start + window * i / args.orders, UTC)
        for i in range(args.orders)
    ]
    # The victim is picked half a period before the tick it dies at (idle: half a period after
    # that tick; mid-tick: during it): the instance holding the most buckets then.
    middle = next_grid(window_start + window / 2 - period, period)
    pick_at = middle - period / 2 if args.kill and n > 1 else None
    victim: Instance | None = None
    victim_buckets: list[int] | None = None
    created: list[Created] = []
    created_at = started
    hard_end = window_end + bound.detection_s + period + 1.0
    for instance in instances:
        instance.start()
    creating = asyncio.create_task(
        create_orders(observer, deadlines, f"sc{tag}", args.workers), name="create"
    )
    try:
        while True:
            now = time.time()
            if pick_at is not None and victim is None and now >= pick_at:
                victim = max(reversed(instances), key=last_held)
                victim.kill_mode = args.kill_mode
                victim.dies_at = middle + (period / 2 if args.kill_mode == "idle" else 0.0)
            if victim is not None and victim_buckets is None and victim.died_at is not None:
                victim_buckets = held_by(await observer.store.supervision.read(), victim.name)
            if creating.done():
                created, created_at = creating.result()
                all_released = sum(i.recovered() for i in instances) >= len(created)
                killed = pick_at is None or victim_buckets is not None
                if (all_released and now >= window_end and killed) or now >= hard_end:
                    break
            await asyncio.sleep(0.1)
    finally:
        creating.cancel()
        stop.set()
        tasks = [t for i in instances for t in (i.task, i.consumer) if t is not None]
        await asyncio.wait(tasks, timeout=60)
    created_s = created_at - started
    ended = time.time()
    roster = await observer.store.supervision.read()
    end_lag = roster_lag(roster, utc_now(), bound)

    released = await read_released(observer, created, args.workers)
    result = summarize(
        n=n,
        bound=bound,
        instances=instances,
        created=created,
        released=released,
        started=started,
        roster_holders=end_lag.holders,
        gave_up=gave_up,
    )
    result["elapsed_s"] = round(ended - started, 1)
    result["orders_created_by_s"] = round(created_s, 2)
    result["roster_at_end"] = end_lag.as_dict()
    if args.kill:
        result["kill"] = (
            {"skipped": "one instance: nobody to take its buckets over"}
            if victim is None
            else kill_report(victim, victim_buckets or [], created, released, started, bound)
        )
    result["table_requests_total"] = sum(COUNTS.snapshot().values())
    for instance in instances:
        await instance.rt.close()
    await observer.close()
    return result


def new_instance(
    name: str,
    seed: int,
    backend: Backend,
    settings: Settings,
    bus: MemoryBus,
    stop: asyncio.Event,
) -> Instance:
    requests = OperationCounts() if backend.memory is None else None
    store = backend.store(requests)
    roster = CountingSupervision(store.supervision)
    rt = Runtime(
        settings=settings,
        store=_StoreView(store, roster),  # type: ignore[arg-type]
        bus=bus,  # type: ignore[arg-type]
        workflows=settings.workflows(),
        instance_id=name,
        rng=random.Random(seed),
    )
    return Instance(
        name=name,
        rt=rt,
        roster=roster,
        requests=requests,
        period=settings.supervisor_period.total_seconds(),
        stop=stop,
    )


async def create_orders(
    rt: Runtime, deadlines: Sequence[datetime], prefix: str, workers: int
) -> tuple[list[Created], float]:
    """Orders in flight whose CompleteBy is ``deadlines[i]``, created earliest deadline first
    (``workers`` at once), and when the last was created (a time.time())."""
    base = rt.workflow(ORDER_WORKFLOW.name)
    at_once = asyncio.Semaphore(workers)

    async def one(i: int) -> Created:
        async with at_once:
            return await create_one(rt, base, f"{prefix}-{i:06d}", deadlines[i])

    created = await asyncio.gather(*(one(i) for i in range(len(deadlines))))
    return list(created), time.time()


async def create_one(rt: Runtime, base: Workflow, order_id: str, deadline: datetime) -> Created:
    """One order as intake creates it, whose CompleteBy is ``deadline`` (or a moment from now,
    if that has passed already)."""
    submitted = OrderSubmitted(
        order_id=order_id,
        customer_id="c-1",
        items=[{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 100}],
        currency="EUR",
    )
    now = utc_now()
    budget = deadline - now
    late = budget <= timedelta(0)
    budget = max(budget, timedelta(milliseconds=1))
    steps = tuple(
        dataclasses.replace(s, complete_by_budget=budget, queue_budget=timedelta(0))
        for s in base.steps
    )
    flow = Workflow(name=base.name, steps=steps, retry=base.retry)
    ctx = events.Context(workflow=flow, now=now, actor="scheduler:bench")
    decision = lifecycle.submit(submitted, ctx)
    assert decision.order is not None and decision.entry is not None
    assert decision.order.complete_by is not None
    await rt.store.create(
        submitted, decision.order, decision.entry, due=apply.due(rt, decision.order)
    )
    bucket = int(index_partition(order_id)[1:])
    return Created(order_id, decision.order.complete_by, bucket, late)


@dataclass(frozen=True)
class Released:
    at: datetime
    by: str
    latency_s: float


async def read_released(
    rt: Runtime, created: Sequence[Created], workers: int
) -> dict[str, Released | None]:
    """Each order's first ``released`` timeline entry (None if the Supervisor never got to it),
    ``workers`` read at once."""
    at_once = asyncio.Semaphore(workers)

    async def one(order: Created) -> tuple[str, Released | None]:
        async with at_once:
            timeline = await rt.store.get_timeline(order.order_id)
        for entry in timeline:
            if entry.event == "released":
                latency = (entry.at - order.complete_by).total_seconds()
                return order.order_id, Released(
                    entry.at, entry.actor.removeprefix("supervisor:"), latency
                )
        return order.order_id, None

    return dict(await asyncio.gather(*(one(order) for order in created)))


def last_held(instance: Instance) -> int:
    """Buckets the instance held at its latest tick."""
    reports = [t.report for t in list(instance.ticks) if t.report is not None]
    return reports[-1].held if reports else 0


def held_by(roster: Roster, instance: str) -> list[int]:
    now = utc_now()
    return [b.bucket for b in roster.buckets if b.holder == instance and not b.free(now)]


# ------------------------------------------------------------------------------ report


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in [0, 1]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def latency_stats(values: Sequence[float], bound_s: float) -> dict[str, Any]:
    def r(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    return {
        "count": len(values),
        "p50": r(percentile(values, 0.50)),
        "p95": r(percentile(values, 0.95)),
        "max": r(max(values, default=None)),
        "min": r(min(values, default=None)),
        "over_bound": sum(v > bound_s for v in values),
    }


def summarize(
    *,
    n: int,
    bound: RecoveryBound,
    instances: Sequence[Instance],
    created: Sequence[Created],
    released: dict[str, Released | None],
    started: float,
    roster_holders: dict[str, int],
    gave_up: _GaveUpCounter,
) -> dict[str, Any]:
    latencies = [r.latency_s for r in released.values() if r is not None]
    by_instance = Counter(r.by for r in released.values() if r is not None)
    per_instance = {}
    for instance in instances:
        ticks = [t for t in instance.ticks if not t.last]
        reports = [t.report for t in ticks if t.report is not None]
        durations = [r.duration_s for r in reports]
        requests = [sum(t.requests.values()) for t in ticks]
        kinds: Counter[str] = Counter()
        for t in ticks:
            kinds.update(t.requests)
        per_instance[instance.name] = {
            "ticks": len(ticks),
            "skipped_occurrences": instance.skipped,
            "tick_errors": sum(t.error is not None for t in ticks),
            "held_last_tick": reports[-1].held if reports else None,
            "held_at_end": roster_holders.get(instance.name, 0),
            "released": by_instance.get(instance.name, 0),
            "tick_s_mean": _mean(durations),
            "tick_s_max": round(max(durations, default=0.0), 3),
            "table_requests_per_tick": _mean(requests) if instance.requests else None,
            "table_requests_per_tick_by_kind": (
                {k: round(v / len(ticks), 1) for k, v in sorted(kinds.items())} if ticks else {}
            ),
            "claims": instance.roster.claims,
            "claim_conflicts": instance.roster.conflicts,
            "ticks_gave_up_claiming": gave_up.by_instance.get(instance.name, 0),
            "errors_logged": gave_up.errors.get(instance.name, 0),
            "buckets_cut_by_budget": sum(r.held - r.swept for r in reports),
            "checkpoints_lost": instance.roster.checkpoints_lost,
            "died_at_s": None if instance.died_at is None else round(instance.died_at - started, 2),
        }
    history = held_history(instances, started)
    return {
        "instances": n,
        "bound": bound.as_dict(),
        "orders": len(created),
        "created_late": sum(c.late for c in created),
        "released": len(latencies),
        "not_released": [oid for oid, r in released.items() if r is None][:20],
        "latency_s": latency_stats(latencies, bound.detection_s),
        "fair_share_at_end": math.ceil(INDEX_BUCKETS / max(1, len(roster_holders))),
        "per_instance": per_instance,
        "ticks_total": sum(v["ticks"] for v in per_instance.values()),
        "table_requests_per_tick_per_instance": _mean(
            [
                v["table_requests_per_tick"]
                for v in per_instance.values()
                if v["table_requests_per_tick"] is not None
            ]
        ),
        "held_by_tick": history,
        "first_converged_at_s": converged_at(history, first=True),
        "converged_at_s": converged_at(history),
    }


def held_history(instances: Sequence[Instance], started: float) -> list[dict[str, Any]]:
    """Buckets held per instance at each grid occurrence any instance ticked at."""
    by_occurrence: dict[float, dict[str, int]] = {}
    for instance in instances:
        for t in instance.ticks:
            if t.report is not None:
                held = by_occurrence.setdefault(round(t.occurrence, 3), {})
                held[instance.name] = t.report.held
    return [
        {"t": round(occurrence - started, 2), "held": held}
        for occurrence, held in sorted(by_occurrence.items())
    ]


def converged_at(history: Sequence[dict[str, Any]], *, first: bool = False) -> float | None:
    """The first occurrence from which on all buckets were held, none above a fair share of
    the instances ticking then (``first``: the first such occurrence at all)."""
    since: float | None = None
    for point in history:
        held: dict[str, int] = point["held"]
        share = math.ceil(INDEX_BUCKETS / len(held))
        fair = sum(held.values()) == INDEX_BUCKETS and max(held.values()) <= share
        if fair and first:
            return float(point["t"])
        if fair and since is None:
            since = point["t"]
        elif not fair:
            since = None
    return since


def kill_report(
    victim: Instance,
    buckets: Sequence[int],
    created: Sequence[Created],
    released: dict[str, Released | None],
    started: float,
    bound: RecoveryBound,
) -> dict[str, Any]:
    """Orders in the victim's buckets that it did not release: someone had to take them over."""
    mine = [c for c in created if c.bucket in set(buckets)]
    affected = [c for c in mine if (r := released[c.order_id]) is None or r.by != victim.name]
    latencies = [r.latency_s for c in affected if (r := released[c.order_id]) is not None]
    worst = max(affected, key=lambda c: _latency(released, c), default=None)
    died = victim.died_at or started
    last = [t for t in victim.ticks if not t.last]
    return {
        "victim": victim.name,
        "mode": victim.kill_mode,
        "died_at_s": round(died - started, 2),
        "last_full_tick_at_s": round(last[-1].occurrence - started, 2) if last else None,
        "buckets": list(buckets),
        "orders_in_buckets": len(mine),
        "orders_taken_over": len(affected),
        "taken_over_by": dict(Counter(r.by for c in affected if (r := released[c.order_id]))),
        "latency_s": latency_stats(latencies, bound.detection_s),
        "max_latency_s": None if not latencies else round(max(latencies), 3),
        "worst_order_due_at_s": None
        if worst is None
        else round(worst.complete_by.timestamp() - started, 3),
        "bound_s": bound.detection_s,
        "within_bound": bool(latencies) and max(latencies) <= bound.detection_s,
        "not_released": sum(released[c.order_id] is None for c in affected),
    }


def _latency(released: dict[str, Released | None], order: Created) -> float:
    r = released[order.order_id]
    return math.inf if r is None else r.latency_s


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


if __name__ == "__main__":
    sys.exit(main())
