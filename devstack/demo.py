"""`orderctl demo`: orders through the whole pattern under a fault profile, watched live.

It uses a running stack (`orderctl up`) or starts its own. Progress comes from the state store
the way an operator would see it: the active-order index says what is in flight, and an order
that has left it is read once for its final state. The summary is computed from the store, the
alert queue, the fake services' ledger and the hosts' operation counters; nothing is estimated.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from rich.console import Console
from rich.live import Live
from rich.table import Table

from core.messages import OrderSubmitted
from core.settings import Settings
from core.state_models import ProcessRecord
from core.states import ProcessState
from devstack.observe import (
    alerted_orders,
    all_active,
    duplicated_effects,
    host_invocations,
    host_operations,
    process_cpu,
)
from devstack.orders import open_store, send_orders
from devstack.stack.local_stack import LocalStack, StackInfo

QUICK_SETTINGS = {
    "STEP_TIMEOUT_SECONDS": "8",
    "SUPERVISOR_SCHEDULE": "*/2 * * * * *",
    "PENDING_STALE_AFTER_SECONDS": "10",
    "RETRY_BASE_DELAY_SECONDS": "1",
    "RETRY_MAX_DELAY_SECONDS": "4",
}
READS_PER_POLL = 60
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
    errors_with_alert: int = 0
    alerts: int = 0
    recovered_by_supervisor: int = 0
    retries: int = 0
    duplicated_effects: int = 0
    elapsed_s: float = 0.0
    orders_per_s: float = 0.0
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    operations_per_order: dict[str, float] = field(default_factory=dict)
    compensated: int = 0
    resubmitted: dict[str, str] = field(default_factory=dict)
    """An Error order the demo's operator resubmitted once the services recovered."""
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    """CPU each stack process used during the run: shows what bounds the throughput."""

    @property
    def all_terminal(self) -> bool:
        return self.not_finished == 0

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"all_terminal": self.all_terminal}, indent=2) + "\n"


