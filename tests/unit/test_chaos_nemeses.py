"""The chaos run's nemesis schedule (benchmarks/nemeses.py) against a stand-in stack: what
each nemesis does when, what it spares, and what the run's JSON records."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from adapters.settings import Settings
from benchmarks.nemeses import (
    FIRST_BROKER_S,
    FIRST_PAUSE_S,
    WAKE_GRACE_S,
    Nemeses,
    parse_nemeses,
    pause_seconds,
    skew_offsets,
)
from devstack.faults.storage_proxy import FaultRates
from devstack.servicebus.config import load_queues
from devstack.stack.broker import DEFAULT_CONFIG
from devstack.stack.local_stack import LocalStack, base_settings
from orderctl.demo import QUICK_SETTINGS

pytestmark = pytest.mark.anyio


@dataclass
class StandInStack:
    hosts: int = 2
    clock_offsets: dict[int, int] = field(default_factory=dict)
    storage_faults: FaultRates | None = None
    paused: set[int] = field(default_factory=set)
    done: list[str] = field(default_factory=list)

    def pause_host(self, n: int) -> None:
        self.paused.add(n)
        self.done.append(f"pause {n}")

    def resume_host(self, n: int) -> None:
        self.paused.discard(n)
        self.done.append(f"resume {n}")

    def kill_host(self, n: int) -> None:
        self.done.append(f"kill {n}")

    def restart_host(self, n: int) -> None:
        self.done.append(f"start {n}")

    async def restart(self, name: str) -> int:
        self.done.append(f"restart {name}")
        return 1

    def reset_broker_connections(self) -> None:
        self.done.append("reset broker connections")


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def nemeses(chosen: str, stack: StandInStack, clock: Clock) -> Nemeses:
    return Nemeses(
        stack,  # type: ignore[arg-type]
        parse_nemeses(chosen),
        random.Random(1),
        kill_every=(3.0, 7.0),
        pause_s=65.0,
        started=clock.now,
        clock=clock,
    )


def test_nemeses_are_parsed_once_each_and_unknown_ones_refused():
    assert parse_nemeses("kill, pause,kill") == ("kill", "pause")
    with pytest.raises(ValueError, match=r"unknown nemesis.*'nap'.*pause,skew,storage,broker,kill"):
        parse_nemeses("pause,nap")
    with pytest.raises(ValueError, match="unknown nemesis"):
        parse_nemeses(" , ")


def test_skewed_clocks_alternate_ahead_and_behind_within_the_maximum():
    offsets = skew_offsets(random.Random(3), 4, 10)
    assert [o > 0 for o in offsets.values()] == [True, False, True, False]
    assert all(5 <= abs(o) <= 10 for o in offsets.values())
    assert offsets == skew_offsets(random.Random(3), 4, 10), "the seed's alone"


def test_a_pause_outlasts_the_locks_and_the_supervisor_lease():
    settings = Settings.from_env(base_settings() | QUICK_SETTINGS)
    assert settings.supervisor_lease.total_seconds() < 60
    assert pause_seconds(settings) == 60 + 5, "the broker's 60 s locks, and a margin"


def test_a_stack_with_short_locks_gives_its_broker_them_and_pauses_past_them(tmp_path):
    settings = Settings.from_env(base_settings() | QUICK_SETTINGS)
    assert LocalStack(tmp_path).broker_config() == DEFAULT_CONFIG
    config = LocalStack(tmp_path, lock_seconds=20).broker_config()
    queues, defaults = load_queues([config]), load_queues([DEFAULT_CONFIG])
    assert queues.keys() == defaults.keys()
    assert {q.lock_duration.total_seconds() for q in queues.values()} == {20}
    assert [q.max_delivery_count for q in queues.values()] == [
        q.max_delivery_count for q in defaults.values()
    ], "only the locks change"
    assert pause_seconds(settings, config) == 20 + 5


async def test_a_pause_ends_after_its_time_and_the_run_waits_for_the_woken_host(tmp_path):
    stack, clock = StandInStack(), Clock(1000.0)
    chaos = nemeses("pause", stack, clock)
    clock.now += FIRST_PAUSE_S
    await chaos.act(orders_pending=True)
    (paused,) = stack.paused
    assert not chaos.quiet()
    clock.now += 64.0
    await chaos.act(orders_pending=False)
    assert stack.paused == {paused}, "not yet"
    clock.now += 2.0
    await chaos.act(orders_pending=False)
    assert stack.paused == set() and stack.done == [f"pause {paused}", f"resume {paused}"]
    clock.now += WAKE_GRACE_S - 1
    assert not chaos.quiet()
    clock.now += 1
    assert chaos.quiet()
    (event,) = chaos.report(tmp_path)["events"]
    assert (event["nemesis"], event["target"], event["params"]) == (
        "pause",
        f"host-{paused}",
        {"seconds": 65.0},
    )
    assert (event["start_s"], event["end_s"]) == (FIRST_PAUSE_S, FIRST_PAUSE_S + 66.0)
    assert chaos.paused_around(1000.0 + FIRST_PAUSE_S + 66.0 + 2.0), "its locks may show late"
    assert not chaos.paused_around(1000.0 + FIRST_PAUSE_S - 1)


async def test_a_kill_spares_a_paused_host_and_the_last_one_running_beside_it():
    stack, clock = StandInStack(), Clock(1000.0)
    chaos = nemeses("pause,kill", stack, clock)
    clock.now += FIRST_PAUSE_S
    await chaos.act(orders_pending=True)
    assert len(stack.paused) == 1 and not any(d.startswith("kill") for d in stack.done)
    stack3, clock3 = StandInStack(hosts=3, paused={0}), Clock(1000.0)
    chaos3 = nemeses("kill", stack3, clock3)
    clock3.now += 2.0
    await chaos3.act(orders_pending=True)
    assert stack3.done in (["kill 1", "start 1"], ["kill 2", "start 2"])


async def test_the_broker_is_restarted_and_its_connections_dropped_in_turn(tmp_path):
    stack, clock = StandInStack(), Clock(0.0)
    chaos = nemeses("broker", stack, clock)
    clock.now = FIRST_BROKER_S
    await chaos.act(orders_pending=True)
    clock.now = 10_000.0
    await chaos.act(orders_pending=True)
    assert stack.done == ["restart broker", "reset broker connections"]
    clock.now = 20_000.0
    await chaos.act(orders_pending=False)
    assert len(stack.done) == 2, "nothing new once the orders are done"
    counts = chaos.report(tmp_path)["counts"]
    assert (counts["broker_restarts"], counts["broker_connection_resets"]) == (1, 1)


def test_skew_and_storage_are_recorded_for_the_whole_run(tmp_path):
    rates = FaultRates(throttle=0.1)
    stack = StandInStack(clock_offsets={0: 7, 1: -6}, storage_faults=rates)
    chaos = nemeses("skew,storage", stack, Clock(0.0))
    chaos.finish()
    events = chaos.report(tmp_path)["events"]
    assert [(e["nemesis"], e["target"], e["params"]) for e in events] == [
        ("skew", "host-0", {"offset_s": 7}),
        ("skew", "host-1", {"offset_s": -6}),
        (
            "storage",
            "hosts -> Azurite tables",
            {"throttle": 0.1, "timeout": 0.0, "error": 0.0, "reset": 0.0},
        ),
    ]
    assert all(e["end_s"] is not None for e in events)
    assert chaos.report(tmp_path)["counts"]["skewed_hosts"] == {"host-0": 7, "host-1": -6}
    assert not any(chaos.paused_around(t) for t in (0.0, 1000.0, 2000.0))
