"""Per-function invocation counters (``LocalHost.stats()``)."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class FunctionStats:
    invocations: int = 0  # runs started
    successes: int = 0  # runs that returned
    failures: int = 0  # runs that raised
    in_flight: int = 0  # runs going on now
    skipped_ticks: int = 0  # timer: occurrences that fell while the previous run was going
    settle_errors: int = 0  # Service Bus: complete/abandon refused (lock lost, connection gone)
    abandoned_on_stop: int = 0  # Service Bus: still running at stop's deadline, abandoned
    # Service Bus lock loss, as this host sees it (the broker's stats say why each redelivery
    # happened: a host sees only that a message comes with a delivery count above 1).
    redelivered: int = 0  # messages received with a delivery count above 1
    lock_renewal_failures: int = 0  # renewal stopped early: refused, failed, or too late
    lock_lost_on_settle: int = 0  # complete/abandon refused with MessageLockLostError
    lock_lost: int = 0  # messages with either of the two above, each counted once

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COUNTERS}


COUNTERS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(FunctionStats))


class StatsCounter:
    """Thread-safe counters for one function.

    Plain integers under a lock, updated twice per message: a frozen dataclass rebuilt on
    every update cost a measurable share of the host's CPU (docs/performance.md).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)

    def add(self, **deltas: int) -> None:
        unknown = deltas.keys() - self._counts.keys()
        if unknown:
            raise TypeError(f"unknown counter(s) {sorted(unknown)}: one of {', '.join(COUNTERS)}")
        with self._lock:
            for key, value in deltas.items():
                self._counts[key] += value

    def started(self) -> None:
        with self._lock:
            self._counts["invocations"] += 1
            self._counts["in_flight"] += 1

    def finished(self, ok: bool) -> None:
        with self._lock:
            self._counts["in_flight"] -= 1
            self._counts["successes" if ok else "failures"] += 1

    def snapshot(self) -> FunctionStats:
        with self._lock:
            return FunctionStats(**self._counts)
