"""The chaos run's nemeses: what each does to the local stack, when, and a record of it.

``python -m benchmarks.chaos --nemesis pause,skew,storage,broker,kill`` (any subset; default
``kill``):

- ``kill``: SIGKILL a host every ``kill_min``-``kill_max`` s and start it again; never a paused
  one (it would end the pause early), nor the last one running beside a paused one: with every
  host down at once for the length of a pause, no order could finish within the recovery bound,
  which allows for one host restart, and the run would measure the schedule, not the app;
- ``pause``: SIGSTOP one host's process group for longer than its message locks and its
  Supervisor leases (:func:`pause_seconds`, read from the broker's entity config and the
  settings), then SIGCONT; the next pause 10-30 s after;
- ``skew``: each host runs with its own wall-clock offset, whole seconds up to ``skew_max``,
  alternately ahead and behind (so two hosts disagree by up to twice that), for the whole run
  and across its restarts (devstack.faults.clock);
- ``storage``: the storage proxy between the hosts and Azurite's tables, injecting throttling,
  timeouts and 500s after applied writes and connection resets at the given rates, for the
  whole run (devstack.faults.storage_proxy);
- ``broker``: every 8-16 s, alternately restart the broker (its data directory kept, so its
  messages survive) and drop every client connection (the broker's SIGUSR1).

Every action is an :class:`Event` (nemesis, target, start and end, parameters) in the run's
JSON, with the counts: kills, pauses, skewed hosts and their offsets, storage faults by kind,
broker restarts and connection resets.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from adapters.settings import Settings
from devstack.servicebus.config import load_queues
from devstack.stack.broker import DEFAULT_CONFIG
from devstack.stack.local_stack import STORAGE_PROXY_STATS, LocalStack

NEMESES = ("pause", "skew", "storage", "broker", "kill")
DEFAULT_STORAGE_RATES = "throttle=0.03,timeout=0.003,error=0.01,reset=0.01"
PAUSE_MARGIN_S = 5.0  # beyond the longest lock or lease, so that both have surely expired
PAUSE_GAP_S = (10.0, 30.0)
FIRST_PAUSE_S = 4.0
BROKER_GAP_S = (8.0, 16.0)
FIRST_BROKER_S = 5.0
SECOND_BROKER_S = (3.0, 5.0)
"""After the first restart the connection reset follows soon, so that even a short run sees
both kinds; the gaps after that are :data:`BROKER_GAP_S`."""
WAKE_GRACE_S = 5.0
"""A run does not end sooner than this after a paused host woke: what it does on waking is
part of the run."""
LOCK_STATS_LAG_S = 3.0
"""The broker rewrites its stats file about once a second and the run reads it every half
second: a lock counted up to this long after a pause ended may have expired during it."""


def parse_nemeses(text: str) -> tuple[str, ...]:
    """``pause,kill`` -> ("pause", "kill"); raises ValueError naming what is unknown."""
    chosen = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in chosen if n not in NEMESES]
    if unknown or not chosen:
        raise ValueError(f"unknown nemesis {unknown or text!r}: choose from {','.join(NEMESES)}")
    return chosen


def skew_offsets(rng: random.Random, hosts: int, skew_max: int) -> dict[int, int]:
    """Whole seconds each host's clock runs ahead (even hosts) or behind (odd ones): at least
    half of ``skew_max``, at most all of it."""
    return {
        n: (1 if n % 2 == 0 else -1) * rng.randint(max(1, skew_max // 2), skew_max)
        for n in range(hosts)
    }


def pause_seconds(settings: Settings, broker_config: Path = DEFAULT_CONFIG) -> float:
    """Longer than every queue's lock (the broker's entity config) and the Supervisor's lease."""
    longest_lock = max(
        q.lock_duration.total_seconds() for q in load_queues([broker_config]).values()
    )
    return max(longest_lock, settings.supervisor_lease.total_seconds()) + PAUSE_MARGIN_S


@dataclass
class Event:
    nemesis: str
    target: str
    start_s: float
    """Seconds since the run started (its orders were sent)."""
    start_utc: str
    params: dict[str, Any] = field(default_factory=dict)
    end_s: float | None = None
    end_utc: str | None = None


