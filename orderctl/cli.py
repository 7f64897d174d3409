"""`orderctl`: run the Scheduler Agent Supervisor pattern on this machine.

orderctl up [--detach] start Azurite, the broker, the fake services and function hosts, and
                       keep them running (restarting any that dies)
orderctl down          stop a stack started with `up --detach` (or any `up`), by PID
orderctl ps            the stack's processes, addresses and restarts
orderctl submit        send an OrderSubmitted message to the orders queue (--wait: until done)
orderctl status ID     an order's state, steps and timeline (--watch: follow it live)
orderctl trace ID      an order's spans across every queue hop, with durations (`up --telemetry`)
orderctl orders STATE  orders in a state (Processed too), filtered, sorted, paged
orderctl alerts        operator alerts and whether each is resolved (--open); ack SEQ
orderctl resubmit, cancel, restart    operator actions on one order, or on a filter (bulk)
orderctl dead-letters  dead letters per queue; replay or purge them
orderctl dead-letter-log   the dead-letter replays and purges operators ran, and why
orderctl fault         the fake services' fault profile on the running stack; decline the next N
orderctl health        whether the app's settings, table and Service Bus work
orderctl demo          submit orders under a fault profile and watch the pattern cope
orderctl supervisor    the Supervisor's lag, bucket leases and recovery bound
orderctl purge         archive, then delete, finished orders past an age (or count: --dry-run)
orderctl purges        the recorded purge runs
orderctl archived ID   a purged order, read back from the archive
orderctl workflows     workflow versions, the orders on each, and whether this code may
                       be deployed over them (--check: exit 1 if not)
orderctl workflow-diff A B   what changed between two workflow versions
orderctl migrate       move orders in flight to another workflow version (dry run by default)

Remote mode: `orderctl --api-url URL` (or ORDERCTL_API_URL, or `--azd-env FILE` with `azd env
get-values` output) runs the operator commands over the operator HTTP API of a deployed app (or
of a local stack) instead of in process, with a function key (--function-key,
ORDERCTL_FUNCTION_KEY) and/or an Entra token (--entra, ORDERCTL_AUTH=entra; --scope,
ORDERCTL_SCOPE). Same output either way.

Every command takes --json (one document on stdout, shapes in docs/orderctl.md); tables take
--wide. Errors are one line on stderr with a non-zero exit code (2: fix the input or start the
stack; 1: something failed); --debug shows the traceback instead. `status --watch` and `submit
--wait` exit 0 when the order is Processed, 3 when it is in Error, 4 when the wait ran out.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from devstack.stack import processes
from devstack.stack.local_stack import (
    DEFAULT_WORKDIR,
    TELEMETRY_SETTING,
    LocalStack,
    StackInfo,
    telemetry_dir,
)
from devstack.stack.processes import REPO_ROOT, ServiceStartError
from orderctl import connection
from orderctl import views as views
from orderctl.app import (
    MODE,
    app,
    at_edge,
    confirm,
    console,
    emit,
    err_console,
    fail,
    output,
    validation_problems,
)
from orderctl.options import (
    OPERATOR,
    DryRun,
    Json,
    NewerThan,
    OlderThan,
    Operator,
    Reason,
    StepFilter,
    Telemetry,
    TelemetryDir,
    TextFilter,
    Wide,
    Workdir,
    Yes,
)
from orderctl.output import (
    ComponentView,
    DownView,
    FaultView,
    MigrateView,
    StackView,
    SubmitView,
    TraceSpanView,
    TraceTreeView,
    TraceView,
    WorkflowDiffView,
    WorkflowStepView,
    WorkflowsView,
    WorkflowVersionView,
    write_json,
    write_json_line,
)
from orderctl.plain_text import join_url, printable, text

if TYPE_CHECKING:
    from orderctl.backend import OperatorBackend

DEFAULT_API_PORT = 7071  # as `func start`
SUPERVISOR_LOG = "supervisor.log"
SUPERVISOR_PID = "supervisor.pid"
LOCK_FILE = "stack.lock"
DETACH_TIMEOUT_S = 240.0


# ------------------------------------------------------------------------------ the stack


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
    if name == "host-0":
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


# ------------------------------------------------------------------------- operator commands


@app.command()
@at_edge
async def submit(
    order_id: Annotated[str | None, typer.Option(help="default: a new unique id")] = None,
    item: Annotated[
        list[str] | None,
        typer.Option(help="SKU:QUANTITY:UNIT_PRICE_CENTS, repeatable [default: SKU-1:1:1999]"),
    ] = None,
    customer: str = "customer-1",
    currency: str = "EUR",
    workflow: str = "order",
    reply_to: Annotated[str | None, typer.Option(help="queue for status updates")] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait", help="return once the order is done: exit 0 Processed, 3 Error, 4 timeout"
        ),
    ] = False,
    timeout: Annotated[
        float, typer.Option(min=1, help="with --wait: seconds to wait at most")
    ] = 120.0,
    json_out: Json = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Submit one order to the running stack (--wait: and follow it until it is done)."""
    from devstack.orders import build_order, send_orders

    screen = output(json_out)
    info = connection.running_stack(workdir)
    try:
        order = build_order(
            order_id, item or ["SKU-1:1:1999"], customer, currency, workflow, reply_to
        )
    except ValidationError as error:
        raise fail(f"the order is not valid: {validation_problems(error)}", 2) from None
    except ValueError as error:
        raise fail(f"the order is not valid: {error}", 2) from None
    with client_span(info, order.order_id):
        await send_orders(info.settings, [order])
    view = SubmitView(
        order_id=order.order_id,
        workflow=order.workflow,
        total_cents=order.total_cents,
        currency=order.currency,
    )
    if not wait:
        emit(view, show_submitted, screen)
        return
    if not MODE.json:
        show_submitted(view, screen)
    async with connection.operations(workdir) as ops:
        followed = await follow_order(ops, order.order_id, timeout, screen, created=False)
    last = followed.last
    view = view.model_copy(
        update={
            "state": last.detail.order.state if last else None,
            "waited_s": round(followed.waited_s, 2),
            "order": last.detail.model_dump(mode="json") if last else None,
        }
    )
    if MODE.json:
        write_json(view)
    raise typer.Exit(finished(followed, screen))


