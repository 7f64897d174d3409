"""`orderctl`: run the Scheduler Agent Supervisor pattern on this machine.

orderctl up          start Azurite, the broker, the fake services and function hosts
orderctl submit      send an OrderSubmitted message to the orders queue
orderctl status ID   an order's state, steps and timeline
orderctl demo        submit orders under a fault profile and watch the pattern cope
orderctl supervisor  the Supervisor's lag, bucket leases and recovery bound
orderctl purge       archive, then delete, finished orders past an age (or count them: --dry-run)
orderctl purges      the recorded purge runs
orderctl archived ID a purged order, read back from the archive
"""

from __future__ import annotations

import getpass
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from devstack.stack.local_stack import DEFAULT_WORKDIR, LocalStack, StackInfo
from devstack.stack.processes import REPO_ROOT, ServiceStartError
from operator_api.errors import OperatorError

app = typer.Typer(
    help="Run the Scheduler Agent Supervisor pattern locally (no Azure account, no Docker).",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()

Workdir = Annotated[
    Path, typer.Option(help="where the stack keeps its logs and stack.json", show_default=True)
]


def fail(message: str, code: int = 1) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def check_installed() -> None:
    if not (REPO_ROOT / "node_modules" / ".bin" / "azurite").exists():
        raise fail("Azurite is not installed: run scripts/bootstrap (it runs `npm ci`)", 2)


def check_profile(profile: str) -> None:
    """Refuse a bad fault profile before anything starts, naming the line or field at fault."""
    from devstack.fakes.profiles import ProfileError, load_profile
    from devstack.stack.local_stack import profile_path

    try:
        load_profile(profile_path(profile))
    except (ProfileError, ValueError, OSError) as error:
        raise fail(f"fault profile: {error}", 2) from None


def running_stack(workdir: Path) -> StackInfo:
    info = StackInfo.load(workdir)
    if info is None:
        raise fail(
            f"no running stack in {workdir}: start one with `orderctl up` in another terminal "
            "(or run `orderctl demo`, which starts its own)",
            2,
        )
    return info


@app.command()
def up(
    hosts: Annotated[int, typer.Option(min=1, max=8, help="function host processes")] = 1,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="receivers per queue trigger (default: host.json)")
    ] = None,
    profile: Annotated[
        str,
        typer.Option(help="fault profile of the fake services: clean, flaky, chaotic or a path"),
    ] = "clean",
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Start the local stack and keep it running until Ctrl-C."""
    check_installed()
    check_profile(profile)
    if (existing := StackInfo.load(workdir)) is not None:
        raise fail(f"a stack is already running from {workdir} (PIDs {existing.pids})", 2)
    stack = LocalStack(workdir, hosts=hosts, concurrency=concurrency, profile=profile)
    stopped = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopped.set())
    try:
        info = stack.start(progress=lambda step: console.print(f"[dim]…[/] {step}"))
    except (ServiceStartError, OSError, ValueError) as error:
        raise fail(str(error)) from None
    show_stack(info)
    console.print("[green]ready.[/] Ctrl-C stops everything this command started.")
    stopped.wait()
    console.print("stopping…")
    stack.stop()


def show_stack(info: StackInfo) -> None:
    table = Table("component", "where", "PID", title="local stack")
    settings = info.settings
    table.add_row(
        "Service Bus broker",
        settings["ServiceBusConnection"].split(";")[0],
        str(info.pids.get("broker", "")),
    )
    table.add_row("Azurite", "tables + blobs (see stack.json)", str(info.pids.get("azurite", "")))
    table.add_row("fake services", info.fakes_url, str(info.pids.get("fakes", "")))
    if info.api_url:
        table.add_row("operator HTTP API", f"{info.api_url}openapi.json", "")
    for name, pid in info.pids.items():
        if name.startswith("host"):
            table.add_row(f"functions {name}", "function_app.py", str(pid))
    console.print(table)


@app.command()
def submit(
    order_id: Annotated[str | None, typer.Option(help="default: a new unique id")] = None,
    item: Annotated[
        list[str] | None,
        typer.Option(help="SKU:QUANTITY:UNIT_PRICE_CENTS, repeatable [default: SKU-1:1:1999]"),
    ] = None,
    customer: str = "customer-1",
    currency: str = "EUR",
    workflow: str = "order",
    reply_to: Annotated[str | None, typer.Option(help="queue for status updates")] = None,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Submit one order to the running stack."""
    from devstack.orders import build_order, send_orders

    info = running_stack(workdir)
    try:
        order = build_order(
            order_id, item or ["SKU-1:1:1999"], customer, currency, workflow, reply_to
        )
    except (ValueError, ValidationError) as error:
        raise fail(f"the order is not valid: {error}", 2) from None
    send_orders(info.settings, [order])
    console.print(f"submitted [bold]{order.order_id}[/] ({order.total_cents} {order.currency})")