class Nemeses:
    """Acts on the stack as the chosen nemeses say, from the run's loop (:meth:`act`)."""

    def __init__(
        self,
        stack: LocalStack,
        chosen: tuple[str, ...],
        rng: random.Random,
        *,
        kill_every: tuple[float, float],
        pause_s: float,
        started: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stack = stack
        self.chosen = chosen
        self.rng = rng
        self.kill_every = kill_every
        self.pause_s = pause_s
        self.started = started
        self.clock = clock
        self.events: list[Event] = []
        self._pause: Event | None = None
        self._paused_host = -1
        self._woke_at = float("-inf")
        # The first kill comes early, while the first orders are surely still in flight.
        self._next = {
            "kill": started + min(kill_every[0], 2.0),
            "pause": started + FIRST_PAUSE_S,
            "broker": started + FIRST_BROKER_S,
        }
        self._broker_restart_next = True
        for n, offset in sorted(stack.clock_offsets.items()):
            self._begin("skew", f"host-{n}", {"offset_s": offset})
        if stack.storage_faults is not None:
            self._begin("storage", "hosts -> Azurite tables", asdict(stack.storage_faults))

    async def act(self, *, orders_pending: bool) -> None:
        """Do what is due now. With no order pending, only a pause still on is ended."""
        now = self.clock()
        if self._pause is not None and now >= self.started + self._pause.start_s + self.pause_s:
            self._end_pause(now)
        if not orders_pending:
            return
        if "pause" in self.chosen and self._pause is None and now >= self._next["pause"]:
            self._start_pause()
        if "kill" in self.chosen and now >= self._next["kill"]:
            self._kill()
            self._next["kill"] = self.clock() + self.rng.uniform(*self.kill_every)
        if "broker" in self.chosen and now >= self._next["broker"]:
            await self._broker()
            first = self._count("broker") == 1
            gap = SECOND_BROKER_S if first else BROKER_GAP_S
            self._next["broker"] = self.clock() + self.rng.uniform(*gap)

    def quiet(self) -> bool:
        """No host paused, and the last one to wake has had :data:`WAKE_GRACE_S` to act."""
        return self._pause is None and self.clock() - self._woke_at >= WAKE_GRACE_S

    def finish(self) -> None:
        """End what is still on: a pause (its host resumed), the run-long skew and storage."""
        if self._pause is not None:
            self._end_pause(self.clock())
        for event in self.events:
            if event.end_s is None:
                self._end(event)

    def paused_around(self, at: float) -> bool:
        """Whether a host was paused at ``at`` (on :attr:`clock`), or woke just before it was
        seen."""
        return any(
            e.nemesis == "pause"
            and self.started + e.start_s
            <= at
            <= self.started + (e.end_s or float("inf")) + LOCK_STATS_LAG_S
            for e in self.events
        )

    def report(self, workdir: Path) -> dict[str, Any]:
        return {
            "chosen": list(self.chosen),
            "counts": {
                "kills": self._count("kill"),
                "pauses": self._count("pause"),
                "pause_s": round(self.pause_s, 1),
                "skewed_hosts": {
                    f"host-{n}": o for n, o in sorted(self.stack.clock_offsets.items())
                },
                "storage_faults": storage_faults(workdir) if self.stack.storage_faults else {},
                "broker_restarts": self._count("broker", "restart"),
                "broker_connection_resets": self._count("broker", "reset_connections"),
            },
            "events": [asdict(e) for e in self.events],
        }

    def _count(self, nemesis: str, what: str | None = None) -> int:
        return sum(
            1
            for e in self.events
            if e.nemesis == nemesis and (what is None or e.params.get("what") == what)
        )

    # --- the actions ----------------------------------------------------------------------------

    def _running_hosts(self) -> list[int]:
        return [n for n in range(self.stack.hosts) if n not in self.stack.paused]

    def _start_pause(self) -> None:
        victim = self.rng.choice(self._running_hosts())
        self.stack.pause_host(victim)
        self._paused_host = victim
        self._pause = self._begin("pause", f"host-{victim}", {"seconds": round(self.pause_s, 1)})

    def _end_pause(self, now: float) -> None:
        assert self._pause is not None
        self.stack.resume_host(self._paused_host)
        self._end(self._pause)
        self._pause = None
        self._woke_at = now
        self._next["pause"] = now + self.rng.uniform(*PAUSE_GAP_S)

    def _kill(self) -> None:
        candidates = self._running_hosts()
        if not candidates or (self.stack.paused and len(candidates) < 2):
            return  # the last host running beside a paused one is spared: see the docstring
        victim = self.rng.choice(candidates)
        event = self._begin("kill", f"host-{victim}", {})
        self.stack.kill_host(victim)
        self.stack.restart_host(victim)
        self._end(event)

    async def _broker(self) -> None:
        what = "restart" if self._broker_restart_next else "reset_connections"
        self._broker_restart_next = not self._broker_restart_next
        event = self._begin("broker", "broker", {"what": what})
        if what == "restart":
            await self.stack.restart("broker")
        else:
            self.stack.reset_broker_connections()
        self._end(event)

    def _begin(self, nemesis: str, target: str, params: dict[str, Any]) -> Event:
        event = Event(nemesis, target, self._since_start(), _utc_now(), params)
        self.events.append(event)
        print(f"… {event.start_s:7.1f} s: {nemesis} {target} {params or ''}", file=sys.stderr)
        return event

    def _end(self, event: Event) -> None:
        event.end_s = self._since_start()
        event.end_utc = _utc_now()

    def _since_start(self) -> float:
        return round(self.clock() - self.started, 2)


def storage_faults(workdir: Path) -> dict[str, Any]:
    """The storage proxy's counts (its stats file): requests, writes, faults by kind."""
    try:
        document = json.loads((workdir / STORAGE_PROXY_STATS).read_text())
    except (OSError, ValueError):
        return {"stats_missing": True}
    return {key: document.get(key) for key in ("requests", "writes", "faults")}


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
