"""Side by side with DBOS: the same workflows, the same 1 ms remote calls, one session.

    python -m benchmarks.peers [--orders 1000] [--workflow single_step --workflow order]
                               [--side dbos --side ours] [--rounds 1] [--rate 0 | R]
                               [--paced-orders 300] [--no-paced] [--cpu-split] [--json]

Two engines run the project's two workflows (``single_step``: one remote call; ``order``:
three), alternately, never at the same time:

* **DBOS** (PyPI ``dbos`` 3.x, in its own virtual environment ``.bench/dbos-venv``, made on the
  first run; never an app dependency) on SQLite, its files on tmpfs (``/dev/shm``), one queue
  with worker concurrency ``--dbos-concurrency`` (32) polled every ``--dbos-polling`` s (0.05).
  Each workflow is enqueued on that queue and runs one or three DBOS steps, each an HTTP POST
  (httpx) to a local server answering after 1 ms (benchmarks.peers_dbos).
* **ours**: the local stack (Azurite in memory, the development Service Bus broker, the fake
  services with the ``latency-1ms`` profile: every call answered after 1 ms, no faults, and
  ``--hosts`` function hosts), orders sent to the orders queue as an application would.

Each run first does ``--warmup`` unmeasured workflows, then submits ``--orders`` at once
(*burst*: throughput), and in a second pass ``--paced-orders`` at ``--rate`` per second
(*paced*: latency below saturation; ``--rate 0``, the default, takes half the slower side's
burst throughput for that workflow in this session). Sides alternate which goes first from one
slot to the next; ``--rounds`` repeats both passes. Our stack is stopped while DBOS runs.

Per run: workflows/s (first submission to last completion), latency p50/p99/max (submission
to completion: DBOS from the return of its enqueue to the return of its last step; ours from
``submitted_at`` to the final state's ``updated_at``), and CPU milliseconds per workflow of each
process (ours: the hosts, Azurite, the broker, the fakes; DBOS: its process and its HTTP
fake), read from /proc around the measured batch; ``engine`` is the total without the fakes.
Ours also gives the requests per order the hosts counted at the SDK (adapters/op_counts.py: Table
requests by method, Service Bus sends, receives, settlements) and the function executions per
order, from which benchmarks.cost prices a million orders in Azure.

With ``--cpu-split``, our hosts are sampled with py-spy in the burst runs and their CPU is split
into what deploys (the app's code and the libraries under it: what an instance spends per order
in Azure) and what only the development host spends (receive, settle, lock renewal, conversion
to ``func.ServiceBusMessage``, its stats), each by kind (benchmarks.cpu_split); the dev-only
total adds Azurite and the broker. Beside the burst ratio it prints throughput at equal CPU:
DBOS's CPU per workflow over ours (the whole engine, and what deploys alone). py-spy's own CPU
(``sampler_cpu_ms``) is on the same cores, so sampled runs are a little slower.

What is not counted: our benchmark process's own CPU (it sends the orders and watches them
finish); DBOS enqueues from inside its own process, so its enqueue cost is in its CPU. Watching
costs the stack next to nothing while the batch runs, as DBOS's in-process completion events
cost DBOS nothing: the hosts' stats files say when intake has taken every order, then one
index query per second says when none of them is left in flight. Each order's final state is
read once the CPU has been read (a point read per order, after the measured window).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer
from azure.servicebus.aio import ServiceBusClient
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from adapters.servicebus import to_servicebus_message
from adapters.settings import Settings
from benchmarks import cost, cpu_split
from benchmarks.history import new_order, quantiles
from devstack.fakes.profiles import example_profile
from devstack.observe import (
    FinishWatch,
    any_active,
    host_invocations,
    host_operations_after,
    process_cpu,
)
from devstack.orders import SEND_BATCH, open_store
from devstack.stack import processes
from devstack.stack.local_stack import LocalStack, StackInfo
from domain.messages import OrderSubmitted
from domain.order import Order
from domain.states import ProcessState

ROOT = processes.REPO_ROOT
DBOS_VENV = ROOT / ".bench" / "dbos-venv"
DBOS_REQUIREMENTS = ("dbos>=3.4,<4", "httpx==0.28.1")
PROFILE = "latency-1ms"
WORKFLOWS = ("single_step", "order")
SIDES = ("dbos", "ours")
POLL_S = 0.5
"""How often our side looks whether a batch is over (the hosts' stats files, then one index
query). Times come from the orders' own timestamps, so this only bounds how soon a run ends."""
FAKE_START_S = 20.0

Side = Literal["dbos", "ours"]
T = TypeVar("T")
Mode = Literal["burst", "paced"]


# ------------------------------------------------------------------------------ results


class Latency(BaseModel):
    p50: float | None
    p99: float | None
    max: float | None