@contextmanager
def operations(workdir: Path) -> Iterator[Any]:
    """The operator operations (operator_api.operations) on the running stack."""
    from core.runtime import Runtime
    from core.settings import Settings
    from operator_api.operations import Operations

    info = running_stack(workdir)
    runtime = Runtime.from_settings(Settings.from_env(info.settings))
    ops = Operations(runtime)
    try:
        yield ops
    except OperatorError as error:
        raise fail(f"{error.message} ({error.code})", 2) from None
    finally:
        ops.close()
        runtime.close()


OPERATOR = getpass.getuser()
Operator = Annotated[str, typer.Option(help="who acts, recorded in the order's timeline")]
Reason = Annotated[str, typer.Option(help="why, recorded in the order's timeline")]


@app.command()
def status(order_id: str, workdir: Workdir = DEFAULT_WORKDIR) -> None:
    """Show an order's state, steps and timeline."""
    with operations(workdir) as ops:
        order = ops.show_order(order_id)
    show_order(order)


def show_order(order: Any) -> None:
    """An order's state, steps and timeline (an OrderDetail)."""
    p = order.order
    console.print(
        Text.assemble(
            (p.order_id, "bold"),
            f"  {p.state}  step {p.current_step} ({p.current_operation}), "
            f"generation {p.generation}, attempt {p.attempt}, failures {p.failure_count}, "
            f"locked by {p.locked_by or '-'}",
        )
    )
    if p.next_attempt_at:
        console.print(f"next attempt due {p.next_attempt_at:%H:%M:%S}")
    if p.compensation_cause:
        console.print(
            Text(f"compensation ({p.compensation_cause}): {p.compensation_reason or '-'}")
        )
    if p.last_error:
        console.print(Text(f"last error: {p.last_error}"))
    console.print(step_table(order.steps))
    events = Table("#", "at", "actor", "event", "from → to", "detail", title="timeline")
    for entry in order.timeline:
        events.add_row(
            str(entry.seq),
            entry.at.strftime("%H:%M:%S.%f")[:-3],
            Text(entry.actor),
            Text(entry.event),
            f"{entry.from_state or ''} → {entry.to_state}",
            Text(entry.detail),
        )
    console.print(events)


STEP_STYLES = {
    "Succeeded": "green",
    "Running": "yellow",
    "Failed": "red",
    "Compensated": "cyan",
    "Voided": "cyan",
}


def step_table(steps: Any) -> Table:
    """Each step: what is known of its effect, its key's generation, requests sent, outcome."""
    table = Table("step", "state", "gen", "attempts", "completed", "undone", "error", title="steps")
    for step in steps:
        style = STEP_STYLES.get(step.state)
        error = f"{step.error_code}: {step.error_message}" if step.error_code else ""
        table.add_row(
            step.name,
            Text(step.state, style=style or ""),
            str(step.generation),
            str(step.attempt),
            f"{step.completed_at:%H:%M:%S}" if step.completed_at else "",
            f"{step.compensated_at:%H:%M:%S}" if step.compensated_at else "",
            Text(error[:60]),
        )
    return table


