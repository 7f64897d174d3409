"""`orderctl up`, `down` and `ps`: start the local stack and keep it running (restarting
what dies, in the foreground or detached), stop it by PID, show its processes."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from devstack.stack import processes
from devstack.stack.local_stack import (
    DEFAULT_WORKDIR,
    OPERATIONS,
    TELEMETRY_SETTING,
    LocalStack,
    StackInfo,
)
from devstack.stack.processes import REPO_ROOT, ServiceStartError
from orderctl import connection
from orderctl.app import MODE, app, emit, err_console, fail, output
from orderctl.options import Json, Telemetry, TelemetryDir, Wide, Workdir
from orderctl.output import ComponentView, DownView, StackView
from orderctl.plain_text import join_url, printable, text

DEFAULT_API_PORT = 7071  # as `func start`
SUPERVISOR_LOG = "supervisor.log"
SUPERVISOR_PID = "supervisor.pid"
LOCK_FILE = "stack.lock"
DETACH_TIMEOUT_S = 240.0

Hosts = Annotated[int, typer.Option(min=1, max=8, help="function host processes")]


@app.command()
def up(
    hosts: Hosts = 1,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="receivers per queue trigger (default: host.json)")
    ] = None,
    profile: Annotated[
        str,
        typer.Option(help="fault profile of the fake services: clean, flaky, chaotic or a path"),
    ] = "clean",
    api_port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65535,
            help="serve the operator HTTP API here, or on the next free port (0: any)",
        ),
    ] = DEFAULT_API_PORT,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="run in the background; stop with `down`")
    ] = False,
    telemetry: Telemetry = False,
    telemetry_dir: TelemetryDir = None,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
    supervise: Annotated[bool, typer.Option(hidden=True)] = False,
) -> None:
    """Start the local stack and keep it running: a process that dies is restarted (with
    backoff) at the same address. Ctrl-C stops it; with --detach, `orderctl down` does.
    With --telemetry the hosts write spans and metrics to files: `orderctl trace ID`."""
    screen = output(json_out, wide)
    MODE.debug = MODE.debug or supervise  # a detached supervisor's log gets every detail
    connection.check_installed()
    connection.check_profile(profile)
    workdir = workdir.resolve()
    if Path(profile).exists():
        profile = str(Path(profile).resolve())
    existing = StackInfo.load(workdir)
    if existing is not None and detach:
        emit(stack_view(existing, workdir, already_running=True), show_stack, screen)
        return
    if existing is not None or lock_held(workdir):
        pid = existing.supervisor_pid if existing else read_pid(workdir / SUPERVISOR_PID)
        raise fail(
            f"a stack is already running from {workdir} (supervisor PID {pid or '?'}): "
            "use it, or stop it with `orderctl down`",
            2,
        )
    stack_args = {
        "hosts": hosts,
        "concurrency": concurrency,
        "profile": profile,
        "telemetry": connection.telemetry_path(workdir, telemetry, telemetry_dir),
    }
    if detach:
        start_detached(workdir, api_port, screen, **stack_args)
        return
    stack = LocalStack(workdir, api_port=api_port, persist=True, **stack_args)
    asyncio.run(run_supervised(stack, screen, announce=not supervise))


async def run_supervised(stack: LocalStack, screen: Console, *, announce: bool) -> None:
    """Start ``stack``, then restart whatever dies until SIGINT or SIGTERM; then stop it."""
    from devstack.stack.supervisor import StackEvent, StackSupervisor

    workdir = stack.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    lock = take_lock(workdir)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopped.set)
    pid_file = workdir / SUPERVISOR_PID
    pid_file.write_text(f"{os.getpid()}\n")
    log = workdir / SUPERVISOR_LOG
    if announce:
        processes.rotate_log(log)  # a detached supervisor's stdout is this log already
    notes = err_console if MODE.json else screen

    def say(line: str) -> None:
        if announce:
            notes.print(Text(line, style="dim"))
            with open(log, "a") as file:
                file.write(line + "\n")
        else:
            print(line, flush=True)

    def report(event: StackEvent) -> None:
        say(event.line())

    try:
        try:
            info = await stack.start(progress=lambda step: say(f"… {step}"))
        except (ServiceStartError, OSError, ValueError) as error:
            raise fail(f"the stack did not start: {error}") from None
        stack.adopt(os.getpid())
        say(f"stack ready; supervisor PID {os.getpid()}; operator HTTP API at {info.api_url}")
        if announce:
            emit(stack_view(StackInfo.read(workdir) or info, workdir), show_stack, screen)
            if not MODE.json:
                screen.print("[green]ready.[/] Ctrl-C stops everything this command started.")
        await StackSupervisor(stack, report=report).run(stopped)
        say("stopping…")
    finally:
        stack.stop()
        pid_file.unlink(missing_ok=True)
        lock.close()


def start_detached(
    workdir: Path, api_port: int, screen: Console, *, hosts: int, concurrency: int | None,
    profile: str, telemetry: Path | None,
) -> None:  # fmt: skip
    """Start `orderctl up --supervise` in the background, wait until its stack is ready."""
    argv = [sys.executable, "-m", "orderctl.cli", "up", "--supervise", "--workdir", str(workdir)]
    argv += ["--hosts", str(hosts), "--profile", profile, "--api-port", str(api_port)]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    if telemetry is not None:
        argv += ["--telemetry-dir", str(telemetry)]
    log = workdir / SUPERVISOR_LOG
    workdir.mkdir(parents=True, exist_ok=True)
    notes = err_console if MODE.json else screen
    notes.print(Text(f"starting the stack in the background (log: {log})…", style="dim"))
    proc = processes.spawn(argv, log_path=log, cwd=REPO_ROOT, env=dict(os.environ), detached=True)
    deadline = time.monotonic() + DETACH_TIMEOUT_S
    while True:
        info = StackInfo.read(workdir)
        if info is not None and info.supervisor_pid == proc.pid:
            break
        if proc.poll() is not None:
            raise fail(f"the stack did not start: {last_error(log)}; see {log}")
        if time.monotonic() > deadline:
            processes.terminate(proc.pid)
            raise fail(f"the stack was not ready within {DETACH_TIMEOUT_S:.0f} s; see {log}")
        time.sleep(0.2)
    emit(stack_view(info, workdir), show_stack, screen)
    if not MODE.json:
        screen.print("[green]ready[/] (in the background). `orderctl down` stops it.")


def last_error(log: Path) -> str:
    lines = processes.tail(log, 200).splitlines()
    errors = [line.removeprefix("error: ") for line in lines if line.startswith("error:")]
    return (errors or lines or ["no output"])[-1]


def take_lock(workdir: Path) -> Any:
    """Hold ``workdir``'s lock for this process's life (one stack per workdir)."""
    lock = open(workdir / LOCK_FILE, "w")  # noqa: SIM115 - held until the stack stops
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise fail(
            f"another stack is starting or running from {workdir}: see `orderctl ps`", 2
        ) from None
    return lock


def lock_held(workdir: Path) -> bool:
    path = workdir / LOCK_FILE
    if not path.exists():
        return False
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(lock, fcntl.LOCK_UN)
        return False


def read_pid(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


@app.command()
def down(json_out: Json = False, workdir: Workdir = DEFAULT_WORKDIR) -> None:
    """Stop the stack running from WORKDIR (`up --detach`, or an `up` in another terminal):
    its supervisor first, which stops its processes, then any process left, by PID."""
    screen = output(json_out)
    workdir = workdir.resolve()
    info = StackInfo.read(workdir)
    supervisor = read_pid(workdir / SUPERVISOR_PID) or (info.supervisor_pid if info else 0)
    stopped: dict[str, int] = {}
    if supervisor and processes.pid_alive(supervisor) and processes.ours(supervisor):
        # Its hosts finish or abandon in-flight work (3 s), then each service gets 5 s.
        if not processes.terminate(supervisor, grace=30):
            raise fail(f"the supervisor (PID {supervisor}) did not stop: kill it by hand", 1)
        stopped["supervisor"] = supervisor
    for name, pid in (info.pids if info else {}).items():
        if pid and processes.pid_alive(pid) and processes.ours(pid):
            processes.terminate(pid)
            stopped[name] = pid
    (workdir / "stack.json").unlink(missing_ok=True)
    (workdir / SUPERVISOR_PID).unlink(missing_ok=True)
    view = DownView(workdir=str(workdir), was_running=bool(stopped), stopped=stopped)
    emit(view, show_down, screen)


def show_down(view: DownView, screen: Console) -> None:
    if not view.was_running:
        screen.print(Text(f"no stack running in {view.workdir}: nothing to stop"))
        return
    pids = ", ".join(f"{name} {pid}" for name, pid in view.stopped.items())
    screen.print(Text(f"stopped the stack in {view.workdir} ({pids})"))


@app.command()
def ps(json_out: Json = False, wide: Wide = False, workdir: Workdir = DEFAULT_WORKDIR) -> None:
    """Show the stack's processes: where each serves, its PID, restarts and log."""
    screen = output(json_out, wide)
    workdir = workdir.resolve()
    info = StackInfo.load(workdir)
    if info is None:
        view = StackView(
            workdir=str(workdir),
            running=False,
            supervisor_pid=0,
            api_url="",
            persistent=False,
            components=[],
        )
    else:
        view = stack_view(info, workdir)
    emit(view, show_stack, screen)


