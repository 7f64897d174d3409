"""The `orderctl` typer app and what every command shares: the global options (--debug,
--version, remote mode), the one event loop at a command's edge, and how a command prints,
fails and asks (people's tables, or one --json document; one-line errors with exit codes).

The commands are declared on :data:`app` by the ``*_commands`` modules beside this one, one
concern each; :mod:`orderctl.cli` imports them all and runs the app.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any, ParamSpec

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.text import Text
from typer.core import TyperGroup
from typer.exceptions import TyperException

from orderctl.output import ErrorView, write_json
from orderctl.plain_text import printable
from orderctl.remote_config import (
    API_URL_ENV,
    AUTH_ENV,
    FUNCTION_KEY_ENV,
    SCOPE_ENV,
    RemoteOptions,
)

P = ParamSpec("P")

WIDE = 1_000_000  # columns: --wide never wraps or cuts
COMMAND_ORDER = (
    "up", "down", "ps", "submit", "status", "orders", "alerts", "ack", "resubmit", "cancel",
    "restart", "supervisor", "purge", "workflows", "workflow-diff", "migrate", "purges",
    "archived", "dead-letters", "dead-letter-log", "fault", "health", "trace", "demo",
)  # fmt: skip
"""The order `orderctl --help` (and shell completion) lists the commands in, whichever module
declares each."""


@dataclass
class Mode:
    """How this invocation prints: set from the global and per-command options."""

    json: bool = False
    wide: bool = False
    debug: bool = False
    remote: RemoteOptions | None = None
    """Remote mode (--api-url, --azd-env): operator commands go over the HTTP API."""
    command: str = ""


MODE = Mode()


class SafeGroup(TyperGroup):
    """Turns any error a command did not expect into one line and exit code 1 (with
    ``--debug``: the traceback)."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (TyperException, typer.Exit, typer.Abort):
            raise
        except Exception as error:
            if MODE.debug:
                raise
            raise fail(describe(error), 1) from None

    def list_commands(self, ctx: Any) -> list[str]:
        """The commands in :data:`COMMAND_ORDER` (one it does not name: last, as declared)."""
        rank = {name: n for n, name in enumerate(COMMAND_ORDER)}
        return sorted(super().list_commands(ctx), key=lambda name: rank.get(name, len(rank)))


