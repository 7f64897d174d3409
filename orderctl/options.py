"""The options several `orderctl` commands take, declared once so each reads and helps the same."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Annotated

import typer

Workdir = Annotated[
    Path, typer.Option(help="where the stack keeps its logs and stack.json", show_default=True)
]
Json = Annotated[
    bool, typer.Option("--json", help="print one JSON document (shapes: docs/orderctl.md)")
]
Wide = Annotated[bool, typer.Option("--wide", help="show every column in full: never cut")]

OPERATOR = getpass.getuser()
Operator = Annotated[
    str,
    typer.Option(
        help="who acts, recorded in the order's timeline (remote mode: the API records the "
        "caller it authenticated instead)"
    ),
]
Reason = Annotated[str, typer.Option(help="why, recorded in the order's timeline")]

Yes = Annotated[bool, typer.Option("--yes", "-y", help="act without asking")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="only list what would be acted on")]

OlderThan = Annotated[
    str | None,
    typer.Option("--older-than", help="only orders created longer ago: 90s, 15m, 2h, 7d"),
]
NewerThan = Annotated[
    str | None,
    typer.Option("--newer-than", help="only orders created more recently: 90s, 15m, 2h, 7d"),
]
StepFilter = Annotated[str | None, typer.Option("--step", help="only orders now at this step")]
TextFilter = Annotated[
    str | None,
    typer.Option("--text", help="only orders with this in their id, last error or reason"),
]

Telemetry = Annotated[
    bool,
    typer.Option(
        "--telemetry",
        help="the hosts write spans and metrics to files (`orderctl trace ID` reads them), in "
        "WORKDIR/telemetry unless --telemetry-dir says where",
    ),
]
TelemetryDir = Annotated[
    Path | None,
    typer.Option(metavar="DIR", help="write the telemetry files here (implies --telemetry)"),
]