def stack_view(info: StackInfo, workdir: Path, *, already_running: bool = False) -> StackView:
    return StackView(
        workdir=str(workdir),
        running=True,
        supervisor_pid=info.supervisor_pid,
        api_url=info.api_url,
        persistent=info.persistent,
        telemetry_dir=info.settings.get(TELEMETRY_SETTING, ""),
        already_running=already_running,
        components=[
            ComponentView(
                name=name,
                pid=pid,
                running=processes.pid_alive(pid),
                address=address_of(name, info),
                restarts=info.restarts.get(name, 0),
                log=info.logs.get(name, ""),
            )
            for name, pid in info.pids.items()
        ],
    )


def address_of(name: str, info: StackInfo) -> str:
    from devstack.stack.azurite import from_connection_string

    if name == "azurite":
        account = from_connection_string(info.settings["StateStorage"])
        return f"tables {account.table_endpoint}, blobs {account.blob_endpoint}"
    if name == "broker":
        return info.settings["ServiceBusConnection"].split(";")[0].removeprefix("Endpoint=")
    if name == "fakes":
        return info.fakes_url
    if name == OPERATIONS:
        return info.api_url
    return ""


def show_stack(view: StackView, screen: Console) -> None:
    if not view.running:
        screen.print(
            Text(f"no stack running in {view.workdir}: start one with `orderctl up --detach`")
        )
        return
    if view.already_running:
        screen.print(Text(f"already running from {view.workdir}; `orderctl down` stops it"))
    columns = ["component", "where", "PID", "restarts"] + (["log"] if MODE.wide else [])
    table = Table(*columns, title="local stack")
    for c in view.components:
        pid = Text(str(c.pid)) if c.running else Text("down", style="red")
        row = [text(c.name), text(c.address), pid, text(c.restarts)]
        table.add_row(*row, *([text(c.log)] if MODE.wide else []))
    screen.print(table)
    if view.api_url:
        openapi = join_url(view.api_url, "openapi.json")
        dashboard = join_url(view.api_url, "dashboard")
        screen.print(Text.assemble("operator HTTP API: ", (printable(openapi), "bold")))
        screen.print(Text.assemble("dashboard:         ", (printable(dashboard), "bold")))
    if view.telemetry_dir:
        screen.print(
            Text.assemble(
                "telemetry:         ",
                (printable(view.telemetry_dir), "bold"),
                " (spans and metrics; `orderctl trace ORDER-ID`)",
            )
        )
    kept = "kept across restarts" if view.persistent else "in memory"
    screen.print(
        Text(
            f"supervisor PID {view.supervisor_pid or '-'}; Azurite and broker data {kept}; "
            f"logs in {view.workdir} (--wide lists them)"
        )
    )