@app.command()
def orders(
    state: Annotated[str, typer.Argument(help="Pending, Processing, Compensating or Error")],
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    continuation: Annotated[str | None, typer.Option(help="from the previous page")] = None,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """List orders in a state (the in-flight index, or the Error index), a page at a time."""
    with operations(workdir) as ops:
        page = ops.list_orders(state, limit=limit, continuation=continuation)
    table = Table(
        "order",
        "step",
        "attempt",
        "failures",
        "next attempt",
        "last error",
        title=f"{page.state} orders",
    )
    for o in page.items:
        due = f"{o.next_attempt_at:%H:%M:%S}" if o.next_attempt_at else ""
        table.add_row(
            o.order_id,
            o.current_step or "",
            str(o.attempt),
            str(o.failure_count),
            due,
            Text((o.last_error or "")[:60]),
        )
    console.print(table)
    if page.continuation:
        console.print(f"more: --continuation {page.continuation}")


@app.command()
def alerts(
    limit: Annotated[int, typer.Option(min=1, max=250)] = 50,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """List operator alerts waiting on the alerts queue (peeked; acknowledge with `ack`)."""
    with operations(workdir) as ops:
        page = ops.list_alerts(limit=limit)
    table = Table("#", "enqueued", "severity", "order", "reason", "detail", title="alerts")
    for item in page.items:
        alert = item.alert or {}
        table.add_row(
            str(item.sequence_number),
            f"{item.enqueued_at:%H:%M:%S}" if item.enqueued_at else "",
            Text(str(alert.get("severity", "?"))),
            Text(str(alert.get("order_id") or "-")),
            Text(str(alert.get("reason", item.problem or ""))),
            Text(str(alert.get("detail", item.raw or ""))[:80]),
        )
    console.print(table)


@app.command()
def ack(
    sequence_number: int,
    operator: Operator = OPERATOR,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Acknowledge (remove) an alert by its sequence number, recorded in the order's timeline."""
    with operations(workdir) as ops:
        done = ops.acknowledge_alert(sequence_number, operator=operator)
    console.print(f"alert {done.sequence_number} acknowledged by {done.acknowledged_by}")


@app.command()
def resubmit(
    order_id: str,
    reason: Reason,
    operator: Operator = OPERATOR,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Resubmit an Error order: it resumes at the failed step (or finishes its compensation)."""
    with operations(workdir) as ops:
        done = ops.resubmit(order_id, operator=operator, reason=reason)
    console.print(f"{done.order_id}: {done.outcome} ({done.state})")


@app.command()
def cancel(
    order_id: str,
    reason: Reason,
    operator: Operator = OPERATOR,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Cancel a Pending or Processing order at once: every step that may have taken effect (the
    one in flight too) is undone, then Error."""
    with operations(workdir) as ops:
        done = ops.cancel(order_id, operator=operator, reason=reason)
    console.print(f"{done.order_id}: {done.outcome} ({done.state})")


@app.command()
def supervisor(workdir: Workdir = DEFAULT_WORKDIR) -> None:
    """Show the Supervisor's lag, who sweeps which bucket, and the recovery bound."""
    with operations(workdir) as ops:
        view = ops.supervisor()
    oldest = "never" if view.oldest_sweep_s is None else f"{view.oldest_sweep_s:.1f} s ago"
    bound = view.bound
    console.print(
        f"lag [bold]{view.lag_s:.1f} s[/]; least recently swept bucket: {oldest}; "
        f"deadline to recovery at most {bound['detection_s']:.1f} s "
        f"(period {bound['period_s']:g} s, budget {bound['budget_s']:g} s, "
        f"lease {bound['lease_s']:g} s)"
    )
    if view.unswept_buckets:
        console.print(
            "[red]buckets not swept within the bound:[/] "
            + ", ".join(str(b) for b in view.unswept_buckets)
        )
    table = Table("bucket", "holder", "swept", "by", "lag s", "due", title="buckets")
    for b in view.buckets:
        table.add_row(
            str(b.bucket),
            Text(b.holder or "-"),
            f"{b.swept_at:%H:%M:%S}" if b.swept_at else "never",
            Text(b.swept_by or "-"),
            f"{b.lag_s:.1f}",
            str(b.due_found),
        )
    console.print(table)


@app.command()
def purge(
    state: Annotated[
        str, typer.Option(help="Processed, Error (resolved ones only) or all")
    ] = "all",
    older_than: Annotated[
        int | None,
        typer.Option(
            "--older-than",
            min=1,
            max=3650,
            help="days since the order last changed [default: the RETENTION_DAYS setting]",
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="only count what would be purged")] = False,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="candidates examined")] = 1000,
    operator: Operator = OPERATOR,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Archive, then delete, finished orders (never one in flight); recorded with your name."""
    with operations(workdir) as ops:
        report = ops.purge(
            operator=operator,
            state=state,
            older_than_days=older_than,
            dry_run=dry_run,
            limit=limit,
        )
    show_purge(report)


def show_purge(report: Any) -> None:
    kept = ", ".join(f"{reason} {n}" for reason, n in sorted(report.kept.items())) or "none"
    title = "purge (dry run: nothing changed)" if report.dry_run else f"purge {report.run_id}"
    table = Table("examined", "purgeable", "archived", "purged", "skipped (changed)", title=title)
    table.add_row(
        str(report.examined),
        str(report.purgeable),
        str(report.archived),
        str(report.purged),
        str(report.skipped_changed),
    )
    console.print(table)
    console.print(
        Text(
            f"{', '.join(report.states)} orders last changed before "
            f"{report.cutoff:%Y-%m-%d %H:%M} UTC ({report.older_than_days:g} days); kept: {kept}"
        )
    )
    if report.blobs:
        console.print(Text(f"archived to {', '.join(report.blobs)}"))
    if report.failed:
        console.print(Text(f"{report.failed} order(s) could not be read: see the host logs"))
    if report.more:
        console.print("more candidates are left: run it again")


@app.command()
def purges(
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """List the recorded purge runs (the timer's and operators'), newest first."""
    with operations(workdir) as ops:
        view = ops.purge_runs(limit=limit)
    table = Table("run", "started", "by", "states", "days", "purged", "skipped", title="purges")
    for run in view.runs:
        table.add_row(
            Text(run.run_id),
            f"{run.started_at:%Y-%m-%d %H:%M:%S}",
            Text(run.requested_by),
            Text(",".join(run.states)),
            f"{run.older_than_days:g}",
            str(run.purged),
            str(run.skipped_changed),
        )
    console.print(table)


@app.command()
def archived(
    order_id: str,
    day: Annotated[
        str | None, typer.Option(help="only the archive of this day (UTC, YYYY-MM-DD)")
    ] = None,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Show a purged order (state, steps, timeline) read back from the archive."""
    with operations(workdir) as ops:
        view = ops.archived_order(order_id, day=day)
    console.print(
        Text(
            f"archived {view.archived_at:%Y-%m-%d %H:%M:%S} UTC by purge run {view.run_id}"
            + (f" ({view.copies} copies; showing the latest)" if view.copies > 1 else "")
        )
    )
    show_order(view.order)


@app.command("dead-letters")
def dead_letters(
    queue: Annotated[
        str | None, typer.Argument(help="a queue role (orders, responses, ...); all if omitted")
    ] = None,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Count dead letters per queue, or show one queue's dead letters."""
    with operations(workdir) as ops:
        if queue is None:
            summary = ops.dead_letter_summary()
            table = Table("queue", "entity", "dead letters", title="dead-letter queues")
            for q in summary.queues:
                table.add_row(q.queue, q.entity, f"{q.count}{'+' if q.more else ''}")
            console.print(table)
            return
        page = ops.list_dead_letters(queue)
    table = Table("#", "reason", "description", "body", title=f"dead letters of {page.entity}")
    for item in page.items:
        table.add_row(
            str(item.sequence_number),
            Text(item.reason or ""),
            Text(item.description or ""),
            Text(str(item.body if item.body is not None else item.raw)[:80]),
        )
    console.print(table)


@app.command()
def demo(
    orders: Annotated[int, typer.Option(min=1, max=100_000)] = 40,
    profile: Annotated[str, typer.Option(help="clean, flaky, chaotic or a path")] = "chaotic",
    workflow: str = "order",
    hosts: Annotated[int, typer.Option(min=1, max=8)] = 2,
    concurrency: Annotated[int | None, typer.Option(min=1)] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for every order")] = 300.0,
    rate: Annotated[
        float, typer.Option(min=0, help="submit this many orders/s (0: all at once)")
    ] = 0.0,
    quick: Annotated[
        bool, typer.Option(help="demo timings: 8 s step deadlines, 2 s supervisor ticks")
    ] = True,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the summary here")] = None,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Submit orders under a fault profile, show live progress, then a summary."""
    from devstack.demo import Demo

    check_installed()
    check_profile(profile)
    try:
        summary = Demo(
            orders=orders,
            profile=profile,
            workflow=workflow,
            hosts=hosts,
            concurrency=concurrency,
            timeout=timeout,
            quick=quick,
            workdir=workdir,
            rate=rate,
            console=console,
        ).run()
    except (ServiceStartError, OSError) as error:
        raise fail(str(error)) from None
    if json_out:
        json_out.write_text(summary.to_json())
    if not summary.all_terminal:
        raise typer.Exit(1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
