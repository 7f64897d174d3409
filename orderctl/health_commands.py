"""`orderctl supervisor` and `health`: the Supervisor's lag, backlog, bucket leases and recovery
bound; whether the app's settings, orders table and Service Bus work."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from devstack.stack.local_stack import DEFAULT_WORKDIR
from orderctl import connection, views
from orderctl.app import app, at_edge, emit, output
from orderctl.options import Json, Wide, Workdir
from orderctl.plain_text import text


@app.command()
@at_edge
async def supervisor(
    json_out: Json = False, wide: Wide = False, workdir: Workdir = DEFAULT_WORKDIR
) -> None:
    """Show the Supervisor's lag, its backlog and how fast it drains, who sweeps which bucket,
    and the recovery bound."""
    screen = output(json_out, wide)
    async with connection.operations(workdir) as ops:
        view = await ops.supervisor()
    emit(view, show_supervisor, screen)


def show_supervisor(view: Any, screen: Console) -> None:
    oldest = "never" if view.oldest_sweep_s is None else f"{view.oldest_sweep_s:.1f} s ago"
    bound = view.bound
    screen.print(
        Text.assemble(
            "lag ", (f"{view.lag_s:.1f} s", "bold"),
            f"; least recently swept bucket: {oldest}; "
            f"deadline to recovery at most {bound['detection_s']:.1f} s "
            f"(period {bound['period_s']:g} s, budget {bound['budget_s']:g} s, "
            f"lease {bound['lease_s']:g} s)",
        )
    )  # fmt: skip
    drain = "unknown" if view.time_to_drain_s is None else f"{view.time_to_drain_s:.1f} s"
    late = "" if view.drains_within_period else " — not within a period: recoveries run late"
    screen.print(
        Text.assemble(
            "backlog ", (f"{view.backlog}", "bold"),
            f" rows due ({view.left} left for the next tick); drained at "
            f"{view.drain_rate:.1f} rows/s; time to drain {drain}",
            (late, "red"),
        )
    )  # fmt: skip
    if view.unswept_buckets:
        screen.print(
            Text.assemble(
                ("buckets not swept within the bound: ", "red"),
                ", ".join(str(b) for b in view.unswept_buckets),
            )
        )
    table = Table(
        "bucket", "holder", "swept", "by", "lag s", "due", "handed out", "rows/s", title="buckets"
    )
    for b in view.buckets:
        table.add_row(
            str(b.bucket),
            text(b.holder or "-"),
            f"{b.swept_at:%H:%M:%S}" if b.swept_at else "never",
            text(b.swept_by or "-"),
            f"{b.lag_s:.1f}",
            str(b.due_found),
            str(b.dispatched),
            f"{b.drain_rate:.1f}",
        )
    screen.print(table)


@app.command()
@at_edge
async def health(
    json_out: Json = False, wide: Wide = False, workdir: Workdir = DEFAULT_WORKDIR
) -> None:
    """Check that the app can work: its settings, the orders table and Service Bus (exit 1 if
    not), as `GET /api/health` does."""
    screen = output(json_out, wide)
    async with connection.operations(workdir) as ops:
        view = await ops.health()
    emit(view, views.show_health, screen)
    if view.status != "ok":
        raise typer.Exit(1)