class RunResult(BaseModel):
    side: Side
    workflow: str
    mode: Mode
    round: int
    orders: int
    rate: float
    """Submissions per second; 0: all at once."""
    finished: int
    failed: int
    seconds: float
    workflows_per_s: float
    latency_s: Latency
    submit_s: float
    """First to last submission. In a burst ours are on the queue within a second or so, while
    DBOS enqueues one workflow at a time in its own process (a SQLite write each), so its
    submissions spread over most of the run and its burst latencies start later."""
    cpu_ms: dict[str, float]
    """CPU milliseconds per workflow, per process (group)."""
    cpu_ms_engine: float
    """CPU milliseconds per workflow of everything but the remote-call fakes."""
    load_1m: float
    """The machine's 1-minute load average when the run ended (2 cores shared with others)."""
    operations_per_order: dict[str, float] = {}
    executions_per_order: float | None = None
    cpu_split_ms: dict[str, dict[str, float]] = {}
    """Ours, sampled (``--cpu-split``): the hosts' CPU milliseconds per workflow by part
    (``deploys``, ``dev_host``, ``shared``) and kind (benchmarks.cpu_split)."""
    sampler_cpu_ms: float | None = None
    """py-spy's own CPU per workflow while it sampled (on the same cores, not in cpu_ms)."""


def timing(pairs: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """Throughput and latency from (submitted, completed) epoch seconds of each finished one."""
    if not pairs:
        empty = Latency(p50=None, p99=None, max=None)
        return {
            "finished": 0,
            "seconds": 0.0,
            "workflows_per_s": 0.0,
            "latency_s": empty,
            "submit_s": 0.0,
        }
    starts = [start for start, _ in pairs]
    span = max(end for _, end in pairs) - min(starts)
    return {
        "finished": len(pairs),
        "seconds": round(span, 2),
        "submit_s": round(max(starts) - min(starts), 2),
        "workflows_per_s": round(len(pairs) / span, 2) if span > 0 else 0.0,
        "latency_s": Latency(**quantiles(sorted(end - start for start, end in pairs))),
    }


def per_workflow_ms(cpu_s: Mapping[str, float], count: int) -> dict[str, float]:
    return {name: round(seconds * 1000 / count, 2) for name, seconds in cpu_s.items()}


def load_1m() -> float:
    return round(os.getloadavg()[0], 2)


# ------------------------------------------------------------------------------ DBOS


def dbos_python(venv: Path, say: Callable[[str], None]) -> tuple[Path, str]:
    """The DBOS environment's interpreter and DBOS version, creating it on first use."""
    python = venv / "bin" / "python"
    version = _dbos_version(python)
    if version is None:
        say(f"installing {' '.join(DBOS_REQUIREMENTS)} into {venv} (first run only)")
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, *DBOS_REQUIREMENTS], check=True)
        version = _dbos_version(python)
        if version is None:
            raise RuntimeError(f"DBOS did not install into {venv}")
    return python, version


def _dbos_version(python: Path) -> str | None:
    if not python.exists():
        return None
    probe = "import dbos, httpx; from importlib.metadata import version; print(version('dbos'))"
    answer = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    return answer.stdout.strip() if answer.returncode == 0 else None