async def follow_order(ops: OperatorBackend, order_id: str, timeout: float | None,
                       screen: Console, *, created: bool) -> Any:  # fmt: skip
    """Follow an order until it is done, printing each change (with --json in `status`: one
    WatchView per line). ``created``: it exists already (status), else it is on its way."""
    from orderctl.follow import follow

    first = [True]

    def show(view: Any) -> None:
        if MODE.json:
            if created:
                write_json_line(view)
            return
        if first[0] and created:
            show_order(view.detail, screen)
            screen.print(Text("following it (Ctrl-C stops)…", style="dim"))
        else:
            for entry in view.detail.timeline:
                screen.print(views.timeline_line(entry, MODE.wide))
        first[0] = False

    return await follow(
        lambda after, wait_s: ops.watch_order(order_id, after_seq=after, wait_s=wait_s),
        show,
        timeout=timeout,
        wait_for_creation=not created,
    )


def finished(followed: Any, screen: Console) -> int:
    """Say how a followed order ended (people only); its exit code."""
    from orderctl.follow import exit_code

    code = exit_code(followed)
    if not MODE.json:
        last = followed.last
        if followed.timed_out:
            state = last.detail.order.state if last else "not created yet"
            screen.print(text(f"still {state} after {followed.waited_s:.0f} s: gave up waiting"))
        else:
            assert last is not None
            order = last.detail.order
            style = "green" if code == 0 else "red"
            screen.print(Text.assemble(printable(order.order_id), ": ", (order.state, style)))
            screen.print(views.step_table(last.detail.steps, MODE.wide))
    return code


def show_submitted(view: SubmitView, screen: Console) -> None:
    screen.print(
        Text.assemble(
            "submitted ", (printable(view.order_id), "bold"), f" ({view.total_cents} ",
            printable(view.currency), ")",
        )
    )  # fmt: skip


@contextmanager
def client_span(info: StackInfo, order_id: str) -> Iterator[None]:
    """With the stack's telemetry on, send inside a CLIENT span written to its files: the
    order's trace then starts here, at the submission (the message carries its context)."""
    directory = info.settings.get(TELEMETRY_SETTING, "").strip()
    if not directory:
        yield
        return
    from opentelemetry.trace import SpanKind

    from adapters.telemetry import file_providers

    tracer_provider, meter_provider = file_providers(Path(directory), "orderctl")
    attributes = {"order.id": order_id, "messaging.destination.name": "orders"}
    try:
        tracer = tracer_provider.get_tracer("orderctl")
        with tracer.start_as_current_span("submit", kind=SpanKind.CLIENT, attributes=attributes):
            yield
    finally:
        tracer_provider.shutdown()  # written now: `orderctl trace` may run next
        meter_provider.shutdown()


