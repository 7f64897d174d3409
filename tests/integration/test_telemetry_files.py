"""Local telemetry end to end: the app in a real host process with TELEMETRY_DIR set, a
three-step order submitted with `orderctl submit`, then `orderctl trace` prints one tree from
the submission through intake, every agent and every reply, with durations; the metrics file
holds the order's metrics.

The host is a separate process (`python -m devstack.host`, as `orderctl up` starts it), so the
files are written by the exporters the app installs itself (adapters.telemetry.configure), flushed
periodically and at exit.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from adapters.store.rows import OrderNotFound
from devstack.stack import processes
from devstack.stack.local_stack import StackInfo, base_settings
from devstack.stack.processes import REPO_ROOT
from domain.agents import AGENTS
from domain.states import ProcessState
from orderctl.cli import app
from orderctl.output import validate
from tests.support.app import make_runtime

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

runner = CliRunner()
AGENT_FUNCTIONS = [agent.function_name for agent in AGENTS]


async def cli(*args: str) -> Any:
    """orderctl, on a thread: a command runs its own event loop (asyncio.run at its edge)."""
    return await asyncio.to_thread(runner.invoke, app, list(args), catch_exceptions=False)


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    timeout: float,
    what: str,
    why: Callable[[], object] = lambda: "",
) -> None:
    """Until ``predicate`` holds; past ``timeout`` s, fail naming ``what`` and ``why()``."""
    deadline = time.monotonic() + timeout
    while True:
        done = predicate()
        if inspect.isawaitable(done):
            done = await done
        if done:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what} {why()}".rstrip()
        await asyncio.sleep(0.2)


@pytest.fixture
async def stack(env: dict[str, str], azurite, tmp_path: Path) -> AsyncIterator[tuple[Path, Any]]:
    """The app in one host process writing telemetry to ``<workdir>/telemetry``, recorded in
    ``<workdir>/stack.json`` as `orderctl up --telemetry` records it."""
    rt = await make_runtime(env, "test")  # creates the tables
    workdir = tmp_path / "stack"
    workdir.mkdir()
    # A step budget no hop comes near on a loaded machine: a step past the shared 5 s would be
    # recovered by the Supervisor, and its trace would hold the recovery too.
    values, settings = write_settings(workdir, env, azurite, STEP_TIMEOUT_SECONDS="60")
    try:
        host = await start_host(workdir, settings, "host-0")
        try:
            record_stack(workdir, values, host)
            yield workdir, rt
        finally:
            stop_host(host)
    finally:
        await rt.close()


def write_settings(
    workdir: Path, env: dict[str, str], azurite: Any, **extra: str
) -> tuple[dict[str, str], Path]:
    """The hosts' settings (``env`` on this Azurite, telemetry to ``<workdir>/telemetry``, and
    ``extra``), written to ``<workdir>/local.settings.json``: the values and the file."""
    values = (
        base_settings()
        | env
        | {
            "AzureWebJobsStorage": azurite.connection_string,
            "TELEMETRY_DIR": str(workdir / "telemetry"),
            **extra,
        }
    )
    settings = workdir / "local.settings.json"
    settings.write_text(json.dumps({"IsEncrypted": False, "Values": values}))
    return values, settings


def record_stack(workdir: Path, values: dict[str, str], host: Any) -> None:
    """``<workdir>/stack.json``, naming ``host`` as host-0, for orderctl's ``--workdir``."""
    StackInfo(settings=values, fakes_url="", pids={"host-0": host.pid}).save(workdir / "stack.json")


async def submit(workdir: Path, kind: str) -> str:
    """An order submitted with `orderctl submit` to the stack in ``workdir``: its id."""
    order_id = f"ORD-{kind}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    submitted = await cli("submit", "--order-id", order_id, "--workdir", str(workdir))
    assert submitted.exit_code == 0, submitted.output
    return order_id


async def processed(rt: Any, order_id: str) -> bool:
    return await state(rt, order_id) is ProcessState.PROCESSED


async def state(rt: Any, order_id: str) -> ProcessState | None:
    try:
        return (await rt.store.load(order_id)).state
    except OrderNotFound:
        return None


def names(spans: list[Any]) -> list[str]:
    return [n for span in spans for n in [span.name, *names(span.children)]]


