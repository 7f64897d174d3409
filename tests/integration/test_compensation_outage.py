"""Compensation outlasts our own outage, end to end: the app in two host processes, the
inventory agent alone in one of them. An order's charge is declined, so its reservation must
be released, and that host is frozen (SIGSTOP of its process group) for more undo deadlines
than the failure threshold allows a step. The Supervisor releases each unanswered undo and the
Scheduler retries it; nothing gives up. Once the host is resumed (SIGCONT), the release is
carried out, the order ends in Error with its reservation undone and exactly one terminal
alert, and the attempts the frozen host took up late are recorded as failures on our side.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from devstack.orders import send_orders
from devstack.stack import processes
from devstack.stack.local_stack import base_settings
from devstack.stack.processes import REPO_ROOT
from domain.agents import AGENTS
from domain.order import COMPENSATION_DELAYED, TERMINAL_ALERT_REASONS, Failures, Order, StepState
from domain.states import ProcessState
from service.runtime import Runtime
from tests.support.app import make_runtime
from tests.support.pattern import alerts_for, net_effects, new_order

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(400),
]

FROZEN_DEADLINES = 3
"""Undo attempts released unanswered while the inventory agent's host is frozen: the failure
threshold (3), at which compensation used to give up and leave the reservation in place."""
SETTINGS = {
    # A run budget the payment agent's 1.5 s call fits in with room to spare on a loaded
    # machine (a call cut short would be a timeout, not the decline under test).
    "STEP_TIMEOUT_SECONDS": "4",
    "STEP_QUEUE_SECONDS": "1",  # CompleteBy: 5 s after each claim
    "COMPENSATION_WARN_AFTER_SECONDS": "12",
}
CORE_FUNCTIONS = ["scheduler_intake", "scheduler_replies", "scheduler_commands", "supervisor"]


async def wait_for(condition: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := await condition():
            return found
        await asyncio.sleep(0.05)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture
async def app(
    env: dict[str, str], azurite, tmp_path: Path
) -> AsyncIterator[tuple[Runtime, dict, dict]]:
    """The app in two hosts: the inventory agent alone in ``hosts["inventory"]``, everything
    else it needs in ``hosts["core"]``; a runtime on the same tables and queues, and the app
    settings. Each host is stopped at the end, resumed first."""
    env |= SETTINGS
    rt = await make_runtime(env, "test")  # creates the tables
    values = base_settings() | env | {"AzureWebJobsStorage": azurite.connection_string}
    settings = tmp_path / "local.settings.json"
    settings.write_text(json.dumps({"IsEncrypted": False, "Values": values}))
    inventory = next(a.function_name for a in AGENTS if a.name == "inventory")
    others = [a.function_name for a in AGENTS if a.name != "inventory"]
    hosts: dict[str, Any] = {}
    try:
        hosts["core"] = await start_host(tmp_path, settings, [*CORE_FUNCTIONS, *others], "core")
        hosts["inventory"] = await start_host(tmp_path, settings, [inventory], "inventory")
        yield rt, hosts, values
    finally:
        for host in hosts.values():
            os.killpg(host.pid, signal.SIGCONT)  # a frozen host cannot stop
            processes.stop(host)
        await rt.close()


async def start_host(workdir: Path, settings: Path, functions: list[str], name: str) -> Any:
    argv = [
        sys.executable, "-m", "devstack.host", "--settings", str(settings),
        "--concurrency", "2", "--http-port", "-1", "--functions", ",".join(functions),
    ]  # fmt: skip
    environ = {k: v for k, v in os.environ.items() if k != "APPLICATIONINSIGHTS_CONNECTION_STRING"}
    environ |= {"PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    log = workdir / f"host-{name}.log"
    host = processes.spawn(argv, log_path=log, cwd=REPO_ROOT, env=environ)

    async def started() -> bool:
        return "host started" in log.read_text()

    try:
        await wait_for(started, 60, f"host {name} to start")
    except BaseException:
        processes.stop(host)
        raise
    return host


async def undo_releases(rt: Runtime, order_id: str) -> int:
    """Undo attempts released without success so far; fails the test if compensation ended."""
    order = await rt.store.load(order_id)
    if order.state is ProcessState.ERROR:
        pytest.fail(f"compensation ended while the agent's host was frozen: {order.last_error}")
    return sum(
        1
        for entry in await rt.store.get_timeline(order_id)
        if entry.event == "released" and entry.from_state is ProcessState.COMPENSATING
    )


async def test_a_frozen_agent_host_delays_the_undo_but_leaves_nothing_in_place(app, fakes, reader):
    rt, hosts, settings = app
    order = new_order()
    oid = order.order_id
    # The charge is declined slowly: time enough to freeze the host after the reservation.
    payment = {"decline_order_ids": [oid], "latency": {"fixed_ms": 1500}}
    fakes.set_profile({"services": {"payment": payment}})
    await send_orders(settings, [order])

    async def reserved() -> bool:
        return await exists(rt, oid) and (
            (await rt.store.load(oid)).step("reserve_inventory").state is StepState.SUCCEEDED
        )

    async def timed_out() -> bool:
        return await undo_releases(rt, oid) >= FROZEN_DEADLINES

    async def warned() -> bool:
        return (await rt.store.load(oid)).compensation_warned

    async def finished() -> Order | None:
        o = await rt.store.load(oid)
        return o if o.state.terminal else None

    async def failed_on_our_side() -> Failures | None:
        f = (await rt.store.load(oid)).step("reserve_inventory").undo_failures
        return f if f.on_our_side else None

    await wait_for(reserved, 30, "the reservation")
    os.killpg(hosts["inventory"].pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    await wait_for(timed_out, 120, "undo attempts to time out")
    await wait_for(warned, 30, "the warning")
    os.killpg(hosts["inventory"].pid, signal.SIGCONT)
    frozen_s = time.monotonic() - frozen_at

    done: Order = await wait_for(finished, 60, "the order to finish")
    story = await timeline(rt, oid)
    assert done.state is ProcessState.ERROR and done.compensation_cause == "step_declined", story
    assert "compensated: undid reserve_inventory" in (done.last_error or ""), done.last_error
    assert net_effects(fakes, oid) == {"inventory": 0}, "the reservation is released"
    alerts = alerts_for(rt, reader, oid)
    terminal = [a for a in alerts if a["reason"] in TERMINAL_ALERT_REASONS]
    assert [a["reason"] for a in terminal] == ["step_declined"]
    warnings = [a for a in alerts if a["reason"] == COMPENSATION_DELAYED]
    assert [a["severity"] for a in warnings] == ["warning"]
    # The undo never reached the service while the host was frozen: once it woke, it took up
    # what it held after the deadlines and said so.
    failures = await wait_for(failed_on_our_side, 30, "the late answers of the frozen host")
    assert failures.at_service == 0, failures
    print(f"frozen {frozen_s:.1f} s; undo failures: {failures}")


async def exists(rt: Runtime, order_id: str) -> bool:
    return await rt.store.find(order_id) is not None


async def timeline(rt: Runtime, order_id: str) -> str:
    return "\n".join(
        f"{e.at.time()} {e.actor} {e.event}: {e.detail}"
        for e in await rt.store.get_timeline(order_id)
    )
