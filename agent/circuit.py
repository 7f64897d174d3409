"""Circuit breaker for calls to one remote service, shared by every client in the process.

Why not a library: pybreaker (the usual choice) holds one lock for the whole protected call, so
every call through a shared breaker is serialised: in a Functions worker running several agent
invocations at once, one hung call to a service would stall all others to that service until its
deadline. It also reads the wall clock directly, so "half-opens after the reset timeout" cannot
be tested without real sleeps. The alternatives on PyPI are either not thread-safe (circuitbreaker)
or asyncio-first (purgatory, aiobreaker). This one is small: the lock guards only state changes,
never the call; the clock is injectable; half-open admits one trial call at a time.

The caller reports each admitted call explicitly (``record_success`` / ``record_failure`` /
``release``), so it decides what counts as a failure: the agent counts only transient ones.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerSettings:
    """``failure_threshold`` consecutive failures open the circuit for ``reset_timeout`` s."""

    failure_threshold: int = 5
    reset_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        if self.reset_timeout <= 0:
            raise ValueError("reset_timeout must be positive")


class CircuitBreaker:
    """Closed -> (threshold consecutive failures) -> open -> (reset_timeout) -> half-open.

    In half-open, one trial call is admitted at a time: its success closes the circuit, its
    failure opens it again for another ``reset_timeout``. Thread-safe.
    """

    def __init__(
        self,
        name: str,
        settings: BreakerSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.settings = settings or BreakerSettings()
        self._clock = clock
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trial_in_flight = False

    @property
    def state(self) -> BreakerState:
        with self._lock:
            self._maybe_half_open()
            return self._state

    @property
    def consecutive_failures(self) -> int:
        with self._lock:
            return self._failures

    def retry_in(self) -> float:
        """Seconds until an open circuit admits a trial call (0 unless open)."""
        with self._lock:
            if self._state is not BreakerState.OPEN:
                return 0.0
            return max(0.0, self._opened_at + self.settings.reset_timeout - self._clock())

    def acquire(self) -> bool:
        """Return True when a call may go ahead; the caller must then report exactly once."""
        with self._lock:
            self._maybe_half_open()
            if self._state is BreakerState.CLOSED:
                return True
            if self._state is BreakerState.HALF_OPEN and not self._trial_in_flight:
                self._trial_in_flight = True
                return True
            return False

    def record_success(self) -> None:
        with self._lock:
            if self._state is BreakerState.HALF_OPEN:
                self._trial_in_flight = False
                self._transition(BreakerState.CLOSED)
            if self._state is BreakerState.CLOSED:
                self._failures = 0

    def record_failure(self) -> None:
        with self._lock:
            if self._state is BreakerState.HALF_OPEN:
                self._trial_in_flight = False
                self._open()
            elif self._state is BreakerState.CLOSED:
                self._failures += 1
                if self._failures >= self.settings.failure_threshold:
                    self._open()
            # Already open: a late failure from a call admitted earlier changes nothing.

    def release(self) -> None:
        """The admitted call ended without a verdict (e.g. it was never sent)."""
        with self._lock:
            if self._state is BreakerState.HALF_OPEN:
                self._trial_in_flight = False

    def reset(self) -> None:
        with self._lock:
            self._transition(BreakerState.CLOSED)
            self._failures = 0
            self._trial_in_flight = False

    def _open(self) -> None:
        self._opened_at = self._clock()
        self._transition(BreakerState.OPEN)

    def _maybe_half_open(self) -> None:
        if (
            self._state is BreakerState.OPEN
            and self._clock() >= self._opened_at + self.settings.reset_timeout
        ):
            self._trial_in_flight = False
            self._transition(BreakerState.HALF_OPEN)

    def _transition(self, new: BreakerState) -> None:
        if new is self._state:
            return
        old, self._state = self._state, new
        level = logging.WARNING if new is BreakerState.OPEN else logging.INFO
        log.log(
            level,
            "circuit %s -> %s service=%s failures=%d",
            old.value,
            new.value,
            self.name,
            self._failures,
        )
        if new is BreakerState.CLOSED:
            self._failures = 0


class BreakerRegistry:
    """One breaker per service name; thread-safe get-or-create."""

    def __init__(self, settings: BreakerSettings | None = None) -> None:
        self._settings = settings or BreakerSettings()
        self._lock = threading.Lock()
        self._breakers: dict[str, CircuitBreaker] = {}

    def get(self, service: str) -> CircuitBreaker:
        with self._lock:
            breaker = self._breakers.get(service)
            if breaker is None:
                breaker = CircuitBreaker(service, self._settings)
                self._breakers[service] = breaker
            return breaker

    def reset_all(self) -> None:
        with self._lock:
            breakers = list(self._breakers.values())
        for breaker in breakers:
            breaker.reset()


_registry = BreakerRegistry()


def breaker_for(service: str) -> CircuitBreaker:
    """The process-wide breaker for ``service`` (shared by every client of that service)."""
    return _registry.get(service)


def reset_breakers() -> None:
    """Close every process-wide breaker (for tests and operator tooling)."""
    _registry.reset_all()