@app.command()
@at_edge
async def status(
    order_id: str,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            "-w",
            help="follow it live until it is done (--json: one document per change, JSON "
            "lines); exit 0 Processed, 3 Error, 4 timeout",
        ),
    ] = False,
    timeout: Annotated[
        float | None, typer.Option(min=1, help="with --watch: seconds to follow at most")
    ] = None,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Show an order's state, steps (with how long each took, its attempts and why they
    failed) and timeline; --watch follows it until it is done."""
    screen = output(json_out, wide)
    async with connection.operations(workdir) as ops:
        if watch:
            followed = await follow_order(ops, order_id, timeout, screen, created=True)
        else:
            order = await ops.show_order(order_id)
    if not watch:
        emit(order, show_order, screen)
        return
    raise typer.Exit(finished(followed, screen))


def show_order(order: Any, screen: Console) -> None:
    """An order's state, steps and timeline (an OrderDetail)."""
    p = order.order
    screen.print(
        Text.assemble(
            (printable(p.order_id), "bold"),
            printable(
                f"  {p.state}  step {p.current_step} ({p.current_operation}), "
                f"generation {p.generation}, attempt {p.attempt}, failures {p.failure_count}, "
                f"locked by {p.locked_by or '-'}"
            ),
        )
    )
    if p.next_attempt_at:
        screen.print(Text(f"next attempt due {p.next_attempt_at:%H:%M:%S}"))
    if p.settling:
        screen.print(text(f"settling: an answer may still change {', '.join(p.settling)}"))
    if p.compensation_cause:
        since = f" since {p.compensating_since:%Y-%m-%d %H:%M:%S}" if p.compensating_since else ""
        why = p.compensation_reason or "-"
        screen.print(text(f"compensation ({p.compensation_cause}){since}: {why}"))
    if p.last_error:
        screen.print(text(f"last error: {p.last_error}"))
    screen.print(views.step_table(order.steps, MODE.wide))
    views.show_reasons(order.steps, screen, MODE.wide)
    events = Table("#", "at", "actor", "event", "from → to", "detail", title="timeline")
    for entry in order.timeline:
        events.add_row(
            str(entry.seq),
            entry.at.strftime("%H:%M:%S.%f")[:-3],
            text(entry.actor),
            text(entry.event),
            text(f"{entry.from_state or ''} → {entry.to_state}"),
            text(entry.detail),
        )
    screen.print(events)


