"""The clock shim the chaos run's ``skew`` nemesis relies on (devstack.faults.clock), checked
in a throwaway interpreter before anything trusts it: the wall clock is offset, the monotonic
clock is not, and every kind of wait a host does still takes its time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from devstack.faults import clock

pytestmark = pytest.mark.skipif(
    clock.library() is None, reason=f"datefudge is not installed: {clock.INSTALL_HINT}"
)

WAIT_S = 0.3
PROBE = textwrap.dedent(
    f"""
    import asyncio, contextlib, json, queue, selectors, threading, time
    from datetime import UTC, datetime

    def timed(wait):
        started = time.monotonic()
        wait()
        return time.monotonic() - started

    def condition_wait():
        condition = threading.Condition()
        with condition:
            condition.wait({WAIT_S})

    def queue_get():
        with contextlib.suppress(queue.Empty):
            queue.Queue().get(timeout={WAIT_S})

    async def asyncio_sleep():
        await asyncio.sleep({WAIT_S})

    async def asyncio_wait_for():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), {WAIT_S})

    waits = {{
        "time.sleep": timed(lambda: time.sleep({WAIT_S})),
        "Event.wait": timed(lambda: threading.Event().wait({WAIT_S})),
        "Condition.wait": timed(condition_wait),
        "Queue.get": timed(queue_get),
        "select": timed(lambda: selectors.DefaultSelector().select({WAIT_S})),
        "asyncio.sleep": timed(lambda: asyncio.run(asyncio_sleep())),
        "asyncio.wait_for": timed(lambda: asyncio.run(asyncio_wait_for())),
    }}
    print(json.dumps({{
        "time": time.time(),
        "datetime": datetime.now(UTC).timestamp(),
        "time_ns": time.time_ns() / 1e9,
        "monotonic": time.monotonic(),
        "waits": waits,
    }}))
    """
)


def probe(offset_s: int) -> tuple[dict, float, float, float, float]:
    """Run the probe skewed by ``offset_s``; also this process's wall and monotonic clocks
    just before and just after it ran."""
    env = clock.skewed_environment(os.environ, offset_s)
    wall_before, mono_before = time.time(), time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    wall_after, mono_after = time.time(), time.monotonic()
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), wall_before, wall_after, mono_before, mono_after


@pytest.mark.parametrize("offset_s", [30, -30])
def test_the_wall_clock_is_offset_and_nothing_else(offset_s):
    """A wait that read the skewed wall clock would end at once or take the offset more; one
    that keeps its time takes WAIT_S, and a loaded machine adds far less than half the offset."""
    seen, wall_before, wall_after, mono_before, mono_after = probe(offset_s)
    for wall in ("time", "datetime", "time_ns"):
        assert wall_before + offset_s <= seen[wall] <= wall_after + offset_s, wall
    assert mono_before <= seen["monotonic"] <= mono_after, "the monotonic clock must not move"
    for wait, took in seen["waits"].items():
        assert WAIT_S - 0.01 <= took < WAIT_S + abs(offset_s) / 2, f"{wait} took {took:.3f} s"


def test_the_offset_adds_to_a_preload_already_there():
    env = clock.skewed_environment({"LD_PRELOAD": "/lib/other.so"}, -3)
    assert env["LD_PRELOAD"].split(":") == [clock.library(), "/lib/other.so"]
    assert env["DATEFUDGE"] == "3", "datefudge subtracts its value from the wall clock"