async def test_orderctl_trace_prints_the_whole_order_as_one_tree(stack) -> None:
    workdir, rt = stack
    order_id = await submit(workdir, "TRACE")
    await wait_until(lambda: processed(rt, order_id), 60, "Processed")

    expected = ["scheduler_intake", *AGENT_FUNCTIONS, "scheduler_replies"]

    async def whole() -> bool:
        result = await cli("trace", order_id, "--workdir", str(workdir), "--json")
        if result.exit_code != 0:
            return False
        view = validate("trace", json.loads(result.stdout))
        found = names([span for t in view.traces for span in t.spans])
        # Both spans of every hop (the invocation ends after the app's span: a flush may
        # write one before the other).
        hops = all(found.count(n) >= 2 for n in expected) and found.count("scheduler_replies") >= 6
        return hops and "submit" in found

    await wait_until(whole, 60, "every hop's spans in the files")  # written every 2 s

    result = await cli("trace", order_id, "--workdir", str(workdir), "--json")
    view = validate("trace", json.loads(result.stdout))
    assert len(view.traces) == 1, [t.why for t in view.traces]
    (root,) = view.traces[0].spans
    assert (root.name, root.kind, root.role) == ("submit", "CLIENT", "orderctl")
    found = names([root])
    # Each hop: the host's invocation span and the app's span inside it.
    assert found.count("scheduler_intake") == 2
    for function in AGENT_FUNCTIONS:
        assert found.count(function) == 2, found
    assert found.count("scheduler_replies") == 2 * 3

    def hops(span: Any, depth: int = 0) -> list[tuple[int, str]]:
        inner = [c for c in span.children if c.name == span.name and c.kind == "INTERNAL"]
        here = [(depth, span.name)] if span.kind == "CONSUMER" else []
        below = [c for c in span.children if c not in inner]
        below += [c for i in inner for c in i.children]
        return here + [h for c in below for h in hops(c, depth + 1)]

    chain = [name for _, name in hops(root)]
    first, second, third = AGENT_FUNCTIONS
    assert chain == [
        "scheduler_intake",
        first,
        "scheduler_replies",
        second,
        "scheduler_replies",
        third,
        "scheduler_replies",
    ], "each hop is a child of the previous one, across every queue"

    printed = await cli("trace", order_id, "--workdir", str(workdir), "--wide")
    assert printed.exit_code == 0, printed.output
    lines = printed.stdout.splitlines()
    assert f"order {order_id}: " in lines[0] and "traces" not in lines[0]
    for function in ["scheduler_intake", *AGENT_FUNCTIONS]:
        (line,) = [x for x in lines if f" {function} " in x]
        assert " ms (invocation " in line or " s (invocation " in line, line
    assert len([x for x in lines if " scheduler_replies " in x]) == 3


async def test_the_host_writes_the_order_metrics(stack) -> None:
    workdir, rt = stack
    order_id = await submit(workdir, "METRICS")
    await wait_until(lambda: processed(rt, order_id), 60, "Processed")

    def lines() -> list[dict]:
        return [
            json.loads(line)
            for path in (workdir / "telemetry").glob("metrics-host-*.jsonl")
            for line in path.read_text().splitlines()
        ]

    def recorded(name: str) -> float:
        return sum(r.get("value", r.get("count", 0)) for r in lines() if r["name"] == name)

    await wait_until(lambda: recorded("orders.finished") >= 1, 60, "the metrics flush (every 5 s)")
    assert recorded("orders.started") >= 1
    durations = [r for r in lines() if r["name"] == "step.duration"]
    steps = {r["attributes"]["step"] for r in durations}
    assert len(steps) == 3, durations
    assert all(r["type"] == "histogram" and r["unit"] == "s" for r in durations)
    assert any(r["name"] == "supervisor.tick.duration" for r in lines())


@pytest.mark.timeout(300)  # two hosts started, a deadline waited out, then the files
async def test_an_order_the_supervisor_recovers_is_still_one_tree(
    env: dict[str, str], azurite, tmp_path: Path
) -> None:
    """The first agent is not running when the order arrives: its request waits past
    CompleteBy, the Supervisor (a timer: no trace context) releases the order and sends its
    retry. Then the agent starts in a second host. `orderctl trace` prints one tree, with the
    Supervisor's recovery in it as a child of intake, and every hop after it below."""
    rt = await make_runtime(env, "test")
    workdir = tmp_path / "stack"
    workdir.mkdir()
    # A failure threshold that leaves time enough to start the second host.
    values, settings = write_settings(workdir, env, azurite, FAILURE_THRESHOLD="10")
    first, *others = AGENT_FUNCTIONS
    core = ["scheduler_intake", "scheduler_replies", "scheduler_commands", "supervisor"]
    hosts: list[Any] = []
    try:
        hosts.append(await start_host(workdir, settings, "host-0", [*core, *others]))
        record_stack(workdir, values, hosts[0])
        order_id = await submit(workdir, "RECOVER")

        async def released_by_supervisor() -> bool:
            timeline = await rt.store.get_timeline(order_id)
            return any(e.event == "released" and e.actor.startswith("supervisor") for e in timeline)

        await wait_until(released_by_supervisor, 60, "the Supervisor to release the order")
        hosts.append(await start_host(workdir, settings, "host-1", [first]))
        await wait_until(lambda: processed(rt, order_id), 90, "Processed")

        problems: list[str] = []

        async def complete() -> bool:
            view = await trace_view(workdir, order_id)
            problems[:] = recovery_problems(view, order_id, first)
            return not problems

        # The spans are written every 2 s.
        await wait_until(complete, 60, "every hop's spans in the files", lambda: problems)
        view = await trace_view(workdir, order_id)
    finally:
        for host in reversed(hosts):
            stop_host(host)
        await rt.close()

    assert not recovery_problems(view, order_id, first), view

    printed = await cli("trace", order_id, "--workdir", str(workdir))
    assert printed.exit_code == 0, printed.output
    assert "traces" not in printed.stdout.splitlines()[0]
    assert " supervisor_recover " in printed.stdout
    print(printed.stdout)  # with -s: the tree docs/telemetry.md shows


