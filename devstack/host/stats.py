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


class StatsCounter:
    """Thread-safe counters for one function."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats = FunctionStats()

    def add(self, **deltas: int) -> None:
        with self._lock:
            current = self._stats
            self._stats = dataclasses.replace(
                current, **{key: getattr(current, key) + value for key, value in deltas.items()}
            )

    def started(self) -> None:
        self.add(invocations=1, in_flight=1)

    def finished(self, ok: bool) -> None:
        self.add(in_flight=-1, successes=int(ok), failures=int(not ok))

    def snapshot(self) -> FunctionStats:
        with self._lock:
            return self._stats
