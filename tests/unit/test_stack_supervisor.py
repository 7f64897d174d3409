"""Supervising the local stack: the restart policy (pure) and the loop over a fake stack."""

from __future__ import annotations

import os
import sys

import pytest

from devstack.stack.local_stack import LocalStack
from devstack.stack.processes import ServiceStartError
from devstack.stack.restart_policy import (
    RestartPolicy,
    Watch,
    dependents,
    exited,
    restart_failed,
    restarted,
)
from devstack.stack.supervisor import StackSupervisor, describe_exit

pytestmark = pytest.mark.anyio

POLICY = RestartPolicy(base_s=0.5, factor=2, max_s=30, stable_s=30)


def test_the_delay_doubles_with_each_failure_in_a_row_up_to_the_cap():
    assert [POLICY.delay(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert POLICY.delay(0) == 0


def test_a_crash_loop_backs_off_and_a_stable_run_is_forgiven():
    watch = Watch(started_at=0)
    watch = exited(watch, now=1, policy=POLICY)
    assert (watch.failures, watch.restart_at) == (1, 1.5) and watch.down
    assert not watch.due(1.4) and watch.due(1.5)
    watch = restarted(watch, now=1.5)
    assert not watch.down and watch.restarts == 1
    watch = exited(watch, now=3, policy=POLICY)  # died 1.5 s after its restart
    assert (watch.failures, watch.restart_at) == (2, 4)
    watch = restart_failed(watch, now=4, policy=POLICY)
    assert (watch.failures, watch.restart_at) == (3, 6)
    watch = exited(restarted(watch, now=6), now=6 + 30, policy=POLICY)  # ran 30 s: healthy
    assert (watch.failures, watch.restart_at, watch.restarts) == (1, 36.5, 2)


def test_a_restarted_broker_takes_the_hosts_with_it():
    names = ["azurite", "broker", "fakes", "host-0", "host-1"]
    assert dependents("broker", names) == ["host-0", "host-1"]
    assert dependents("azurite", names) == [] and dependents("host-0", names) == []


class FakeStack:
    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.codes: dict[str, int | None] = dict.fromkeys(names)
        self.broken: set[str] = set()
        self.restarts: list[str] = []

    def components(self) -> list[str]:
        return self.names

    def exit_code(self, name: str) -> int | None:
        return self.codes[name]

    async def restart(self, name: str) -> int:
        if name in self.broken:
            raise ServiceStartError(f"{name} did not start:\nlast lines of its log")
        self.restarts.append(name)
        self.codes[name] = None
        return 1000 + len(self.restarts)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def rig():
    stack = FakeStack(["azurite", "broker", "fakes", "host-0"])
    clock = Clock()
    events = []
    supervisor = StackSupervisor(stack, report=events.append, policy=POLICY, clock=clock)
    return stack, clock, events, supervisor


async def test_a_dead_host_is_restarted_after_the_delay_and_each_event_is_reported(rig):
    stack, clock, events, supervisor = rig
    await supervisor.check()
    assert events == [] and stack.restarts == []
    stack.codes["host-0"] = -9
    await supervisor.check()
    assert [(e.component, e.kind) for e in events] == [("host-0", "exited")]
    assert "killed by SIGKILL; restarting in 0.5 s (failure 1 in a row)" in events[0].line()
    assert stack.restarts == []  # not before its delay
    clock.now += 0.5
    await supervisor.check()
    assert stack.restarts == ["host-0"]
    assert events[-1].kind == "restarted" and "PID 1001 (restart 1)" in events[-1].detail


async def test_a_restart_that_fails_is_retried_later_with_a_longer_delay(rig):
    stack, clock, events, supervisor = rig
    stack.codes["fakes"] = 1
    stack.broken.add("fakes")
    await supervisor.check()
    clock.now += 0.5
    await supervisor.check()
    failed = events[-1]
    assert failed.kind == "restart_failed"
    assert (
        failed.detail
        == "fakes did not start (see its log); restarting in 1.0 s (failure 2 in a row)"
    )
    stack.broken.clear()
    clock.now += 0.9
    await supervisor.check()
    assert stack.restarts == []
    clock.now += 0.1
    await supervisor.check()
    assert stack.restarts == ["fakes"]


async def test_a_restarted_broker_restarts_the_hosts_too(rig):
    stack, clock, _, supervisor = rig
    stack.codes["broker"] = -15
    await supervisor.check()
    clock.now += 1
    await supervisor.check()
    assert stack.restarts == ["broker", "host-0"]
    assert supervisor.watches["host-0"].restarts == 1


def test_exits_are_described_by_signal_or_code():
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-99) == "killed by signal 99"


async def test_a_paused_host_is_not_taken_for_dead(tmp_path):
    stack = LocalStack(tmp_path, hosts=1)
    stack._spawn("host-0", [sys.executable, "-c", "import time; time.sleep(60)"], os.environ.copy())
    restarts: list[str] = []

    async def restart(name: str) -> int:
        restarts.append(name)
        return 0

    stack.restart = restart  # type: ignore[method-assign]
    try:
        stack.pause_host(0)
        await StackSupervisor(stack, report=lambda event: None, policy=POLICY).check()
        assert restarts == [] and stack.exit_code("host-0") is None
        assert stack.paused == {0}
    finally:
        stack.stop()  # resumes it first, so that it stops gracefully
    assert stack.paused == set()