@app.command()
@at_edge
async def orders(
    state: Annotated[
        str, typer.Argument(help="Pending, Processing, Compensating, Error or Processed")
    ],
    step: StepFilter = None,
    older_than: OlderThan = None,
    newer_than: NewerThan = None,
    text_: TextFilter = None,
    sort: Annotated[
        str,
        typer.Option(
            help="index (cheapest), id, created, updated; -created, -updated: newest first"
        ),
    ] = "index",
    limit: Annotated[int, typer.Option(min=1, max=100)] = 50,
    continuation: Annotated[str | None, typer.Option(help="from the previous page")] = None,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """List orders in a state, filtered by step, age and text, sorted, a page at a time (in
    flight: the active-order index; Error: the Error index; Processed: a bounded query of the
    orders table — docs/orderctl.md says what each costs)."""
    screen = output(json_out, wide)
    async with connection.operations(workdir) as ops:
        page = await ops.list_orders(
            state,
            step=step,
            older_than=older_than,
            newer_than=newer_than,
            text=text_,
            sort=sort,
            limit=limit,
            continuation=continuation,
        )
    emit(page, show_orders, screen)


def show_orders(page: Any, screen: Console) -> None:
    shown = ", ".join(f"{k} {v}" for k, v in page.filters.items())
    title = f"{page.state} orders" + (f" ({shown})" if shown else "")
    if page.sort != "index":
        title += f", by {page.sort}"
    table = Table(title=text(title))
    columns = ["order", "step", "created", "fail"]
    columns += ["updated", "attempt", "next attempt"] if MODE.wide else []
    for name in columns:
        table.add_column(name, no_wrap=True)
    table.add_column("last error", ratio=1)
    for o in page.items:
        row = [
            text(o.order_id),
            text(o.current_step or ""),
            f"{o.created_at:%m-%d %H:%M:%S}",
            str(o.failure_count),
        ]
        if MODE.wide:
            row += [
                f"{o.updated_at:%m-%d %H:%M:%S}",
                str(o.attempt),
                f"{o.next_attempt_at:%H:%M:%S}" if o.next_attempt_at else "",
            ]
        table.add_row(*row, text(o.last_error or "", width=60, wide=MODE.wide))
    screen.print(table)
    if page.partial:
        screen.print(
            text(f"sorted among the first {page.scanned} candidates only: narrow the filter")
        )
    if page.continuation:
        screen.print(text(f"more: --continuation {page.continuation}"))


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


StateFilter = Annotated[str | None, typer.Option("--state", help="only orders in this state")]
BulkLimit = Annotated[int, typer.Option(min=1, max=100, help="orders acted on at most")]


@app.command()
@at_edge
async def resubmit(
    order_id: Annotated[
        str | None, typer.Argument(help="the order; omit it to act on a filter's orders")
    ] = None,
    reason: Reason = "",
    state: StateFilter = None,
    step: StepFilter = None,
    older_than: OlderThan = None,
    newer_than: NewerThan = None,
    text_: TextFilter = None,
    dry_run: DryRun = False,
    yes: Yes = False,
    limit: BulkLimit = 100,
    operator: Operator = OPERATOR,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Resubmit an Error order: it resumes at the failed step (or finishes its compensation).
    Without ORDER_ID, every Error order the filter selects (listed first; asks to confirm)."""
    screen = output(json_out, wide)
    chosen = {"state": state, "step": step, "older_than": older_than,
              "newer_than": newer_than, "text": text_}  # fmt: skip
    async with connection.operations(workdir) as ops:
        if order_id is None:
            await act_on_matching(
                ops, "resubmit", chosen, reason, operator, dry_run, yes, limit, screen
            )
            return
        one_order(chosen, dry_run)
        done = await ops.resubmit(order_id, operator=operator, reason=reason)
    emit(done, show_action, screen)


@app.command()
@at_edge
async def cancel(
    order_id: Annotated[
        str | None, typer.Argument(help="the order; omit it to act on a filter's orders")
    ] = None,
    reason: Reason = "",
    state: StateFilter = None,
    step: StepFilter = None,
    older_than: OlderThan = None,
    newer_than: NewerThan = None,
    text_: TextFilter = None,
    dry_run: DryRun = False,
    yes: Yes = False,
    limit: BulkLimit = 100,
    operator: Operator = OPERATOR,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Cancel a Pending or Processing order at once: every step that may have taken effect (the
    one in flight too) is undone, then Error. Without ORDER_ID, every such order the filter
    selects (listed first; asks to confirm)."""
    screen = output(json_out, wide)
    chosen = {"state": state, "step": step, "older_than": older_than,
              "newer_than": newer_than, "text": text_}  # fmt: skip
    async with connection.operations(workdir) as ops:
        if order_id is None:
            await act_on_matching(
                ops, "cancel", chosen, reason, operator, dry_run, yes, limit, screen
            )
            return
        one_order(chosen, dry_run)
        done = await ops.cancel(order_id, operator=operator, reason=reason)
    emit(done, show_action, screen)


def one_order(chosen: dict[str, str | None], dry_run: bool) -> None:
    given = [f"--{name.replace('_', '-')}" for name, value in chosen.items() if value]
    if given or dry_run:
        options = ", ".join(given + (["--dry-run"] if dry_run else []))
        raise fail(f"{options} select orders by filter: give either an order id or a filter", 2)


async def act_on_matching(
    ops: OperatorBackend, action: str, chosen: dict[str, str | None], reason: str, operator: str,
    dry_run: bool, yes: bool, limit: int, screen: Console,
) -> None:  # fmt: skip
    """List what the filter selects; unless a dry run, confirm, then act on exactly those."""
    preview = await ops.bulk(
        action, operator=operator, reason=reason, dry_run=True, limit=limit, **chosen
    )
    if dry_run or not preview.items:
        emit(preview, views.show_bulk, screen, MODE.wide)
        return
    if not MODE.json:
        views.show_bulk(preview, screen, MODE.wide)
    confirm(f"{action} these {len(preview.items)} order(s)?", yes)
    done = await ops.bulk(
        action, operator=operator, reason=reason, limit=limit,
        order_ids=[item.order_id for item in preview.items], **chosen,
    )  # fmt: skip
    emit(done, views.show_bulk, screen, MODE.wide)


@app.command()
@at_edge
async def restart(
    order_id: str,
    from_step: Annotated[
        str, typer.Option("--from", help="the step to redo from, e.g. charge_payment")
    ],
    reason: Reason,
    operator: Operator = OPERATOR,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Restart an Error order from a step: that step and every later one are done again (new
    idempotency keys), even a result that was kept; the steps before it resume as a resubmit
    does. Recorded in the order's timeline with your name."""
    screen = output(json_out, wide)
    async with connection.operations(workdir) as ops:
        done = await ops.restart(order_id, step=from_step, operator=operator, reason=reason)
    emit(done, show_action, screen)


def show_action(done: Any, screen: Console) -> None:
    screen.print(text(f"{done.order_id}: {done.outcome} ({done.state})"))
    if done.detail:
        screen.print(text(done.detail, "dim"))


@app.command()
@at_edge
async def supervisor(
    json_out: Json = False, wide: Wide = False, workdir: Workdir = DEFAULT_WORKDIR
) -> None:
    """Show the Supervisor's lag, who sweeps which bucket, and the recovery bound."""
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
    if view.unswept_buckets:
        screen.print(
            Text.assemble(
                ("buckets not swept within the bound: ", "red"),
                ", ".join(str(b) for b in view.unswept_buckets),
            )
        )
    table = Table("bucket", "holder", "swept", "by", "lag s", "due", title="buckets")
    for b in view.buckets:
        table.add_row(
            str(b.bucket),
            text(b.holder or "-"),
            f"{b.swept_at:%H:%M:%S}" if b.swept_at else "never",
            text(b.swept_by or "-"),
            f"{b.lag_s:.1f}",
            str(b.due_found),
        )
    screen.print(table)


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


@app.command()
@at_edge
async def workflows(
    check: Annotated[
        bool, typer.Option("--check", help="exit 1 if this code drops a version orders need")
    ] = False,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Workflow versions: their steps, the orders on each, and whether this code may be
    deployed over the stored orders (the same check as the azd predeploy hook)."""
    from adapters.settings import Settings
    from devstack.orders import open_store
    from domain.workflows import WORKFLOWS
    from service.versions import check as verdict_of
    from service.versions import missing, versions_in_use

    screen = output(json_out, wide)
    info = connection.running_stack(workdir)
    settings = Settings.from_env(info.settings)
    async with open_store(info.settings) as store:
        in_use = await versions_in_use(store)
    ok, verdict = verdict_of(in_use, WORKFLOWS)
    view = WorkflowsView(
        versions=[
            WorkflowVersionView(
                ref=ref,
                current=settings.current_version(flow.name) == flow.version,
                steps=[
                    WorkflowStepView(
                        name=s.name,
                        agent=s.agent,
                        operation=s.operation,
                        undo_operation=s.undo_operation,
                    )
                    for s in flow.steps
                ],
                in_flight=in_use[ref].in_flight if ref in in_use else 0,
                in_error=in_use[ref].in_error if ref in in_use else 0,
            )
            for ref, flow in WORKFLOWS.items()
        ],
        needed_but_not_carried=[u.ref for u in missing(in_use, WORKFLOWS)],
        deployable=ok,
        verdict=verdict,
    )
    emit(view, show_workflows, screen)
    if check and not ok:
        raise typer.Exit(1)


def show_workflows(view: WorkflowsView, screen: Console) -> None:
    table = Table("version", "current", "steps (undo)", "in flight", "in Error", title="workflows")
    for v in view.versions:
        steps = " → ".join(f"{s.name} ({s.undo_operation or '-'})" for s in v.steps)
        table.add_row(
            text(v.ref), "yes" if v.current else "", text(steps), str(v.in_flight), str(v.in_error)
        )
    screen.print(table)
    screen.print(text(view.verdict, "" if view.deployable else "red"))


@app.command("workflow-diff")
def workflow_diff(
    old: Annotated[str, typer.Argument(help="a version, e.g. order@1")],
    new: Annotated[str, typer.Argument(help="another, e.g. order@2")],
    json_out: Json = False,
) -> None:
    """What changed between two workflow versions this code carries."""
    from domain.workflows import UnknownWorkflow, get_workflow
    from service.versions import diff

    screen = output(json_out)
    try:
        a, b = get_workflow(old), get_workflow(new)
    except UnknownWorkflow as error:
        raise fail(str(error), 2) from None
    view = WorkflowDiffView(old=a.ref, new=b.ref, changes=diff(a, b))
    emit(view, show_diff, screen)


@app.command()
@at_edge
async def migrate(
    from_ref: Annotated[str, typer.Option("--from", help="the version orders are on: order@1")],
    to_ref: Annotated[str, typer.Option("--to", help="the version to move them to: order@2")],
    reason: Reason,
    apply_: Annotated[
        bool, typer.Option("--apply", help="move them (without it: a dry run, nothing changes)")
    ] = False,
    operator: Operator = OPERATOR,
    json_out: Json = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Move the orders in flight on one workflow version to another, where the new version
    keeps every step they have reached (recorded in each order's timeline)."""
    from adapters.settings import Settings
    from service.migration import migrate as run_migration
    from service.runtime import Runtime

    screen = output(json_out)
    info = connection.running_stack(workdir)
    runtime = Runtime.from_settings(Settings.from_env(info.settings))
    try:
        report = await run_migration(
            runtime,
            from_ref,
            to_ref,
            actor=f"operator:{operator}",
            reason=reason,
            dry_run=not apply_,
        )
    except ValueError as error:
        raise fail(str(error), 2) from None
    finally:
        await runtime.close()
    view = MigrateView(
        from_ref=report.from_ref,
        to_ref=report.to_ref,
        dry_run=report.dry_run,
        examined=report.examined,
        migrated=report.migrated,
        refused=dict(report.refused),
    )
    emit(view, show_migrate, screen)


def show_migrate(view: MigrateView, screen: Console) -> None:
    done = "would move" if view.dry_run else "moved"
    screen.print(
        text(f"{view.from_ref} → {view.to_ref}: {view.examined} orders in flight, {done} "
             f"{view.migrated}" + (" (dry run: add --apply to move them)" if view.dry_run else ""))
    )  # fmt: skip
    for why, count in sorted(view.refused.items()):
        screen.print(text(f"  {count} stay: {why}"))


def show_diff(view: WorkflowDiffView, screen: Console) -> None:
    screen.print(text(f"{view.old} → {view.new}", "bold"))
    for change in view.changes or ["no change"]:
        screen.print(text(change))


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
    show_order(view.order, screen)


@app.command("dead-letters")
@at_edge
async def dead_letters(
    words: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[replay|purge] [QUEUE] [SEQ]...",
            help="a queue role (orders, responses, ...) to list its dead letters, all queues "
            "if omitted; `replay QUEUE` sends dead letters back to their queue, `purge QUEUE` "
            "removes them (name them by sequence number, or --all)",
            show_default=False,
        ),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="replay or purge every dead letter")] = False,
    dry_run: DryRun = False,
    yes: Yes = False,
    reason: Annotated[
        str,
        typer.Option(
            help="why (required to replay or purge): recorded in the timeline of the order "
            "each names and in the dead-letter log"
        ),
    ] = "",
    operator: Operator = OPERATOR,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Count dead letters per queue, show one queue's dead letters, or replay or purge them
    (recorded with --reason in the timeline of the order each names and in the dead-letter
    log; asks to confirm unless --yes)."""
    screen = output(json_out, wide)
    words = words or []
    action = words[0] if words and words[0] in ("replay", "purge") else None
    if action is None and (len(words) > 1 or all_ or dry_run):
        raise fail("to act on dead letters: dead-letters replay|purge QUEUE [SEQ]... [--all]", 2)
    async with connection.operations(workdir) as ops:
        if action is not None:
            await settle_dead_letters(
                ops, action, words[1:], all_, dry_run, yes, operator, reason, screen
            )
            return
        if not words:
            emit(await ops.dead_letter_summary(), show_dead_letter_counts, screen)
            return
        page = await ops.list_dead_letters(words[0])
    emit(page, show_dead_letters, screen)


async def settle_dead_letters(
    ops: OperatorBackend, action: str, words: list[str], everything: bool, dry_run: bool, yes: bool,
    operator: str, reason: str, screen: Console,
) -> None:  # fmt: skip
    """Say what a replay or purge would do; unless a dry run, confirm, then do it to those."""
    if not words:
        raise fail(f"say which queue: dead-letters {action} QUEUE [SEQ]... [--all]", 2)
    queue, numbers = words[0], words[1:]
    if not all(n.isascii() and n.isdigit() and len(n) < 19 for n in numbers):
        raise fail(f"dead letters are named by sequence number, not {numbers!r}", 2)
    act = ops.replay_dead_letters if action == "replay" else ops.purge_dead_letters
    chosen = [int(n) for n in numbers] or None
    preview = await act(
        queue, operator=operator, sequence_numbers=chosen, everything=everything, dry_run=True
    )
    ready = [i.sequence_number for i in preview.items if i.outcome.startswith("would_")]
    if dry_run or not ready:
        emit(preview, views.show_dead_letter_action, screen, MODE.wide)
        return
    if not MODE.json:
        views.show_dead_letter_action(preview, screen, MODE.wide)
    confirm(f"{action} these {len(ready)} dead letter(s)?", yes)
    done = await act(queue, operator=operator, sequence_numbers=ready, reason=reason)
    emit(done, views.show_dead_letter_action, screen, MODE.wide)


def show_dead_letter_counts(summary: Any, screen: Console) -> None:
    table = Table("queue", "entity", "dead letters", title="dead-letter queues")
    for q in summary.queues:
        table.add_row(text(q.queue), text(q.entity), f"{q.count}{'+' if q.more else ''}")
    screen.print(table)


def show_dead_letters(page: Any, screen: Console) -> None:
    table = Table(
        "#", "reason", "description", "body", title=text(f"dead letters of {page.entity}")
    )
    for item in page.items:
        body = item.body if item.body is not None else item.raw
        table.add_row(
            str(item.sequence_number),
            text(item.reason or ""),
            text(item.description or ""),
            text(body, width=80, wide=MODE.wide),
        )
    screen.print(table)


@app.command("dead-letter-log")
@at_edge
async def dead_letter_log(
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """List the dead-letter replays and purges operators ran (when, who, the queue, why, and
    what became of each message), newest first."""
    screen = output(json_out, wide)
    async with connection.operations(workdir) as ops:
        view = await ops.dead_letter_log(limit=limit)
    emit(view, views.show_dead_letter_log, screen, MODE.wide)


@app.command()
def fault(
    profile: Annotated[
        str | None,
        typer.Argument(
            help="clean, flaky, chaotic, stress or a profile file; omit to show what is in force"
        ),
    ] = None,
    decline_next: Annotated[
        int | None,
        typer.Option(
            "--decline-next",
            min=0,
            max=100_000,
            help="decline the next N forward calls of --service (0: stop declining)",
        ),
    ] = None,
    service: Annotated[
        str, typer.Option(help="with --decline-next: inventory, payment or shipping")
    ] = "payment",
    json_out: Json = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Show or choose the fault profile of the running stack's fake services, or make the next
    N payments (or reservations, shipments) be declined. It stays until changed again, a fake
    services process restarted by the stack included; a new stack starts from `up --profile`."""
    import httpx

    from devstack.fakes.profiles import SERVICE_NAMES, source_name
    from devstack.stack.local_stack import profile_path

    screen = output(json_out)
    info = connection.running_stack(workdir)
    change: dict[str, Any] = {}
    if profile is not None:
        connection.check_profile(profile)
        path = profile_path(profile)
        change |= {"profile": json.loads(path.read_text()), "source": source_name(path)}
    if decline_next is not None:
        if service not in SERVICE_NAMES:
            raise fail(f"--service {service!r}: one of {', '.join(SERVICE_NAMES)}", 2)
        change["decline_next"] = {"service": service, "count": decline_next}
    url = join_url(info.fakes_url, "_fault")
    try:
        answer = httpx.post(url, json=change, timeout=10) if change else httpx.get(url, timeout=10)
    except httpx.HTTPError as error:
        raise fail(
            f"cannot reach the fake services at {url} ({type(error).__name__}): see `orderctl ps`",
            1,
        ) from None
    if answer.status_code != 200:
        raise fail(f"the fake services refused it: {answer.text[:300]}", 2)
    view = FaultView(fakes_url=info.fakes_url, changed=bool(change), **answer.json())
    emit(view, views.show_fault, screen)


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


# ---------------------------------------------------------------------------------- traces


@app.command("trace")
def trace_order(
    order_id: Annotated[str, typer.Argument(help="the order whose spans to show")],
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            metavar="DIR",
            help="the telemetry files' directory [default: the stack's, WORKDIR/telemetry]",
            show_default=False,
        ),
    ] = None,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Print an order's spans as a tree, from its submission or intake to its last reply,
    across every queue hop, with durations. Reads the files `orderctl up --telemetry` (or
    `demo --telemetry`) has the hosts write; spans reach them within a few seconds."""
    from adapters.trace_files import build_traces, read_spans
    from domain.ids import InvalidId, validate_order_id

    screen = output(json_out, wide)
    try:
        validate_order_id(order_id)
    except InvalidId as error:
        raise fail(f"not an order id: {error}", 2) from None
    if directory is None:
        directory = telemetry_dir(workdir.resolve(), StackInfo.read(workdir.resolve()))
    if not directory.is_dir():
        raise fail(
            f"no telemetry directory {directory}: start the stack with `orderctl up "
            "--telemetry` (or `orderctl demo --telemetry`), run the order, then trace it; "
            "or name the directory with --dir",
            2,
        )
    spans = read_spans(directory, order_id)
    if not spans:
        raise fail(
            f"no spans for order {order_id} in {directory}: it ran without telemetry, or its "
            "spans are not written yet (hosts write them every 2 s). Telemetry is on for a "
            "stack started with `orderctl up --telemetry`",
            2,
        )
    view = trace_view(order_id, directory, build_traces(spans))
    emit(view, show_trace, screen)


def trace_view(order_id: str, directory: Path, traces: list[Any]) -> TraceView:
    from adapters.trace_files import origin

    def span_view(node: Any, start: Any) -> TraceSpanView:
        return TraceSpanView(
            name=node.name,
            kind=node.kind,
            role=node.span.role,
            start=node.start,
            offset_ms=round((node.start - start).total_seconds() * 1000, 3),
            duration_ms=round(node.duration.total_seconds() * 1000, 3),
            status=node.span.status,
            attributes=dict(node.attributes),
            orphan=node.orphan,
            children=[span_view(child, start) for child in node.children],
        )

    first = traces[0].start
    return TraceView(
        order_id=order_id,
        directory=str(directory),
        span_count=sum(1 for t in traces for root in t.roots for _ in root.walk()),
        traces=[
            TraceTreeView(
                trace_id=found.trace_id,
                start=found.start,
                offset_ms=round((found.start - first).total_seconds() * 1000, 3),
                duration_ms=round((found.end - found.start).total_seconds() * 1000, 3),
                why="" if n == 0 else origin(found),
                spans=[span_view(root, found.start) for root in found.roots],
            )
            for n, found in enumerate(traces)
        ],
    )


def show_trace(view: TraceView, screen: Console) -> None:
    from rich.tree import Tree

    many = len(view.traces) > 1
    screen.print(
        Text.assemble(
            "order ", (printable(view.order_id), "bold"), f": {view.span_count} spans",
            f" in {len(view.traces)} traces" if many else "", f" (from {view.directory})",
        )
    )  # fmt: skip
    if many:
        screen.print(
            Text(
                "its hops are in several traces, in time order below: each says why it is "
                "not part of the first",
                style="dim",
            )
        )
    for n, found in enumerate(view.traces):
        head = Text.assemble(
            (f"trace {found.trace_id}", "bold"),
            f"  {duration_text(found.duration_ms)}",
            (f"  +{found.offset_ms / 1000:.3f} s after the first" if n else "", "dim"),
        )
        screen.print()
        screen.print(head)
        if found.why:
            screen.print(Text(f"why a trace of its own: {printable(found.why)}", style="yellow"))
        for root in found.spans:
            tree = Tree(span_label(root), guide_style="dim")
            add_spans(tree, span_children(root))
            screen.print(tree)


def span_children(span: TraceSpanView) -> list[TraceSpanView]:
    """What hangs under ``span`` as printed: an invocation's app span (same name) is folded
    into its line, so its children are the invocation's."""
    inner = app_span(span)
    if inner is None:
        return span.children
    others = [c for c in span.children if c is not inner]
    return sorted(others + inner.children, key=lambda c: c.offset_ms)


def app_span(span: TraceSpanView) -> TraceSpanView | None:
    """The app's span under a host's invocation span (adapters.telemetry.consuming), if any."""
    if span.kind not in ("CONSUMER", "SERVER"):
        return None
    return next((c for c in span.children if c.name == span.name and c.kind == "INTERNAL"), None)


def add_spans(tree: Any, spans: list[TraceSpanView]) -> None:
    for span in spans:
        add_spans(tree.add(span_label(span)), span_children(span))


def span_label(span: TraceSpanView) -> Text:
    inner = app_span(span)
    shown = inner or span
    parts: list[Any] = [
        (f"+{span.offset_ms / 1000:.3f} s ", "dim"),
        (printable(span.name), "bold"),
        "  ",
        (duration_text(shown.duration_ms), "cyan"),
    ]
    if inner is not None:
        parts.append((f" (invocation {duration_text(span.duration_ms)})", "dim"))
    else:
        parts.append((f" {span.kind.lower()}", "dim"))
    queue = shown.attributes.get("messaging.destination.name")
    if queue:
        parts.append(f"  queue {printable(str(queue))}")
    if span.role and span.role != "host":
        parts.append((f"  [{printable(span.role)}]", "dim"))
    failed = next((s for s in (span, shown) if s.status == "ERROR"), None)
    if failed is not None:
        parts.append(("  failed", "bold red"))
    if span.orphan:
        parts.append(("  (its parent span was not found)", "yellow"))
    return Text.assemble(*parts)


def duration_text(ms: float) -> str:
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.1f} ms"


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
    output(to_stdout)
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
            console=err_console if to_stdout else console,
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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