async def trace_view(workdir: Path, order_id: str) -> Any:
    """What `orderctl trace --json` prints of the order, None if it fails."""
    result = await cli("trace", order_id, "--workdir", str(workdir), "--json")
    return validate("trace", json.loads(result.stdout)) if result.exit_code == 0 else None


def recovery_problems(view: Any, order_id: str, first: str) -> list[str]:
    """What the trace of an order the Supervisor recovered lacks, by the design: one tree from
    the submission; each recovery a child of intake (the order's stored trace context); under a
    recovery, the retry it sent handled (the command, the ``first`` agent, its reply); and every
    hop that followed in the tree, down to the reply that finished the order.

    How many recoveries there are, and how many hops the first request made before the
    recovery, is timing (a loaded machine may recover a later step too, and the agent may or
    may not see the first request): none of it is asserted."""
    if view is None:
        return ["no trace"]
    if len(view.traces) != 1:
        return [f"{len(view.traces)} traces: {[t.why for t in view.traces]}"]
    roots = view.traces[0].spans  # a span whose parent is not written yet is a root of its own
    if len(roots) != 1:
        return [f"{len(roots)} roots: {[r.name for r in roots]}"]
    (root,) = roots
    if (root.name, root.role) != ("submit", "orderctl"):
        return [f"the root is {root.name} of {root.role}"]
    intakes = [s for s in find(root, "scheduler_intake") if s.kind == "INTERNAL"]
    if len(intakes) != 1:
        return [f"{len(intakes)} intake spans in {names([root])}"]
    (intake,) = intakes
    recoveries = find(root, "supervisor_recover")
    problems = []
    if not recoveries:
        problems.append("no supervisor_recover span")
    if not all(r in intake.children for r in recoveries):
        problems.append("a recovery does not hang under intake")
    if not all(r.attributes.get("order.id") == order_id for r in recoveries):
        problems.append("a recovery names another order")
    retried = [
        agent
        for recovery in recoveries
        for command in find(recovery, "scheduler_commands")
        for agent in find(command, first)
    ]
    if not any(find(agent, "scheduler_replies") for agent in retried):
        problems.append(f"no retry of {first} handled under a recovery: {names([intake])}")
    *_, last = AGENT_FUNCTIONS
    if not any(find(agent, "scheduler_replies") for agent in find(intake, last)):
        problems.append(f"the last step's reply is not in the tree: {names([intake])}")
    return problems


def find(span: Any, name: str) -> list[Any]:
    """``span`` and the spans below it named ``name``."""
    here = [span] if span.name == name else []
    return here + [s for c in span.children for s in find(c, name)]


async def start_host(
    workdir: Path, settings: Path, name: str, functions: list[str] | None = None
) -> Any:
    """A host process (as `orderctl up` starts one) running ``functions`` (None: all of them),
    started (its log says so)."""
    argv = [
        sys.executable, "-m", "devstack.host", "--settings", str(settings),
        "--concurrency", "2", "--http-port", "-1",
    ]  # fmt: skip
    if functions is not None:
        argv += ["--functions", ",".join(functions)]
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("APPLICATIONINSIGHTS_CONNECTION_STRING", "TELEMETRY_DIR")
    }
    environ |= {"PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    log = workdir / f"{name}.log"
    host = processes.spawn(argv, log_path=log, cwd=REPO_ROOT, env=environ)
    try:
        await wait_until(lambda: "host started" in log.read_text(), 60, f"{name} to start")
    except BaseException:
        processes.stop(host)
        raise
    return host


def stop_host(host: Any) -> None:
    """SIGTERM to the host (it flushes its telemetry files at exit), up to 20 s to end; then
    its process group is stopped whatever happened."""
    host.send_signal(signal.SIGTERM)
    try:
        host.wait(timeout=20)
    finally:
        processes.stop(host)
