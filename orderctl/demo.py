"""`orderctl demo`: orders through the whole pattern under a fault profile, watched live.

It uses a running stack (`orderctl up`) or starts its own. Progress comes from the state store
the way an operator would see it: the active-order index says what is in flight, and an order
that has left it is read once for its final state. The summary is computed from what the watch
already read (each order's final state: outcomes, latencies, compensations), one query for the
retries and Supervisor entries of this run's timelines (:func:`devstack.observe.timeline_tally`),
one peek through the alert queue, one read of the fake services' ledger and the hosts' operation
counters: never a request per order, so it appears seconds after the last order finished (it
reports how many: ``summary_delay_s``). Nothing is estimated.

**The fault profile.** A stack the demo starts runs the profile asked for (chaotic by
default). On a running stack the demo never changes it behind the user's back: without
``--profile`` it runs under the profile in force and says which; with one, it says loudly what
it sets and what it was, and sets the previous one back when it ends. The operator scene at
the end (the services recover, an Error order is resubmitted) sets the clean profile the same
way, announced, and restored afterwards.

**Showing it.** A live table while orders flow, with a progress bar and an ETA on long runs
(``LONG_RUN`` orders or more); then, once the live view has ended, the summary as a table of
its own. Stored data is printed as text, never as markup.

What the summary checks, from the fakes' ledger (one snapshot, :mod:`devstack.observe`):
duplicated effects (a key that took effect twice), undos without a do (an undo that reversed
nothing at its service), and effects left after compensation (a forward effect of an Error order
that no undo names: expected only of an order whose compensation is incomplete, which its record
and a critical alert say). From the alerts queue: whether every Error order has exactly one
terminal alert (:data:`domain.order.TERMINAL_ALERT_REASONS`) and no other order has one.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as ProgressBar
from rich.table import Table
from rich.text import Text

from adapters.settings import Settings
from adapters.store.records import OrderRecords
from devstack.observe import (
    FinishWatch,
    Ledger,
    TimelineTally,
    any_active,
    duplicated_effects,
    effects_left_in_place,
    host_invocations,
    host_operations,
    host_operations_after,
    peek_all,
    process_cpu,
    read_ledger,
    timeline_tally,
    undo_without_do,
)
from devstack.orders import open_orders_table, open_store, send_orders
from devstack.stack.local_stack import LocalStack, StackInfo
from domain.messages import OrderSubmitted, utc_now
from domain.order import TERMINAL_ALERT_REASONS, Order, StepState
from domain.states import ProcessState
from orderctl.plain_text import join_url, printable

QUICK_SETTINGS = {
    "STEP_TIMEOUT_SECONDS": "8",
    "SUPERVISOR_SCHEDULE": "*/2 * * * * *",
    "PENDING_STALE_AFTER_SECONDS": "10",
    "RETRY_BASE_DELAY_SECONDS": "1",
    "RETRY_MAX_DELAY_SECONDS": "4",
}
READS_PER_POLL = 60
SETTLE_SECONDS = 30.0
"""How long the summary waits for finished orders to send what they owe (their alerts)."""
EXAMPLES = 5
LONG_RUN = 100
"""Runs of this many orders or more show a progress bar with an ETA."""
DEFAULT_PROFILE = "chaotic"
"""The profile of a stack the demo starts itself, unless told otherwise."""
UNDONE = (StepState.COMPENSATED, StepState.VOIDED)
RETRY_FUNCTION = "scheduler_commands"  # every retry, by the Supervisor or after a failed reply


@dataclass
class Summary:
    orders: int
    profile: str
    workflow: str
    hosts: int
    processed: int = 0
    errors: int = 0
    not_finished: int = 0
    errors_with_one_terminal_alert: int = 0
    """Error orders with exactly one terminal alert on the alerts queue."""
    wrong_terminal_alerts: int = 0
    """Orders whose terminal alerts are wrong: an Error order with none or several, or any
    other order with one."""
    alerts: int = 0
    """Orders of this run named by an alert (any reason)."""
    recovered_by_supervisor: int = 0
    retries: int = 0
    duplicated_effects: int = 0
    undo_without_do: int = 0
    """Undo effects whose forward call never took effect at that service."""
    effects_left_after_compensation: int = 0
    """Forward effects of Error orders that no undo names."""
    effects_left_by_incomplete_compensation: int = 0
    """Of those, the ones of orders whose record says their compensation is incomplete (a step
    that may have taken effect is not undone; a critical alert asked an operator to act)."""
    examples: dict[str, list] = field(default_factory=dict)
    """A few cases of each problem found, to look into."""
    elapsed_s: float = 0.0
    orders_per_s: float = 0.0
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    operations_per_order: dict[str, float] = field(default_factory=dict)
    compensated: int = 0
    """Error orders that undid (or voided) at least one step."""
    resubmitted: dict[str, str] = field(default_factory=dict)
    """An Error order the demo's operator resubmitted once the services recovered."""
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    """CPU each stack process used during the run: shows what bounds the throughput."""
    summary_delay_s: float | None = None
    """Seconds from the last order's final write to this summary being printed."""

    @property
    def all_terminal(self) -> bool:
        return self.not_finished == 0

    @property
    def one_terminal_alert_per_error(self) -> bool:
        return (
            self.wrong_terminal_alerts == 0 and self.errors_with_one_terminal_alert == self.errors
        )

    def to_json(self) -> str:
        derived = {
            "all_terminal": self.all_terminal,
            "one_terminal_alert_per_error": self.one_terminal_alert_per_error,
        }
        return json.dumps(asdict(self) | derived, indent=2, default=str) + "\n"


