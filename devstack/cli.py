"""`orderctl`: run the Scheduler Agent Supervisor pattern on this machine.

orderctl up          start Azurite, the broker, the fake services and function hosts
orderctl submit      send an OrderSubmitted message to the orders queue
orderctl status ID   an order's state, steps and timeline
orderctl demo        submit orders under a fault profile and watch the pattern cope
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from devstack.stack.local_stack import DEFAULT_WORKDIR, LocalStack, StackInfo
from devstack.stack.processes import REPO_ROOT, ServiceStartError

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


@app.command()
def status(order_id: str, workdir: Workdir = DEFAULT_WORKDIR) -> None:
    """Show an order's state, steps and timeline."""
    from core.state_models import OrderNotFound
    from devstack.orders import read_order

    info = running_stack(workdir)
    try:
        record, timeline = read_order(info.settings, order_id)
    except OrderNotFound:
        raise fail(f"no order {order_id!r} in this stack", 2) from None
    except ValueError as error:
        raise fail(f"{order_id!r} is not a valid order id: {error}", 2) from None
    process = record.process
    console.print(
        f"[bold]{order_id}[/]  {process.state}  step {process.current_step} "
        f"({process.current_operation}), attempt {process.attempt}, "
        f"failures {process.failure_count}, locked by {process.locked_by or '-'}"
    )
    if process.last_error:
        console.print(f"last error: {process.last_error}")
    steps = Table("step", "state", "attempt", "completed", title="steps")
    for step in record.steps:
        steps.add_row(step.name, step.state, str(step.attempt), str(step.completed_at or ""))
    console.print(steps)
    events = Table("#", "at", "actor", "event", "from → to", "detail", title="timeline")
    for entry in timeline:
        events.add_row(
            str(entry.seq),
            entry.at.strftime("%H:%M:%S.%f")[:-3],
            entry.actor,
            entry.event,
            f"{entry.from_state or ''} → {entry.to_state or ''}",
            entry.detail or "",
        )
    console.print(events)


@app.command()
def demo(
    orders: Annotated[int, typer.Option(min=1, max=100_000)] = 40,
    profile: Annotated[str, typer.Option(help="clean, flaky, chaotic or a path")] = "chaotic",
    workflow: str = "order",
    hosts: Annotated[int, typer.Option(min=1, max=8)] = 2,
    concurrency: Annotated[int | None, typer.Option(min=1)] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for every order")] = 300.0,
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