def tmpfs_dir(prefix: str = "peers-dbos-") -> Path:
    """A new directory on tmpfs when there is one (our stack is in memory): DBOS's SQLite
    files, the latency benchmark's span files."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


class DbosSide:
    """DBOS runs, each a fresh process with a fresh SQLite database, against one HTTP fake."""

    def __init__(
        self, python: Path, workdir: Path, *, concurrency: int, polling: float, warmup: int
    ) -> None:
        self.python = python
        self.workdir = workdir
        self.concurrency = concurrency
        self.polling = polling
        self.warmup = warmup
        self.db_root = tmpfs_dir()
        self._fake: subprocess.Popen | None = None
        self.fake_url = ""

    def start(self) -> None:
        port_file = self.workdir / "dbos-fake.port"
        port_file.unlink(missing_ok=True)
        argv = [str(self.python), "-m", "benchmarks.peers_dbos", "serve"]
        argv += ["--port-file", str(port_file)]
        self._fake = processes.spawn(argv, log_path=self.workdir / "dbos-fake.log", cwd=ROOT)
        if not processes.wait_until(port_file.is_file, timeout=FAKE_START_S, proc=self._fake):
            raise processes.ServiceStartError(
                "the DBOS side's HTTP fake did not start:\n"
                + processes.tail(self.workdir / "dbos-fake.log")
            )
        self.fake_url = f"http://127.0.0.1:{int(port_file.read_text())}"

    def stop(self) -> None:
        if self._fake is not None:
            processes.stop(self._fake)
            self._fake = None
        shutil.rmtree(self.db_root, ignore_errors=True)

    def run(self, workflow: str, count: int, rate: float, mode: Mode, round_: int) -> RunResult:
        assert self._fake is not None, "start first"
        db_dir = self.db_root / uuid.uuid4().hex[:8]
        argv = [str(self.python), "-m", "benchmarks.peers_dbos", "run"]
        argv += ["--workflow", workflow, "--orders", str(count), "--rate", str(rate)]
        argv += ["--fake-url", self.fake_url, "--fake-pid", str(self._fake.pid)]
        argv += ["--db-dir", str(db_dir), "--warmup", str(self.warmup)]
        argv += ["--concurrency", str(self.concurrency), "--polling", str(self.polling)]
        log_path = self.workdir / f"dbos-{workflow}-{mode}-{round_}.log"
        try:
            with open(log_path, "wb") as log:
                done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=log)
        finally:
            shutil.rmtree(db_dir, ignore_errors=True)
        if done.returncode != 0:
            raise RuntimeError(f"DBOS run failed ({done.returncode}):\n{processes.tail(log_path)}")
        report = json.loads(done.stdout.decode().strip().splitlines()[-1])
        pairs = [(w["enqueued_at"], w["completed_at"]) for w in report["workflows"]]
        cpu = per_workflow_ms({"dbos": report["cpu_s"], "fake": report["fake_cpu_s"]}, count)
        return RunResult(
            side="dbos",
            workflow=workflow,
            mode=mode,
            round=round_,
            orders=count,
            rate=rate,
            failed=sum(n for status, n in report["statuses"].items() if status != "SUCCESS"),
            cpu_ms=cpu,
            cpu_ms_engine=cpu["dbos"],
            load_1m=load_1m(),
            **timing(pairs),
        )


# ------------------------------------------------------------------------------ ours


class OursSide:
    """The local stack, started when our side runs and stopped while DBOS does."""

    def __init__(
        self,
        workdir: Path,
        *,
        hosts: int,
        warmup: int,
        timeout: float,
        say: Callable[[str], None],
        telemetry: Path | None = None,
        split: bool = False,
    ) -> None:
        """``telemetry``: the hosts write their spans there (benchmarks.latency); None: off.
        ``split``: sample the hosts in burst runs and split their CPU (benchmarks.cpu_split)."""
        self.workdir = workdir
        self.split = split
        self.telemetry = telemetry
        self.hosts = hosts
        self.warmup = warmup
        self.timeout = timeout
        self.say = say
        self._stack: LocalStack | None = None
        self._info: StackInfo | None = None

    async def ensure_started(self) -> StackInfo:
        if self._info is None:
            self._stack = LocalStack(
                self.workdir,
                hosts=self.hosts,
                profile=example_profile(PROFILE),
                telemetry=self.telemetry,
            )
            self._info = await self._stack.start(progress=lambda step: self.say(f"ours: {step}"))
        return self._info

    def stop(self) -> None:
        if self._stack is not None:
            self._stack.stop()
        self._stack, self._info = None, None

    async def run(
        self, workflow: str, count: int, rate: float, mode: Mode, round_: int
    ) -> RunResult:
        info = await self.ensure_started()
        run = uuid.uuid4().hex[:6]
        if self.warmup:
            warm = await self.batch(info, workflow, self.warmup, 0.0, f"peers-warm-{run}-")
            await self.finals(info, warm)
        # The hosts rewrite their stats files every second: wait for fresh ones, or the
        # warm-up's last requests would be counted in this run.
        ops_before = await host_operations_after(self.workdir, time.time())
        calls_before = invocations(self.workdir)
        sampler = self._sampler(info) if mode == "burst" else None
        if sampler is not None:
            sampler.start()
        cpu_before = process_cpu(info.pids)
        submitted = await self.batch(info, workflow, count, rate, f"peers-{run}-")
        cpu_after = process_cpu(info.pids)
        split = (
            None if sampler is None else cpu_split.merged(sampler.stop(str(ROOT) + "/").values())
        )
        finals = await self.finals(info, submitted)
        ops_after = await host_operations_after(self.workdir, time.time())
        calls = sum(invocations(self.workdir).values()) - sum(calls_before.values())
        when = {o.order_id: o.submitted_at.timestamp() for o in submitted}
        pairs = [(when[i], o.updated_at.timestamp()) for i, o in finals.items()]
        cpu = per_workflow_ms(grouped_cpu(cpu_before, cpu_after), count)
        return RunResult(
            side="ours",
            workflow=workflow,
            mode=mode,
            round=round_,
            orders=count,
            rate=rate,
            failed=sum(o.state is ProcessState.ERROR for o in finals.values()),
            cpu_ms=cpu,
            cpu_ms_engine=round(sum(ms for name, ms in cpu.items() if name != "fakes"), 2),
            load_1m=load_1m(),
            operations_per_order={
                kind: round((n - ops_before.get(kind, 0)) / count, 3)
                for kind, n in sorted(ops_after.items())
                if n != ops_before.get(kind, 0)
            },
            executions_per_order=round(calls / count, 3),
            cpu_split_ms={} if split is None else cpu_split.per_workflow_ms(split, count),
            sampler_cpu_ms=None
            if sampler is None
            else round(sampler.sampler_cpu_s * 1000 / count, 2),
            **timing(pairs),
        )

    def _sampler(self, info: StackInfo) -> cpu_split.Sampler | None:
        if not self.split:
            return None
        executable = cpu_split.py_spy()
        if executable is None:
            raise RuntimeError("--cpu-split needs py-spy (requirements-dev.txt)")
        hosts = {name: pid for name, pid in info.pids.items() if name.startswith("host-")}
        return cpu_split.Sampler(executable, hosts, self.workdir)

    async def batch(
        self, info: StackInfo, workflow: str, count: int, rate: float, prefix: str
    ) -> list[OrderSubmitted]:
        """Send ``count`` orders (each built just before it is sent, so its ``submitted_at``
        is its submission time) and wait until none is in flight: intake has taken all of
        them (the hosts' stats files) and the active-order index holds none (an order leaves
        it only once finished and owing nothing)."""
        submitted: list[OrderSubmitted] = []
        ours = {f"{prefix}{n:06d}" for n in range(count)}

        def orders() -> Iterator[OrderSubmitted]:
            for n in range(count):
                order = new_order(prefix, n, workflow)
                submitted.append(order)
                yield order

        taken_before = host_invocations(self.workdir, "scheduler_intake", counted="successes")
        started = time.monotonic()
        sending = asyncio.create_task(submit(info.settings, orders(), rate))
        try:
            async with open_store(info.settings) as store:
                while time.monotonic() - started < self.timeout:
                    await asyncio.sleep(POLL_S)
                    if sending.done() and sending.exception() is not None:
                        raise RuntimeError("sending orders failed") from sending.exception()
                    taken = host_invocations(self.workdir, "scheduler_intake", counted="successes")
                    if not sending.done() or taken - taken_before < count:
                        continue
                    if not await any_active(store, ours):
                        break
            await sending
        finally:
            sending.cancel()  # done by now, unless the wait failed: then stop sending
        return submitted

    async def finals(
        self, info: StackInfo, submitted: Sequence[OrderSubmitted]
    ) -> dict[str, Order]:
        """Each order's final state, read once the batch is over. An order still running (a
        duplicate intake could end the wait early) is waited for, and said."""
        watch = FinishWatch([o.order_id for o in submitted], reads_per_poll=len(submitted))
        async with open_store(info.settings) as store:
            await watch.poll(store)
            if watch.unfinished:
                self.say(
                    f"ours: {watch.unfinished} orders were still running when the batch's "
                    "CPU was read; waiting for them (their CPU is not counted)"
                )
            started = time.monotonic()
            while watch.unfinished and time.monotonic() - started < self.timeout:
                await asyncio.sleep(POLL_S)
                await watch.poll(store)
        if watch.unfinished:
            self.say(f"ours: {watch.unfinished} of {len(submitted)} orders did not finish in time")
        return watch.finals


async def submit(settings: dict[str, str], orders: Iterator[OrderSubmitted], rate: float) -> None:
    """Send orders to the orders queue as an application would: all at once (rate 0, in
    batches of SEND_BATCH) or one by one at ``rate`` per second. The pace starts once the
    link is open, so the first orders are not rushed out to catch up with its setup (as
    devstack.orders.send_orders, whose clock starts before the connection, does)."""
    queue = Settings.from_env(settings).queue("orders")
    async with ServiceBusClient.from_connection_string(settings["ServiceBusConnection"]) as client:
        async with client.get_queue_sender(queue) as sender:
            await sender.create_message_batch()  # opens the link
            if rate <= 0:
                while chunk := list(itertools.islice(orders, SEND_BATCH)):
                    await sender.send_messages([to_servicebus_message(o) for o in chunk])
                return
            async for order in paced(orders, rate):
                await sender.send_messages(to_servicebus_message(order))


async def paced(items: Iterator[T], rate: float) -> AsyncIterator[T]:
    """``items`` at ``rate`` per second, each taken from the iterator when its slot comes: an
    order is built then, so its ``submitted_at`` is when it is sent, not a slot earlier."""
    started = time.monotonic()
    for n in itertools.count():
        await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
        item = next(items, None)
        if item is None:
            return
        yield item


def invocations(workdir: Path) -> dict[str, int]:
    """Function invocations so far, per function, added up over the hosts' stats files."""
    total: dict[str, int] = {}
    for path in workdir.glob("host-*.stats.json"):
        try:
            functions = json.loads(path.read_text()).get("functions", {})
        except (OSError, ValueError):
            continue
        for name, stats in functions.items():
            total[name] = total.get(name, 0) + int(stats.get("invocations", 0))
    return total


