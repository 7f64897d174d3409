"""`orderctl alerts` and `ack`: the operator alerts waiting on the alerts queue, whether
each order has recovered since, and acknowledging one."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from devstack.stack.local_stack import DEFAULT_WORKDIR
from orderctl import connection
from orderctl.app import MODE, app, at_edge, emit, output
from orderctl.options import OPERATOR, Json, Operator, Reason, Wide, Workdir
from orderctl.plain_text import text


@app.command()
@at_edge
async def alerts(
    open_only: Annotated[
        bool, typer.Option("--open", help="only alerts still open (or retrying)")
    ] = False,
    limit: Annotated[int, typer.Option(min=1, max=100)] = 50,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """List operator alerts waiting on the alerts queue (peeked; acknowledge with `ack`), each
    with whether its order has recovered since (resolved) or is being retried."""
    screen = output(json_out, wide)
    async with connection.operations(workdir) as ops:
        page = await ops.list_alerts(limit=limit, open_only=open_only)
    emit(page, show_alerts, screen)


RESOLUTION_STYLES = {"open": "red", "retrying": "yellow", "resolved": "green"}


def show_alerts(page: Any, screen: Console) -> None:
    if not page.items:
        screen.print(Text("no open alerts" if page.open_only else "no alerts waiting"))
        return
    table = Table(title="open alerts" if page.open_only else "alerts")
    for name in ("#", "enqueued", "severity", "order", "status", "reason"):
        table.add_column(name, no_wrap=True)
    table.add_column("detail", ratio=1)
    for item in page.items:
        alert = item.alert or {}
        table.add_row(
            str(item.sequence_number),
            f"{item.enqueued_at:%H:%M:%S}" if item.enqueued_at else "",
            text(alert.get("severity", "?")),
            text(alert.get("order_id") or "-", width=40, wide=MODE.wide),
            text(item.resolution, RESOLUTION_STYLES.get(item.resolution, "")),
            text(alert.get("reason", item.problem or ""), width=40, wide=MODE.wide),
            text(alert.get("detail", item.raw or ""), width=80, wide=MODE.wide),
        )
    screen.print(table)
    if page.continuation:
        screen.print(text("more alerts are waiting: raise --limit (at most 100)"))


@app.command()
@at_edge
async def ack(
    sequence_number: int,
    reason: Reason = "",
    operator: Operator = OPERATOR,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Acknowledge (remove) an alert by its sequence number, recorded with --reason in the
    order's timeline."""
    screen = output(json_out, wide)
    async with connection.operations(workdir) as ops:
        done = await ops.acknowledge_alert(sequence_number, operator=operator, reason=reason)
    emit(done, show_ack, screen)


def show_ack(done: Any, screen: Console) -> None:
    screen.print(text(f"alert {done.sequence_number} acknowledged by {done.acknowledged_by}"))
