"""The local stack's own bookkeeping of its host processes (no Azurite, broker or host run)."""

from __future__ import annotations

import sys

import pytest

from devstack.stack.local_stack import LocalStack, StackInfo

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)  # stands in for a host"]


@pytest.fixture
def stack(tmp_path, monkeypatch):
    """A stack whose hosts are sleepers: what restart_host and stop do with them is real."""
    stack = LocalStack(tmp_path, hosts=1)
    stack.info = StackInfo(settings={}, fakes_url="")

    def start_sleeper(n: int) -> None:
        stack._spawn(f"host-{n}", SLEEPER, {})

    monkeypatch.setattr(stack, "_start_host", start_sleeper)
    yield stack
    stack.stop()


def test_restarting_a_live_host_stops_it_first_and_stop_stops_the_new_one(stack):
    stack.restart_host(0)
    first = stack._children["host-0"]
    stack.restart_host(0)
    second = stack._children["host-0"]

    assert second.pid != first.pid
    assert first.poll() is not None, "the first host was left running, unknown to the stack"
    assert second.poll() is None
    stack.stop()
    assert second.poll() is not None


def test_a_killed_host_restarts(stack):
    stack.restart_host(0)
    killed = stack._children["host-0"]
    stack.kill_host(0)
    stack.restart_host(0)
    assert killed.poll() is not None and stack._children["host-0"].poll() is None
