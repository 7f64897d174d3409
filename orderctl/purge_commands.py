"""`orderctl purge`, `purges` and `archived`: retention. Archive, then delete, finished
orders; the recorded purge runs; a purged order read back from the archive."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from devstack.stack.local_stack import DEFAULT_WORKDIR
from orderctl import connection, views
from orderctl.app import MODE, app, at_edge, emit, output
from orderctl.options import OPERATOR, Json, Operator, Wide, Workdir
from orderctl.plain_text import text


@app.command()
@at_edge
async def purge(
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
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Archive, then delete, finished orders (never one in flight); recorded with your name."""
    screen = output(json_out, wide)
    async with connection.operations(workdir) as ops:
        report = await ops.purge(
            operator=operator,
            state=state,
            older_than_days=older_than,
            dry_run=dry_run,
            limit=limit,
        )
    emit(report, show_purge, screen)


def show_purge(report: Any, screen: Console) -> None:
    kept = ", ".join(f"{reason} {n}" for reason, n in sorted(report.kept.items())) or "none"
    title = "purge (dry run: nothing changed)" if report.dry_run else f"purge {report.run_id}"
    table = Table(
        "examined", "purgeable", "archived", "purged", "skipped (changed)", title=text(title)
    )
    table.add_row(
        str(report.examined),
        str(report.purgeable),
        str(report.archived),
        str(report.purged),
        str(report.skipped_changed),
    )
    screen.print(table)
    screen.print(
        text(
            f"{', '.join(report.states)} orders last changed before "
            f"{report.cutoff:%Y-%m-%d %H:%M} UTC ({report.older_than_days:g} days); kept: {kept}"
        )
    )
    if report.blobs:
        screen.print(text(f"archived to {', '.join(report.blobs)}"))
    if report.failed:
        screen.print(Text(f"{report.failed} order(s) could not be read: see the host logs"))
    if report.more:
        screen.print(Text("more candidates are left: run it again"))


@app.command()
@at_edge
async def purges(
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """List the recorded purge runs (the timer's and operators'), newest first."""
    screen = output(json_out, wide)
    async with connection.operations(workdir) as ops:
        view = await ops.purge_runs(limit=limit)
    emit(view, show_purges, screen)


def show_purges(view: Any, screen: Console) -> None:
    table = Table("run", "started", "by", "states", "days", "purged", "skipped", title="purges")
    for run in view.runs:
        table.add_row(
            text(run.run_id),
            f"{run.started_at:%Y-%m-%d %H:%M:%S}",
            text(run.requested_by),
            text(",".join(run.states)),
            f"{run.older_than_days:g}",
            str(run.purged),
            str(run.skipped_changed),
        )
    screen.print(table)


@app.command()
@at_edge
async def archived(
    order_id: str,
    day: Annotated[
        str | None, typer.Option(help="only the archive of this day (UTC, YYYY-MM-DD)")
    ] = None,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Show a purged order (state, steps, timeline) read back from the archive."""
    screen = output(json_out, wide)
    async with connection.operations(workdir) as ops:
        view = await ops.archived_order(order_id, day=day)
    emit(view, show_archived, screen)


def show_archived(view: Any, screen: Console) -> None:
    screen.print(
        text(
            f"archived {view.archived_at:%Y-%m-%d %H:%M:%S} UTC by purge run {view.run_id}"
            + (f" ({view.copies} copies; showing the latest)" if view.copies > 1 else "")
        )
    )
    views.show_order(view.order, screen, MODE.wide)