app = typer.Typer(
    cls=SafeGroup,
    help="Run the Scheduler Agent Supervisor pattern locally (no Azure account, no Docker), "
    "and operate it or a deployed app (--api-url).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


def at_edge(command: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """A command written as a coroutine function, run by ``asyncio.run``: the one event loop
    of the invocation, at its edge (the app's I/O is async only)."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(command(*args, **kwargs))

    return run


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("scheduler-agent-supervisor")
    except PackageNotFoundError:
        return "unknown (not installed: run scripts/bootstrap)"


def show_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"orderctl {version()} (Python {sys.version.split()[0]})\n")
        raise typer.Exit()


REMOTE = "Remote mode (docs/orderctl.md)"


@app.callback()
def options(
    ctx: typer.Context,
    debug: Annotated[
        bool, typer.Option("--debug", help="show tracebacks instead of one-line errors")
    ] = False,
    _version: Annotated[
        bool,
        typer.Option(
            "--version", callback=show_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
    api_url: Annotated[
        str | None,
        typer.Option(
            "--api-url",
            envvar=API_URL_ENV,
            metavar="URL",
            help="run the operator commands over this operator HTTP API instead of in process: "
            "https://<app>.azurewebsites.net/api/, or a local stack's (`orderctl ps`)",
            rich_help_panel=REMOTE,
        ),
    ] = None,
    azd_env: Annotated[
        str | None,
        typer.Option(
            "--azd-env",
            metavar="FILE|-",
            help="take the API's URL (and ORDERCTL_* values) from `azd env get-values` output "
            "in FILE, or on stdin with -",
            rich_help_panel=REMOTE,
        ),
    ] = None,
    function_key: Annotated[
        str | None,
        typer.Option(
            "--function-key",
            envvar=FUNCTION_KEY_ENV,
            metavar="KEY",
            help="send this function key (x-functions-key); prefer the environment variable",
            rich_help_panel=REMOTE,
        ),
    ] = None,
    entra: Annotated[
        bool,
        typer.Option(
            "--entra",
            help=f"also send an Entra ID token (azure-identity DefaultAzureCredential; "
            f"{AUTH_ENV}=entra): who acts, for App Service Authentication",
            rich_help_panel=REMOTE,
        ),
    ] = False,
    scope: Annotated[
        str | None,
        typer.Option(
            "--scope",
            envvar=SCOPE_ENV,
            metavar="SCOPE",
            help="with --entra: the token's scope, api://<app-client-id>/.default",
            rich_help_panel=REMOTE,
        ),
    ] = None,
) -> None:
    """Run the Scheduler Agent Supervisor pattern locally (no Azure account, no Docker), and
    operate it, or a deployed app (--api-url)."""
    MODE.debug = debug
    MODE.json = MODE.wide = False
    MODE.command = ctx.invoked_subcommand or ""
    remote = RemoteOptions(
        api_url=api_url,
        function_key=function_key,
        entra=entra,
        scope=scope,
        azd_env=azd_env,
        auth=os.environ.get(AUTH_ENV),
    )
    MODE.remote = remote if remote.requested else None


def output(json_out: bool = False, wide: bool = False) -> Console:
    """Note how this command prints; the console for people (wide: never wraps)."""
    MODE.json, MODE.wide = json_out, wide
    return Console(width=WIDE) if wide else console


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``message`` as one line on stderr (and, with --json, an ErrorView on stdout)."""
    lines = [line for line in str(message).strip().splitlines() if line.strip()] or ["failed"]
    first = lines[0].rstrip(":")
    if len(lines) > 1 and not MODE.debug:
        first += " (rerun with --debug for the details)"
    err_console.print(Text.assemble(("error: ", "bold red"), printable(first)), soft_wrap=True)
    if MODE.debug and len(lines) > 1:
        err_console.print(Text("\n".join(printable(line) for line in lines[1:])))
    if MODE.json:
        write_json(ErrorView(error=first, exit_code=code))
    return typer.Exit(code)


def describe(error: Exception) -> str:
    """What went wrong and what to do, for an error no command expected."""
    if isinstance(error, ValidationError):
        return f"invalid data: {validation_problems(error)}"
    name = type(error).__name__
    detail = str(error).strip().splitlines()[0] if str(error).strip() else name
    unreachable = ("ServiceRequestError", "ServiceBusConnectionError", "ConnectError")
    if name in unreachable or isinstance(error, ConnectionError):
        return (
            f"cannot reach the local stack ({detail}): is it running? "
            "See `orderctl ps`; restart it with `orderctl down && orderctl up --detach`"
        )
    return f"{name}: {detail} (rerun with --debug for the traceback)"


def validation_problems(error: ValidationError) -> str:
    """A pydantic error as one line: ``field: problem; field: problem``."""
    parts = []
    for problem in error.errors():
        where = ".".join(str(p) for p in problem["loc"]) or "value"
        parts.append(f"{where}: {problem['msg']}")
    return "; ".join(parts)


def emit(value: BaseModel, show: Any, *args: Any) -> None:
    """``value`` as JSON with --json, else ``show(value, *args)`` for people."""
    if MODE.json:
        write_json(value)
    else:
        show(value, *args)


def confirm(question: str, yes: bool) -> None:
    """Go on only if the user agrees (or gave --yes); otherwise stop, nothing done."""
    if yes:
        return
    try:
        agreed = typer.confirm(question, default=False, err=True)
    except typer.Abort:
        err_console.print()  # the prompt's line was left open
        agreed = False
    if not agreed:
        raise fail("not confirmed: nothing was done (--yes acts without asking)", 1)