def grouped_cpu(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds used between two readings: the hosts added up, then each other process."""
    used = {name: after[name] - before.get(name, 0.0) for name in after}
    hosts = sum(seconds for name, seconds in used.items() if name.startswith("host-"))
    others = {name: s for name, s in sorted(used.items()) if not name.startswith("host-")}
    return {"hosts": hosts, **others}


# ------------------------------------------------------------------------------ session


class Plan(BaseModel):
    orders: int
    paced_orders: int
    workflows: list[str]
    sides: list[Side]
    rounds: int
    rate: float
    paced: bool
    hosts: int
    warmup: int
    dbos_concurrency: int
    dbos_polling_s: float
    instance_memory_mb: int
    orders_per_month: float
    cpu_split: bool = False


def slots(plan: Plan) -> Iterator[tuple[int, str, Side]]:
    """(round, workflow, side) in run order: who goes first alternates from slot to slot."""
    n = 0
    for round_ in range(1, plan.rounds + 1):
        for workflow in plan.workflows:
            order = plan.sides if n % 2 == 0 else list(reversed(plan.sides))
            n += 1
            for side in order:
                yield round_, workflow, side


def paced_rate(plan: Plan, bursts: Sequence[RunResult], workflow: str) -> float:
    """``--rate``, or half the slower side's median burst throughput for ``workflow``."""
    if plan.rate > 0:
        return plan.rate
    medians = [
        statistics.median(runs)
        for side in plan.sides
        if (runs := [r.workflows_per_s for r in bursts if (r.side, r.workflow) == (side, workflow)])
    ]
    return round(max(1.0, min(medians) / 2), 1) if medians else 1.0


class Session:
    def __init__(
        self,
        plan: Plan,
        ours: OursSide | None,
        dbos: DbosSide | None,
        say: Callable[[str], None],
    ) -> None:
        self.plan = plan
        self.ours = ours
        self.dbos = dbos
        self.say = say

    async def run(self) -> list[RunResult]:
        results: list[RunResult] = []
        for round_, workflow, side in slots(self.plan):
            results.append(await self._one(side, workflow, self.plan.orders, 0.0, "burst", round_))
        if self.plan.paced:
            bursts = list(results)
            for round_, workflow, side in slots(self.plan):
                rate = paced_rate(self.plan, bursts, workflow)
                count = self.plan.paced_orders
                results.append(await self._one(side, workflow, count, rate, "paced", round_))
        return results

    async def _one(
        self, side: Side, workflow: str, count: int, rate: float, mode: Mode, round_: int
    ) -> RunResult:
        pace = f"at {rate:g}/s" if rate else "at once"
        self.say(f"round {round_}: {side}, {count} {workflow} workflows {pace}")
        if side == "dbos":
            assert self.dbos is not None
            if self.ours is not None:
                self.ours.stop()  # nothing of ours runs while DBOS does
            # DBOS runs as a process of its own (no PR_SET_PDEATHSIG): waited for off the loop.
            result = await asyncio.to_thread(self.dbos.run, workflow, count, rate, mode, round_)
        else:
            assert self.ours is not None
            result = await self.ours.run(workflow, count, rate, mode, round_)
        self.say(
            f"  {result.workflows_per_s} workflows/s, p50 {result.latency_s.p50} s, "
            f"p99 {result.latency_s.p99} s, {result.cpu_ms_engine} ms CPU per workflow"
        )
        return result


# ------------------------------------------------------------------------------ summary


def median_of(
    runs: Sequence[RunResult], value: Callable[[RunResult], float | None]
) -> float | None:
    values = [v for v in (value(r) for r in runs) if v is not None]
    return round(statistics.median(values), 3) if values else None


def runs_of(results: Sequence[RunResult], side: str, workflow: str, mode: str) -> list[RunResult]:
    return [r for r in results if (r.side, r.workflow, r.mode) == (side, workflow, mode)]


def side_summary(runs: Sequence[RunResult]) -> dict[str, Any]:
    names = list(dict.fromkeys(name for r in runs for name in r.cpu_ms))
    return {
        "runs": len(runs),
        "workflows_per_s": median_of(runs, lambda r: r.workflows_per_s),
        "latency_p50_s": median_of(runs, lambda r: r.latency_s.p50),
        "latency_p99_s": median_of(runs, lambda r: r.latency_s.p99),
        "submit_s": median_of(runs, lambda r: r.submit_s),
        "cpu_ms": {name: median_of(runs, lambda r, n=name: r.cpu_ms.get(n)) for name in names},
        "cpu_ms_engine": median_of(runs, lambda r: r.cpu_ms_engine),
        "failed": sum(r.failed for r in runs),
        "not_finished": sum(r.orders - r.finished for r in runs),
        **({"cpu_split_ms": split_summary(runs)} if any(r.cpu_split_ms for r in runs) else {}),
    }


def split_summary(runs: Sequence[RunResult]) -> dict[str, Any]:
    """Medians over the sampled runs: what deploys and what only the development stack spends,
    per workflow (the shared CPU divided between the two: benchmarks.cpu_split.Split), and the
    kinds within each part."""
    sampled = [r for r in runs if r.cpu_split_ms]

    def apportioned(run: RunResult) -> tuple[float, float]:
        split = cpu_split.Split()
        for part, kinds in run.cpu_split_ms.items():
            for kind, ms in kinds.items():
                split.add(part, kind, ms)
        return split.apportioned()

    def dev_only(run: RunResult) -> float:
        emulators = sum(ms for name, ms in run.cpu_ms.items() if name in ("azurite", "broker"))
        return apportioned(run)[1] + emulators

    kinds = {
        part: {
            kind: median_of(sampled, lambda r, p=part, k=kind: r.cpu_split_ms.get(p, {}).get(k))
            for kind in sorted({k for r in sampled for k in r.cpu_split_ms.get(part, {})})
        }
        for part in ("deploys", "dev_host", "shared")
    }
    return {
        "deploys": median_of(sampled, lambda r: apportioned(r)[0]),
        "dev_host": median_of(sampled, lambda r: apportioned(r)[1]),
        "dev_only": median_of(sampled, dev_only),
        "sampler": median_of(sampled, lambda r: r.sampler_cpu_ms),
        "kinds": kinds,
    }


RATIO_KEYS = ("workflows_per_s", "latency_p50_s", "latency_p99_s", "cpu_ms_engine")


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def summarize(results: Sequence[RunResult], plan: Plan) -> list[dict[str, Any]]:
    """Per mode and workflow: each side's medians over the rounds, and ours / DBOS."""
    rows = []
    for mode in ("burst", "paced"):
        for workflow in plan.workflows:
            sides = {
                side: side_summary(runs)
                for side in plan.sides
                if (runs := runs_of(results, side, workflow, mode))
            }
            if not sides:
                continue
            ours, dbos = sides.get("ours", {}), sides.get("dbos", {})
            rate = next(r.rate for r in results if (r.workflow, r.mode) == (workflow, mode))
            deploys = ours.get("cpu_split_ms", {}).get("deploys")
            rows.append(
                {
                    "workflow": workflow,
                    "mode": mode,
                    "rate": rate,
                    "sides": sides,
                    "ours_over_dbos": {
                        **{k: ratio(ours.get(k), dbos.get(k)) for k in RATIO_KEYS},
                        # Throughput at equal CPU: workflows per CPU-second, ours over DBOS's.
                        "per_cpu_engine": ratio(
                            dbos.get("cpu_ms_engine"), ours.get("cpu_ms_engine")
                        ),
                        "per_cpu_deploys": ratio(dbos.get("cpu_ms_engine"), deploys),
                    },
                }
            )
    return rows


def requests_per_order(runs: Sequence[RunResult]) -> dict[str, Any]:
    """Our runs' counts per order (medians over rounds): by kind, and totals per service."""
    kinds = sorted({kind for r in runs for kind in r.operations_per_order})
    by_kind = {
        kind: median_of(runs, lambda r, k=kind: r.operations_per_order.get(k, 0.0)) or 0.0
        for kind in kinds
    }

    def total(prefix: str) -> float:
        return round(sum(n for kind, n in by_kind.items() if kind.startswith(prefix)), 3)

    return {
        "table_requests": total("table."),
        "servicebus_sends": by_kind.get("servicebus.send", 0.0),
        "servicebus_operations": total("servicebus."),
        "blob_requests": total("blob."),
        "executions": median_of(runs, lambda r: r.executions_per_order) or 0.0,
        "by_kind": by_kind,
    }


def usage_of(runs: Sequence[RunResult], prices: cost.Prices, memory_mb: int) -> cost.OrderUsage:
    """What one order uses in Azure, from our burst runs: the counts above, plus the
    application's own send of the order (made outside the hosts), and billable instance time
    from the hosts' CPU (benchmarks.cost.instance_seconds_from_cpu)."""
    counted = requests_per_order(runs)
    host_ms = median_of(runs, lambda r: r.cpu_ms.get("hosts")) or 0.0
    return cost.OrderUsage(
        executions=counted["executions"],
        instance_seconds=cost.instance_seconds_from_cpu(host_ms / 1000, prices, memory_mb),
        servicebus_operations=counted["servicebus_operations"] + 1,
        table_transactions=counted["table_requests"],
        blob_operations=counted["blob_requests"],
        instance_memory_mb=memory_mb,
    )


def report(results: Sequence[RunResult], plan: Plan, dbos_version: str | None) -> dict[str, Any]:
    prices = cost.load_prices()
    ours = {
        workflow: runs
        for workflow in plan.workflows
        if (runs := runs_of(results, "ours", workflow, "burst"))
    }
    usages = {w: usage_of(runs, prices, plan.instance_memory_mb) for w, runs in ours.items()}
    return {
        "plan": plan.model_dump(),
        "dbos_version": dbos_version,
        "machine": {"cpus": os.cpu_count(), "load_1m_at_end": load_1m()},
        "summary": summarize(results, plan),
        "requests_per_order": {w: requests_per_order(runs) for w, runs in ours.items()},
        "usage_per_order": {w: u.model_dump() for w, u in usages.items()},
        "usd_per_million_orders": {
            w: cost.cost_per_million(u, prices, plan.orders_per_month).rounded()
            for w, u in usages.items()
        },
        "prices_as_of": prices.as_of.isoformat(),
        "runs": [r.model_dump() for r in results],
    }


# ------------------------------------------------------------------------------ tables


def _n(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def side_table(doc: Mapping[str, Any]) -> Table:
    table = Table(title="Side by side (medians over rounds; CPU ms per workflow)")
    for name in ("workflow", "run", "side", "wf/s", "p50 s", "p99 s", "submit s", "engine CPU ms"):
        table.add_column(name, justify="left" if name in ("workflow", "run", "side") else "right")
    table.add_column("CPU ms per process")
    for row in doc["summary"]:
        run = "burst" if row["mode"] == "burst" else f"paced {row['rate']:g}/s"
        for side, s in row["sides"].items():
            processes_ms = " · ".join(f"{n} {_n(ms, 1)}" for n, ms in s["cpu_ms"].items())
            table.add_row(
                row["workflow"], run, side, _n(s["workflows_per_s"], 1),
                _n(s["latency_p50_s"], 3), _n(s["latency_p99_s"], 3), _n(s["submit_s"], 1),
                _n(s["cpu_ms_engine"], 1), processes_ms,
            )  # fmt: skip
        r = row["ours_over_dbos"]
        if r["workflows_per_s"] is not None:
            table.add_row(
                row["workflow"], run, "[bold]ours/DBOS[/]", _n(r["workflows_per_s"]),
                _n(r["latency_p50_s"]), _n(r["latency_p99_s"]), "", _n(r["cpu_ms_engine"]), "",
            )  # fmt: skip
    return table


def split_table(doc: Mapping[str, Any]) -> Table | None:
    """Ours, sampled: CPU ms per workflow that deploys and that only the dev stack spends, and
    throughput at equal CPU (workflows per CPU-second, ours over DBOS's)."""
    rows = [r for r in doc["summary"] if "cpu_split_ms" in r["sides"].get("ours", {})]
    if not rows:
        return None
    table = Table(title="Ours: CPU ms per workflow, what deploys and what the dev stack adds")
    for name in ("workflow", "deploys", "dev only", "of it: host", "DBOS", "per CPU, engine",
                 "per CPU, deploys", "burst ratio", "deploys by kind"):  # fmt: skip
        table.add_column(
            name, justify="left" if name in ("workflow", "deploys by kind") else "right"
        )
    for row in rows:
        split = row["sides"]["ours"]["cpu_split_ms"]
        dbos = row["sides"].get("dbos", {}).get("cpu_ms_engine")
        r = row["ours_over_dbos"]
        kinds = sorted(split["kinds"]["deploys"].items(), key=lambda kv: -(kv[1] or 0))
        table.add_row(
            row["workflow"], _n(split["deploys"]), _n(split["dev_only"]), _n(split["dev_host"]),
            _n(dbos), _n(r["per_cpu_engine"]), _n(r["per_cpu_deploys"]), _n(r["workflows_per_s"]),
            " · ".join(f"{k} {_n(ms, 1)}" for k, ms in kinds[:8]),
        )  # fmt: skip
    return table


def requests_table(doc: Mapping[str, Any]) -> Table:
    table = Table(title="Ours: requests per order, counted at the SDK (burst runs)")
    for name in (
        "workflow",
        "Table requests",
        "by kind",
        "SB sends",
        "SB operations",
        "executions",
    ):
        table.add_column(name, justify="left" if name in ("workflow", "by kind") else "right")
    for workflow, c in doc["requests_per_order"].items():
        kinds = " · ".join(
            f"{kind.split('.', 1)[1]} {n:g}"
            for kind, n in c["by_kind"].items()
            if kind.startswith("table.")
        )
        table.add_row(
            workflow, _n(c["table_requests"]), kinds, _n(c["servicebus_sends"]),
            _n(c["servicebus_operations"]), _n(c["executions"]),
        )  # fmt: skip
    return table


def cost_table(doc: Mapping[str, Any]) -> Table:
    month = doc["plan"]["orders_per_month"]
    table = Table(
        title=f"Azure USD per million orders at {month:,.0f} orders a month "
        f"(prices of {doc['prices_as_of']}, benchmarks/azure_prices.json)"
    )
    table.add_column("workflow")
    lines = next(iter(doc["usd_per_million_orders"].values()), {})
    for line in lines:
        table.add_column(line.replace("_", " "), justify="right")
    for workflow, bill in doc["usd_per_million_orders"].items():
        table.add_row(workflow, *(_n(usd) for usd in bill.values()))
    return table


def show(doc: Mapping[str, Any], console: Console) -> None:
    console.print(side_table(doc))
    if (split := split_table(doc)) is not None:
        console.print(split)
    if doc["requests_per_order"]:
        console.print(requests_table(doc))
        console.print(cost_table(doc))
    console.print(
        f"DBOS {doc['dbos_version'] or '-'}; load average (1 min) at the end "
        f"{doc['machine']['load_1m_at_end']} on {doc['machine']['cpus']} CPUs"
    )


# ------------------------------------------------------------------------------ CLI

app = typer.Typer(add_completion=False, rich_markup_mode=None)


@app.command(help=__doc__)
def main(
    orders: Annotated[int, typer.Option(min=1, help="Workflows per burst run.")] = 1000,
    workflow: Annotated[
        list[str] | None, typer.Option(help="single_step, order (repeat; default both).")
    ] = None,
    side: Annotated[
        list[str] | None, typer.Option(help="dbos, ours (repeat; default both).")
    ] = None,
    rounds: Annotated[int, typer.Option(min=1, help="Times each pass is repeated.")] = 1,
    rate: Annotated[
        float, typer.Option(min=0, help="Paced runs' submissions/s; 0: half the slower burst.")
    ] = 0.0,
    paced: Annotated[bool, typer.Option(help="Also run the paced pass.")] = True,
    paced_orders: Annotated[
        int | None, typer.Option(min=1, help="Workflows per paced run (default min(300, orders)).")
    ] = None,
    hosts: Annotated[int, typer.Option(min=1, help="Our function hosts.")] = 2,
    warmup: Annotated[int, typer.Option(min=0, help="Unmeasured workflows before each run.")] = 20,
    dbos_concurrency: Annotated[
        int, typer.Option(min=1, help="DBOS queue worker concurrency.")
    ] = 32,
    dbos_polling: Annotated[
        float, typer.Option(min=0.001, help="DBOS queue polling interval, s.")
    ] = 0.05,
    dbos_venv: Annotated[Path, typer.Option(help="DBOS's own environment.")] = DBOS_VENV,
    memory_mb: Annotated[int, typer.Option(help="Flex Consumption instance memory.")] = 2048,
    orders_per_month: Annotated[
        float, typer.Option(min=1, help="Monthly volume the cost per million is priced at.")
    ] = 10_000_000,
    timeout: Annotated[float, typer.Option(help="Seconds a run of ours may take.")] = 1800.0,
    workdir: Annotated[Path | None, typer.Option(help="Logs and the stack's files.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    cpu_split: Annotated[
        bool,
        typer.Option(
            help="Sample our hosts with py-spy in burst runs: CPU that deploys vs the dev stack's."
        ),
    ] = False,
    save: Annotated[
        Path | None, typer.Option(help="Also write the JSON document to this file.")
    ] = None,
) -> None:
    workflows = _choose(workflow, WORKFLOWS, "workflow")
    sides = _choose(side, SIDES, "side")
    plan = Plan(
        orders=orders,
        paced_orders=paced_orders or min(300, orders),
        workflows=workflows,
        sides=sides,
        rounds=rounds,
        rate=rate,
        paced=paced,
        hosts=hosts,
        warmup=warmup,
        dbos_concurrency=dbos_concurrency,
        dbos_polling_s=dbos_polling,
        instance_memory_mb=memory_mb,
        orders_per_month=orders_per_month,
        cpu_split=cpu_split,
    )
    # Wide enough for the tables when stdout is a file or a pipe (rich assumes 80 columns).
    console = Console(stderr=json_out, width=None if sys.stdout.isatty() else 180)
    err = Console(stderr=True)

    def say(line: str) -> None:
        err.print(f"[dim]…[/] {line}", highlight=False)

    workdir = workdir or Path(tempfile.mkdtemp(prefix="peers-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results, version = asyncio.run(run_session(plan, workdir, dbos_venv, say, timeout))
    doc = report(results, plan, version)
    if save is not None:
        save.write_text(json.dumps(doc, indent=2) + "\n")
    if json_out:
        print(json.dumps(doc, indent=2))
    else:
        show(doc, console)
    if any(r.finished < r.orders or r.failed for r in results):
        raise typer.Exit(1)


async def run_session(
    plan: Plan, workdir: Path, venv: Path, say: Callable[[str], None], timeout: float
) -> tuple[list[RunResult], str | None]:
    version: str | None = None
    dbos: DbosSide | None = None
    ours: OursSide | None = None
    try:
        if "dbos" in plan.sides:
            python, version = await asyncio.to_thread(dbos_python, venv, say)
            dbos = DbosSide(
                python,
                workdir,
                concurrency=plan.dbos_concurrency,
                polling=plan.dbos_polling_s,
                warmup=plan.warmup,
            )
            dbos.start()
        if "ours" in plan.sides:
            ours = OursSide(
                workdir,
                hosts=plan.hosts,
                warmup=plan.warmup,
                timeout=timeout,
                say=say,
                split=plan.cpu_split,
            )
        return await Session(plan, ours, dbos, say).run(), version
    finally:
        if ours is not None:
            ours.stop()
        if dbos is not None:
            dbos.stop()


def _choose(given: list[str] | None, known: Sequence[str], what: str) -> list[Any]:
    chosen = list(dict.fromkeys(given or known))
    unknown = [name for name in chosen if name not in known]
    if unknown:
        raise typer.BadParameter(f"unknown {what} {unknown}; choose from {list(known)}")
    return chosen


if __name__ == "__main__":
    app()
