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
