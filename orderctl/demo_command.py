"""`orderctl demo`: the command that runs :class:`orderctl.demo.Demo` (submit orders under
a fault profile, show live progress, then a summary)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from devstack.stack.local_stack import DEFAULT_WORKDIR
from devstack.stack.processes import ServiceStartError
from orderctl import connection
from orderctl.app import app, at_edge, err_console, fail, output
from orderctl.options import Telemetry, TelemetryDir, Workdir


@app.command()
@at_edge
async def demo(
    orders: Annotated[int, typer.Option(min=1, max=100_000)] = 40,
    profile: Annotated[
        str | None,
        typer.Option(
            help="clean, flaky, chaotic, stress or a path [default: chaotic for a stack the "
            "demo starts; on a running stack, its own profile, unchanged]",
            show_default=False,
        ),
    ] = None,
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
    json_out: Annotated[
        str | None,
        typer.Option(
            "--json",
            metavar="PATH|-",
            help="write the summary as JSON to PATH, or to stdout with `-` (the live view "
            "then goes to stderr)",
        ),
    ] = None,
    telemetry: Telemetry = False,
    telemetry_dir: TelemetryDir = None,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Submit orders under a fault profile, show live progress, then a summary. On a running
    stack, --profile changes its faults for the demo (said, and set back afterwards).
    --telemetry: a stack the demo starts writes spans and metrics (`orderctl trace ID`)."""
    from orderctl.demo import Demo

    to_stdout = json_out == "-"
    screen = output(to_stdout)
    connection.check_installed()
    if profile is not None:
        connection.check_profile(profile)
    try:
        summary = await Demo(
            orders=orders,
            profile=profile,
            workflow=workflow,
            hosts=hosts,
            concurrency=concurrency,
            timeout=timeout,
            quick=quick,
            workdir=workdir,
            rate=rate,
            console=err_console if to_stdout else screen,
            telemetry=connection.telemetry_path(workdir.resolve(), telemetry, telemetry_dir),
        ).run()
    except (ServiceStartError, OSError) as error:
        raise fail(str(error)) from None
    if to_stdout:
        sys.stdout.write(summary.to_json())
    elif json_out:
        Path(json_out).write_text(summary.to_json())
    if not summary.all_terminal:
        raise typer.Exit(1)