@dataclass(frozen=True)
class Observed:
    """What the summary reads besides the orders' final states, each in one pass."""

    alerts: list[dict]
    ledger: Ledger
    timelines: TimelineTally
    operations: dict[str, int]


async def alerts_naming(settings: dict[str, str], order_ids: Iterable[str]) -> list[dict]:
    """The alerts waiting on the alerts queue that name one of ``order_ids``, peeked (nothing
    is taken) like :func:`devstack.observe.alerted_orders`."""
    ours = set(order_ids)
    found = []
    async for body in peek_all(settings, Settings.from_env(settings).queue("alerts")):
        try:
            alert = json.loads(body)
        except ValueError:
            continue
        if isinstance(alert, dict) and alert.get("order_id") in ours:
            found.append(alert)
    return found


def terminal_alerts(alerts: Iterable[dict]) -> Counter[str]:
    """Per order, its terminal alerts (reasons in TERMINAL_ALERT_REASONS: one per entry into
    Error)."""
    return Counter(a["order_id"] for a in alerts if a.get("reason") in TERMINAL_ALERT_REASONS)


class Demo:
    def __init__(
        self,
        *,
        orders: int,
        profile: str | None,
        workflow: str,
        hosts: int,
        concurrency: int | None,
        timeout: float,
        quick: bool,
        workdir: Path,
        rate: float = 0.0,
        console: Console,
        telemetry: Path | None = None,
    ) -> None:
        """``telemetry``: a stack the demo starts writes spans and metrics there
        (`orderctl trace`); a running stack keeps its own setting."""
        self.count = orders
        self.telemetry = telemetry
        self.asked_profile = profile
        self.profile = profile or DEFAULT_PROFILE
        self._restore: dict | None = None
        """The running stack's faults before the demo changed them, to set back at the end."""
        self._own_stack = False
        self.workflow = workflow
        self.hosts = hosts
        self.concurrency = concurrency
        self.timeout = timeout
        self.quick = quick
        self.rate = rate
        self.workdir = workdir
        self.console = console
        self.id_prefix = f"demo-{uuid.uuid4().hex[:6]}-"
        """Every order of this run has an id starting with this (one range in the store)."""

    async def run(self) -> Summary:
        info = StackInfo.load(self.workdir)
        own: LocalStack | None = None
        if info is None:
            own = LocalStack(
                self.workdir,
                hosts=self.hosts,
                concurrency=self.concurrency,
                profile=self.profile,
                overrides=QUICK_SETTINGS if self.quick else {},
                telemetry=self.telemetry,
            )
            info = await own.start(progress=lambda step: self.say(f"… {step}", "dim"))
            if self.telemetry is not None:
                self.say(f"telemetry: spans and metrics in {own.telemetry}", "dim")
            self._own_stack = True
        else:
            self.say(f"using the running stack in {self.workdir}")
            if self.telemetry is not None and not info.settings.get("TELEMETRY_DIR"):
                self.say(
                    "telemetry stays off: the running stack was started without it "
                    "(`orderctl down`, then `orderctl up --telemetry`)",
                    "yellow",
                )
            await self._choose_profile(info)
        if info.api_url:
            self.say(f"watch it live: {join_url(info.api_url, 'dashboard')}", "bold")
        try:
            return await self._run(info)
        finally:
            if own is not None:
                self.say("… stopping the stack this demo started", "dim")
                own.stop()
            elif self._restore is not None:
                await self._set_faults(info, self._restore)
                self.say(f"fault profile set back to {self._restore['source']}", "bold yellow")

    def say(self, line: str, style: str = "") -> None:
        """A line for people: never read as markup."""
        self.console.print(Text(printable(line), style=style))

    async def _choose_profile(self, info: StackInfo) -> None:
        """Run under the running stack's profile, or change it loudly (and remember it)."""
        now = await self._faults(info)
        if self.asked_profile is None:
            self.profile = now["source"]
            self.say(f"fault profile: {now['source']}, the running stack's own (unchanged)")
            return
        from devstack.fakes.profiles import source_name
        from devstack.stack.local_stack import profile_path

        path = profile_path(self.asked_profile)
        self.profile = source_name(path)
        self.say(
            f"setting the running stack's fault profile to {self.profile} for this demo "
            f"(it is {now['source']} now; set back when the demo ends)",
            "bold yellow",
        )
        self._restore = {"profile": now["profile"], "source": now["source"]}
        change = {"profile": json.loads(path.read_text()), "source": self.profile}
        await self._set_faults(info, change)

    async def _faults(self, info: StackInfo) -> dict:
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.get(join_url(info.fakes_url, "_fault"))
        answer.raise_for_status()
        return answer.json()

    async def _set_faults(self, info: StackInfo, change: dict) -> None:
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.post(join_url(info.fakes_url, "_fault"), json=change)
        answer.raise_for_status()

    async def _run(self, info: StackInfo) -> Summary:
        orders = [
            OrderSubmitted(
                order_id=f"{self.id_prefix}{n:05d}",
                customer_id=f"customer-{n % 97}",
                items=[{"sku": f"SKU-{n % 13}", "quantity": 1 + n % 3, "unit_price_cents": 999}],
                currency="EUR",
                workflow=self.workflow,
            )
            for n in range(self.count)
        ]
        ops_before = host_operations(self.workdir)
        cpu_before = process_cpu(info.pids)
        started = time.monotonic()
        pace = f"at {self.rate:g}/s" if self.rate > 0 else "at once"
        self.say(
            f"submitting {self.count} orders {pace} ({self.workflow} workflow, "
            f"profile {self.profile})"
        )
        async with open_store(info.settings) as store:
            sender = asyncio.create_task(send_orders(info.settings, orders, rate=self.rate))
            try:
                finals = await self._watch(store, [o.order_id for o in orders], started)
                await sender  # a send that failed fails the demo, once the watch has ended
            finally:
                sender.cancel()  # done by now, unless the watch failed: then stop sending
            summary = await self._summarize(info, store, orders, finals, ops_before)
        cpu_after = process_cpu(info.pids)
        summary.cpu_seconds = {
            name: round(cpu_after[name] - cpu_before.get(name, 0.0), 2) for name in cpu_after
        }
        summary.elapsed_s = round(time.monotonic() - started, 2)
        if finals:
            first = min(p.created_at for p in finals.values())
            last = max(p.updated_at for p in finals.values())
            span = (last - first).total_seconds()
            summary.orders_per_s = round(len(finals) / span, 1) if span > 0 else 0.0
            summary.summary_delay_s = round((utc_now() - last).total_seconds(), 2)
        self._show(summary)
        errors = sorted(o for o, p in finals.items() if p.state is ProcessState.ERROR)
        if errors:
            summary.resubmitted = await self._operator_resubmits(info, errors[0])
        return summary

    async def _operator_resubmits(self, info: StackInfo, order_id: str) -> dict[str, str]:
        """Play the operator: the services recover, an Error order is resubmitted, and done."""
        from orderctl.local import LocalOperations
        from service.runtime import Runtime

        self.console.print()
        if self._restore is None and not self._own_stack:
            before = await self._faults(info)
            self._restore = {"profile": before["profile"], "source": before["source"]}
        self.console.print(
            Text.assemble(
                ("operator: ", "bold"),
                "the remote services recover (fault profile set to clean",
                " until the demo ends)" if self._restore is not None else ")",
                f"; resubmitting {printable(order_id)}",
            )
        )
        await self._set_faults(info, {"profile": {}, "source": "clean"})
        runtime = Runtime.from_settings(Settings.from_env(info.settings), OrderRecords)
        ops = LocalOperations(runtime)
        try:
            done = await ops.resubmit(
                order_id, operator="demo-operator", reason="services recovered"
            )
            deadline = time.monotonic() + 120
            process = await runtime.store.load(order_id)
            while not process.state.terminal and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                process = await runtime.store.load(order_id)
            events = [e.event for e in await runtime.store.get_timeline(order_id)]
        finally:
            await ops.close()
            await runtime.close()
        self.console.print(
            Text.assemble(
                printable(f"{order_id}: {done.outcome}, now "),
                (printable(process.state), "bold"),
                printable("; timeline: " + " → ".join(events)),
            )
        )
        return {"order_id": order_id, "outcome": done.outcome, "final_state": process.state}

    async def _watch(
        self, store: OrderRecords, order_ids: list[str], started: float
    ) -> dict[str, Order]:
        watch = FinishWatch(order_ids, READS_PER_POLL)
        retries_before = host_invocations(self.workdir, RETRY_FUNCTION)
        view = Progress(self.count, bar=self.count >= LONG_RUN)
        with Live(view.render(), console=self.console, refresh_per_second=4) as live:
            while watch.unfinished and time.monotonic() - started < self.timeout:
                for order in await watch.poll(store):
                    view.states[order.state] += 1
                view.waiting = watch.unfinished - watch.in_flight
                view.in_flight = watch.in_flight
                view.retries = host_invocations(self.workdir, RETRY_FUNCTION) - retries_before
                view.elapsed = time.monotonic() - started
                live.update(view.render())
                await asyncio.sleep(0.5)
        self.console.print()  # the live view has ended: what follows starts on a line of its own
        return watch.finals

    async def _summarize(
        self,
        info: StackInfo,
        store: OrderRecords,
        orders: list[OrderSubmitted],
        finals: dict[str, Order],
        ops_before: dict[str, int],
    ) -> Summary:
        summary = Summary(
            orders=self.count, profile=self.profile, workflow=self.workflow, hosts=self.hosts
        )
        ours = {o.order_id for o in orders}
        states = Counter(p.state for p in finals.values())
        summary.processed = states[ProcessState.PROCESSED]
        summary.errors = states[ProcessState.ERROR]
        error_ids = {o for o, p in finals.items() if p.state is ProcessState.ERROR}
        # Every Error order has a compensation cause, even with nothing to undo: count the
        # ones that did undo (or void) a step.
        summary.compensated = sum(
            1 for o in error_ids if any(s.state in UNDONE for s in finals[o].steps)
        )
        summary.not_finished = self.count - len(finals)
        latencies = sorted(
            (p.updated_at - p.created_at).total_seconds()
            for p in finals.values()
            if p.state is ProcessState.PROCESSED
        )
        if latencies:
            summary.latency_p50_s = round(statistics.median(latencies), 3)
            summary.latency_p99_s = round(
                latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 3
            )
        seen = await self._observe(info, store, finals, ours)
        summary.retries = seen.timelines.retries
        summary.recovered_by_supervisor = len(seen.timelines.recovered_by_supervisor)
        self._check_alerts(summary, seen.alerts, finals, ours)
        self._check_ledger(summary, seen.ledger, finals, ours, error_ids)
        ops_after = seen.operations
        summary.operations_per_order = {
            kind: round((ops_after.get(kind, 0) - ops_before.get(kind, 0)) / self.count, 2)
            for kind in sorted(ops_after)
            if ops_after.get(kind, 0) != ops_before.get(kind, 0)
        }
        return summary

    async def _observe(
        self, info: StackInfo, store: OrderRecords, finals: dict[str, Order], ours: set[str]
    ) -> Observed:
        """Once the finished orders have sent what they owe, everything the summary needs
        beyond their final states, each in one pass, read concurrently (each mostly waits:
        a Service Bus link, an HTTP answer, a query, the hosts' next stats write)."""
        settled_at = await self._settle(store, set(finals))
        alerts, ledger, timelines, operations = await asyncio.gather(
            alerts_naming(info.settings, ours),
            read_ledger(info.fakes_url),
            self._timelines(info, set(finals)),
            host_operations_after(self.workdir, settled_at),
        )
        return Observed(alerts, ledger, timelines, operations)

    async def _timelines(self, info: StackInfo, finished: set[str]) -> TimelineTally:
        async with open_orders_table(info.settings) as table:
            return await timeline_tally(table, self.id_prefix, finished)

    async def _settle(self, store: OrderRecords, finished: set[str]) -> float:
        """Wait (a little) until the finished orders have sent what they owe: a finished order
        leaves the active-order index only after its outbox (its alert) was sent. Returns when
        they had (or the wait ended), as a time.time()."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline and await any_active(store, finished):
            await asyncio.sleep(0.2)
        return time.time()

    def _check_alerts(
        self, summary: Summary, alerts: list[dict], finals: dict[str, Order], ours: set[str]
    ) -> None:
        summary.alerts = len({a["order_id"] for a in alerts})
        terminal = terminal_alerts(alerts)
        wrong = []
        for order_id in sorted(ours):
            order = finals.get(order_id)
            in_error = order is not None and order.state is ProcessState.ERROR
            if in_error and terminal[order_id] == 1:
                summary.errors_with_one_terminal_alert += 1
            elif in_error or terminal[order_id]:
                wrong.append(f"{order_id}: {terminal[order_id]} terminal alerts")
        summary.wrong_terminal_alerts = len(wrong)
        if wrong:
            summary.examples["wrong_terminal_alerts"] = wrong[:EXAMPLES]

    def _check_ledger(
        self,
        summary: Summary,
        ledger: Ledger,
        finals: dict[str, Order],
        ours: set[str],
        error_ids: set[str],
    ) -> None:
        summary.duplicated_effects = duplicated_effects(ledger, ours)
        orphans = undo_without_do(ledger, ours)
        summary.undo_without_do = len(orphans)
        left = effects_left_in_place(ledger, error_ids)
        incomplete = {o for o in error_ids if any(s.state.may_have_effect for s in finals[o].steps)}
        summary.effects_left_after_compensation = len(left)
        summary.effects_left_by_incomplete_compensation = sum(
            1 for _, order_id, _ in left if order_id in incomplete
        )
        if orphans:
            summary.examples["undo_without_do"] = [
                f"{service}: undo of {key}" for service, key in orphans[:EXAMPLES]
            ]
        unexplained = [(svc, o, key) for svc, o, key in left if o not in incomplete]
        if unexplained:
            summary.examples["effects_left_after_compensation"] = [
                f"{service}: {key}" for service, _, key in unexplained[:EXAMPLES]
            ]

    def _show(self, s: Summary) -> None:
        table = Table(show_header=False, title="summary", title_justify="left", title_style="bold")
        table.add_column("measure")
        table.add_column("value", justify="right")
        alerted = (
            Text("yes")
            if s.one_terminal_alert_per_error
            else Text.assemble(("no", "red"), f" ({s.wrong_terminal_alerts} wrong)")
        )
        left = str(s.effects_left_after_compensation)
        if s.effects_left_by_incomplete_compensation:
            left += f" ({s.effects_left_by_incomplete_compensation} by incomplete compensations)"
        rows: list[tuple[str, str | Text]] = [
            ("processed", Text.assemble((str(s.processed), "green"), f" of {s.orders}")),
            ("errors", str(s.errors)),
            ("… of which compensated", str(s.compensated)),
            ("one terminal alert per Error", alerted),
            ("not finished", f"{s.not_finished}"),
            ("recovered by the Supervisor", str(s.recovered_by_supervisor)),
            ("retries", str(s.retries)),
            ("duplicated remote effects", str(s.duplicated_effects)),
            ("undo without a do", str(s.undo_without_do)),
            ("effects left after compensation", left),
            ("orders/s", str(s.orders_per_s)),
            ("latency p50 / p99 (s)", f"{s.latency_p50_s} / {s.latency_p99_s}"),
            ("summary after the last order (s)", str(s.summary_delay_s)),
        ]
        rows += [(f"{kind} per order", str(n)) for kind, n in s.operations_per_order.items()]
        rows += [(f"CPU s, {name}", str(n)) for name, n in s.cpu_seconds.items()]
        for name, value in rows:
            table.add_row(name, value if isinstance(value, Text) else Text(value))
        self.console.print(table)
        for problem, cases in s.examples.items():
            self.console.print(
                Text.assemble((f"{problem}: ", "yellow"), printable("; ".join(cases)))
            )


@dataclass
class Progress:
    """What the live view shows while orders flow: the counts, and on long runs (``bar``) a
    progress bar of finished orders with the time left at the current pace."""

    orders: int
    bar: bool = False
    waiting: int = 0
    in_flight: int = 0
    retries: int = 0
    elapsed: float = 0.0
    states: Counter = field(default_factory=Counter)
    _bar: ProgressBar | None = None
    _task: int = 0

    def render(self) -> Table | Group:
        if not self.bar:
            return self.table()
        if self._bar is None:
            self._bar = ProgressBar(
                TextColumn("finished"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                TextColumn("left"),
                TimeRemainingColumn(),
                auto_refresh=False,
            )
            self._task = self._bar.add_task("finished", total=self.orders)
        self._bar.update(self._task, completed=sum(self.states.values()))  # type: ignore[arg-type]
        return Group(self._bar.get_renderable(), self.table())

    def table(self) -> Table:
        done = sum(self.states.values())
        table = Table(title=f"{self.orders} orders, {self.elapsed:.0f}s")
        columns = ("not started", "in flight", "Processed", "Error", "retries", "orders/s")
        for column in columns:
            table.add_column(column, justify="right")
        table.add_row(
            str(max(self.waiting, 0)),
            str(self.in_flight),
            Text(str(self.states[ProcessState.PROCESSED]), style="green"),
            Text(str(self.states[ProcessState.ERROR]), style="red"),
            Text(str(self.retries), style="yellow"),
            f"{done / self.elapsed:.1f}" if self.elapsed > 0 else "-",
        )
        return table