class Demo:
    def __init__(
        self,
        *,
        orders: int,
        profile: str,
        workflow: str,
        hosts: int,
        concurrency: int | None,
        timeout: float,
        quick: bool,
        workdir: Path,
        rate: float = 0.0,
        console: Console,
    ) -> None:
        self.count = orders
        self.profile = profile
        self.workflow = workflow
        self.hosts = hosts
        self.concurrency = concurrency
        self.timeout = timeout
        self.quick = quick
        self.rate = rate
        self.workdir = workdir
        self.console = console

    def run(self) -> Summary:
        info = StackInfo.load(self.workdir)
        own: LocalStack | None = None
        if info is None:
            own = LocalStack(
                self.workdir,
                hosts=self.hosts,
                concurrency=self.concurrency,
                profile=self.profile,
                overrides=QUICK_SETTINGS if self.quick else {},
            )
            info = own.start(progress=lambda step: self.console.print(f"[dim]…[/] {step}"))
        else:
            self.console.print(f"using the running stack in {self.workdir}")
            self._set_profile(info)
        try:
            return self._run(info)
        finally:
            if own is not None:
                self.console.print("[dim]… stopping the stack this demo started[/]")
                own.stop()

    def _set_profile(self, info: StackInfo) -> None:
        from devstack.stack.local_stack import profile_path

        profile = json.loads(profile_path(self.profile).read_text())
        httpx.post(f"{info.fakes_url}/_profile", json=profile, timeout=10).raise_for_status()

    def _run(self, info: StackInfo) -> Summary:
        run = uuid.uuid4().hex[:6]
        orders = [
            OrderSubmitted(
                order_id=f"demo-{run}-{n:05d}",
                customer_id=f"customer-{n % 97}",
                items=[{"sku": f"SKU-{n % 13}", "quantity": 1 + n % 3, "unit_price_cents": 999}],
                currency="EUR",
                workflow=self.workflow,
            )
            for n in range(self.count)
        ]
        ops_before = host_operations(self.workdir)
        cpu_before = process_cpu(info.pids)
        store = open_store(info.settings)
        started = time.monotonic()
        pace = f"at {self.rate:g}/s" if self.rate > 0 else "at once"
        self.console.print(
            f"submitting {self.count} orders {pace} ({self.workflow} workflow, "
            f"profile {self.profile})"
        )
        sender = threading.Thread(
            target=send_orders, args=(info.settings, orders), kwargs={"rate": self.rate}
        )
        sender.start()
        finals = self._watch(store, [o.order_id for o in orders], started)
        sender.join()
        summary = self._summarize(info, store, orders, finals, ops_before)
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
        store.close()
        self._show(summary)
        errors = sorted(o for o, p in finals.items() if p.state is ProcessState.ERROR)
        if errors:
            summary.resubmitted = self._operator_resubmits(info, errors[0])
        return summary

    def _operator_resubmits(self, info: StackInfo, order_id: str) -> dict[str, str]:
        """Play the operator: the services recover, an Error order is resubmitted, and done."""
        from core.runtime import Runtime
        from operator_api.operations import Operations

        self.console.print(
            f"\n[bold]operator:[/] the remote services have recovered; resubmitting {order_id}"
        )
        httpx.post(f"{info.fakes_url}/_profile", json={}, timeout=10).raise_for_status()
        runtime = Runtime.from_settings(Settings.from_env(info.settings))
        ops = Operations(runtime)
        try:
            done = ops.resubmit(order_id, operator="demo-operator", reason="services recovered")
            deadline = time.monotonic() + 120
            process = runtime.store.get_process(order_id)
            while not process.state.terminal and time.monotonic() < deadline:
                time.sleep(0.5)
                process = runtime.store.get_process(order_id)
            events = [e.event for e in runtime.store.get_timeline(order_id)]
        finally:
            ops.close()
            runtime.close()
        self.console.print(
            f"{order_id}: {done.outcome}, now [bold]{process.state}[/]; timeline: "
            + " → ".join(events)
        )
        return {"order_id": order_id, "outcome": done.outcome, "final_state": process.state}

    def _watch(self, store, order_ids: list[str], started: float) -> dict[str, ProcessRecord]:
        finals: dict[str, ProcessRecord] = {}
        unseen = list(order_ids)
        ours = set(order_ids)
        retries_before = host_invocations(self.workdir, RETRY_FUNCTION)
        view = Progress(self.count)
        with Live(view.table(), console=self.console, refresh_per_second=4) as live:
            while unseen and time.monotonic() - started < self.timeout:
                active = {row.order_id for row in all_active(store)} & ours
                candidates = [o for o in unseen if o not in active][:READS_PER_POLL]
                for order_id in candidates:
                    process = store.find_process(order_id)
                    if process is not None and process.state.terminal:
                        finals[order_id] = process
                        unseen.remove(order_id)
                view.waiting = len(unseen) - len(active)
                view.in_flight = len(active)
                view.states = Counter(p.state for p in finals.values())
                view.retries = host_invocations(self.workdir, RETRY_FUNCTION) - retries_before
                view.elapsed = time.monotonic() - started
                live.update(view.table())
                time.sleep(0.5)
        return finals

    def _summarize(self, info, store, orders, finals, ops_before) -> Summary:
        summary = Summary(
            orders=self.count, profile=self.profile, workflow=self.workflow, hosts=self.hosts
        )
        states = Counter(p.state for p in finals.values())
        summary.processed = states[ProcessState.PROCESSED]
        summary.errors = states[ProcessState.ERROR]
        summary.compensated = sum(
            1
            for p in finals.values()
            if p.state is ProcessState.ERROR and p.compensation_cause is not None
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
        for order_id in finals:
            released = [e for e in store.get_timeline(order_id) if e.event == "released"]
            summary.retries += len(released)
            if any(e.actor.startswith("supervisor") for e in released):
                summary.recovered_by_supervisor += 1
        alerted = alerted_orders(info.settings)
        ours = {o.order_id for o in orders}
        summary.alerts = len(alerted & ours)
        summary.errors_with_alert = sum(
            1
            for order_id, p in finals.items()
            if p.state is ProcessState.ERROR and order_id in alerted
        )
        summary.duplicated_effects = duplicated_effects(info.fakes_url, ours)
        ops_after = host_operations(self.workdir)
        summary.operations_per_order = {
            kind: round((ops_after.get(kind, 0) - ops_before.get(kind, 0)) / self.count, 2)
            for kind in sorted(ops_after)
            if ops_after.get(kind, 0) != ops_before.get(kind, 0)
        }
        return summary

    def _show(self, s: Summary) -> None:
        table = Table("", "", title="summary")
        rows = [
            ("processed", f"[green]{s.processed}[/] of {s.orders}"),
            ("errors (each with an alert?)", f"{s.errors} ({s.errors_with_alert} alerted)"),
            ("… of which compensated", str(s.compensated)),
            ("not finished", f"{s.not_finished}"),
            ("recovered by the Supervisor", str(s.recovered_by_supervisor)),
            ("retries", str(s.retries)),
            ("duplicated remote effects", str(s.duplicated_effects)),
            ("orders/s", str(s.orders_per_s)),
            ("latency p50 / p99 (s)", f"{s.latency_p50_s} / {s.latency_p99_s}"),
        ]
        rows += [(f"{kind} per order", str(n)) for kind, n in s.operations_per_order.items()]
        rows += [(f"CPU s, {name}", str(n)) for name, n in s.cpu_seconds.items()]
        for name, value in rows:
            table.add_row(name, value)
        self.console.print(table)


@dataclass
class Progress:
    """What the live view shows while orders flow."""

    orders: int
    waiting: int = 0
    in_flight: int = 0
    retries: int = 0
    elapsed: float = 0.0
    states: Counter = field(default_factory=Counter)

    def table(self) -> Table:
        done = sum(self.states.values())
        table = Table(title=f"{self.orders} orders, {self.elapsed:.0f}s")
        columns = ("not started", "in flight", "Processed", "Error", "retries", "orders/s")
        for column in columns:
            table.add_column(column, justify="right")
        table.add_row(
            str(max(self.waiting, 0)),
            str(self.in_flight),
            f"[green]{self.states[ProcessState.PROCESSED]}[/]",
            f"[red]{self.states[ProcessState.ERROR]}[/]",
            f"[yellow]{self.retries}[/]",
            f"{done / self.elapsed:.1f}" if self.elapsed > 0 else "-",
        )
        return table
