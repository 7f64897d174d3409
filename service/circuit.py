"""Circuit breaker for calls to one remote service, shared by every client of it in the process
(the Runtime's :class:`BreakerRegistry`). Each instance's breaker decides alone: its circuit row
is the dashboard's view, never read back to decide, so a library's shared store (Redis, in
aiobreaker and purgatory) would buy nothing here.

Why not a library, decided again once the app ran on asyncio only (so being asyncio-first no
longer rules one out), on aiobreaker 1.2.0, purgatory 3.0.1, circuitbreaker 2.1.3 and pybreaker
1.4.1: none keeps what this one's tests pin.

- Half-open admits one trial call at a time (``test_half_open_admits_one_trial_at_a_time``).
  Past the reset timeout, aiobreaker, purgatory and circuitbreaker each let 5 of 5 concurrent
  calls through as trials. pybreaker admits one only because its lock is held across every call,
  closed circuit or not: 5 calls of 0.1 s from 5 threads took 0.52 s, one at a time
  (``test_calls_through_one_breaker_are_not_serialised``); its asyncio support is Tornado's.
- A cancelled call is no verdict (``test_a_cancelled_call_gives_its_half_open_trial_back``):
  with those trials cancelled, purgatory was open (a failure), circuitbreaker closed
  (``CancelledError`` is no ``Exception``: a success), aiobreaker still half-open to all.
- The caller gives the verdict (below); the libraries wrap the call and judge its exception.
- The clock is injected, so half-opening is tested without sleeping; each library reads
  ``time.time``, ``time.monotonic`` or ``datetime.now`` itself (aiobreaker mixes it with
  ``utcnow``).
- Transitions are numbered and told after the lock is released, off the calling path, and an
  open circuit says when it admits a trial (:meth:`CircuitBreaker.retry_in`, the agent's
  "retry after T"); purgatory awaits its listeners on the call's way out, circuitbreaker has
  none and keeps a process-wide registry of its own.

Import cost would not have decided it (``python -X importtime``, medians of 11, after the
standard library the app loads anyway: circuitbreaker 0.3 to 0.6 ms, pybreaker 1.4 to 1.9,
aiobreaker 3 to 6, purgatory 19; this whole module about 5). The breaker is about 240 lines of
this module; the reporter beside it would stay with any of them. Reopen this for a library with
one half-open trial, an injectable clock and an explicit success, failure or no-verdict report.

The caller reports each admitted call explicitly (``record_success`` / ``record_failure`` /
``release``), so it decides what counts as a failure: the agent counts only transient ones.

Each transition is reported to the breaker's listener, after its lock is released. The
process's breakers (a :class:`BreakerRegistry`, held by its Runtime) set the
``agent.circuit.state`` metric and hand the new state to their :class:`CircuitReporter`, which
writes it to this instance's row of :mod:`adapters.store.circuits` from a task of its own on
the event loop. Only transitions are reported, never calls, so the hot path gains no request;
and the write is off the calling path (fire and forget) rather than awaited on it with a short
timeout, because a transition to open is exactly when things are slow, and the call that opened
the circuit must answer ("retry after T") at once: a timeout, however short, would still be paid
by that call whenever Table Storage is slow.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from adapters import deadline, metrics
from adapters.store.circuits import CircuitRow, CircuitState, CircuitTable
from domain.messages import utc_now

log = logging.getLogger(__name__)

FLUSH_POLL_S = 0.02
"""How often :meth:`CircuitReporter.flush` looks at a writer on another thread's loop."""
ROW_WRITE_S = 30.0
"""How long one circuit row's write may take; one that fails is dropped (the next transition
writes the row whole again)."""


BreakerState = CircuitState
"""A breaker's state: the one its row records (:class:`adapters.store.circuits.CircuitState`)."""


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


@dataclass(frozen=True, slots=True)
class Transition:
    """A breaker changed state: what it is now, since when, and when an open one admits a
    trial call."""

    service: str
    old: BreakerState
    new: BreakerState
    since: datetime
    consecutive_failures: int
    retry_at: datetime | None
    seq: int = 0
    """The breaker's count of transitions: listeners on two threads may hear two transitions
    in either order, and the later one is the one with the higher ``seq``."""


TransitionListener = Callable[[Transition], None]


class _Guard:
    """The breaker's lock as a context manager that, on release, has the breaker tell its
    listener of the transitions made under it (a class, not a generator: it runs on every call,
    and a generator-based context manager costs several times as much)."""

    __slots__ = ("_breaker", "_lock")

    def __init__(self, breaker: CircuitBreaker) -> None:
        self._breaker = breaker
        self._lock = breaker._lock

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *_: object) -> None:
        self._lock.release()
        if self._breaker._heard:
            self._breaker._tell()


class CircuitBreaker:
    """Closed -> (threshold consecutive failures) -> open -> (reset_timeout) -> half-open.

    In half-open, one trial call is admitted at a time: its success closes the circuit, its
    failure opens it again for another ``reset_timeout``. Thread-safe.

    ``on_transition`` hears of each change of state, on the thread that caused it, after the
    lock is released; what it raises is logged, never raised to the caller. ``now`` is the wall
    clock of what it hears (``clock`` measures the reset timeout).
    """

    def __init__(
        self,
        name: str,
        settings: BreakerSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = utc_now,
        on_transition: TransitionListener | None = None,
    ) -> None:
        self.name = name
        self.settings = settings or BreakerSettings()
        self._clock = clock
        self._now = now
        self._on_transition = on_transition
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trial_in_flight = False
        self._heard: list[Transition] = []
        self._seq = 0
        # The lock; transitions made under it are told to the listener once it is released.
        self._locked = _Guard(self)

    def _tell(self) -> None:
        """Called by the guard after the lock is released, when transitions were heard."""
        with self._lock:
            heard, self._heard = self._heard, []
        if self._on_transition is None:
            return
        for transition in heard:
            try:
                self._on_transition(transition)
            except Exception:  # a listener must never fail or delay the call
                log.warning("circuit %s: transition listener failed", self.name, exc_info=True)

    @property
    def state(self) -> BreakerState:
        with self._locked:
            self._maybe_half_open()
            return self._state

    @property
    def consecutive_failures(self) -> int:
        with self._locked:
            return self._failures

    def retry_in(self) -> float:
        """Seconds until an open circuit admits a trial call (0 unless open)."""
        with self._locked:
            if self._state is not BreakerState.OPEN:
                return 0.0
            return max(0.0, self._opened_at + self.settings.reset_timeout - self._clock())

    def acquire(self) -> bool:
        """Return True when a call may go ahead; the caller must then report exactly once."""
        with self._locked:
            self._maybe_half_open()
            if self._state is BreakerState.CLOSED:
                return True
            if self._state is BreakerState.HALF_OPEN and not self._trial_in_flight:
                self._trial_in_flight = True
                return True
            return False

    def record_success(self) -> None:
        with self._locked:
            if self._state is BreakerState.HALF_OPEN:
                self._trial_in_flight = False
                self._transition(BreakerState.CLOSED)
            if self._state is BreakerState.CLOSED:
                self._failures = 0

    def record_failure(self) -> None:
        with self._locked:
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
        with self._locked:
            if self._state is BreakerState.HALF_OPEN:
                self._trial_in_flight = False

    def reset(self) -> None:
        with self._locked:
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
        since = self._now()
        opened = new is BreakerState.OPEN
        retry_at = since + timedelta(seconds=self.settings.reset_timeout) if opened else None
        self._seq += 1
        self._heard.append(
            Transition(self.name, old, new, since, self._failures, retry_at, self._seq)
        )


class BreakerRegistry:
    """A process's breakers, one per service name (thread-safe get-or-create); the Runtime
    holds it (:mod:`service.runtime`), so every client of a service shares one breaker.

    With a ``reporter``, each transition is reported: the ``agent.circuit.state`` metric, and
    the row by the reporter's task; neither for a transition heard after a later one."""

    def __init__(
        self,
        settings: BreakerSettings | None = None,
        *,
        reporter: CircuitReporter | None = None,
    ) -> None:
        self._settings = settings or BreakerSettings()
        self.reporter = reporter
        self._lock = threading.Lock()
        self._breakers: dict[str, CircuitBreaker] = {}

    def get(self, service: str) -> CircuitBreaker:
        with self._lock:
            breaker = self._breakers.get(service)
            if breaker is None:
                heard = self._report if self.reporter is not None else None
                breaker = CircuitBreaker(service, self._settings, on_transition=heard)
                self._breakers[service] = breaker
            return breaker

    def reset_all(self) -> None:
        """Close every breaker (tests, and an operator's tooling)."""
        with self._lock:
            breakers = list(self._breakers.values())
        for breaker in breakers:
            breaker.reset()

    def _report(self, transition: Transition) -> None:
        assert self.reporter is not None
        if self.reporter.submit(transition):
            metrics.record_circuit_state(transition.service, transition.new.value)


class CircuitReporter:
    """Writes each breaker's latest state to this instance's row, from a task of its own on the
    event loop the transition happened on.

    Only the latest state per breaker waits (a dict, so what waits is bounded by the number of
    services, however many transitions happen during an outage of Table Storage), and one
    writer task at a time writes it; a write that fails is logged and dropped: the next
    transition writes the row whole again. A transition told on a thread with no event loop
    waits for the next one told on a loop, or for :meth:`flush`. ``table()`` gives where to
    write, or None for nowhere (an in-memory runtime).
    """

    def __init__(self, table: Callable[[], CircuitTable | None], instance: str) -> None:
        self._table = table
        self._instance = instance
        self._lock = threading.Lock()  # breakers are thread-safe: any thread may submit
        self._waiting: dict[str, Transition] = {}
        self._latest: dict[str, int] = {}
        self._writer: asyncio.Task[None] | None = None
        self.written = 0
        self.failed = 0

    def submit(self, transition: Transition) -> bool:
        """Never waits: a dict update, and the writer task started if none is at work. False
        (and nothing written) for a transition older than one already submitted for its
        service (two threads told of two transitions in the other order)."""
        with self._lock:
            if transition.seq and transition.seq <= self._latest.get(transition.service, 0):
                return False
            self._latest[transition.service] = transition.seq
            self._waiting[transition.service] = transition
        self._start_writer()
        return True

    async def flush(self, timeout: float = 10.0) -> bool:
        """Wait until nothing waits to be written (tests, and a host shutting down); False if
        something still does after ``timeout`` seconds (the writer carries on)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self._start_writer()
            with self._lock:
                writer = self._writer
                if not self._waiting and (writer is None or writer.done()):
                    return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if writer is not None and writer.get_loop() is loop:
                await asyncio.wait({writer}, timeout=remaining)
            else:  # writing on another thread's loop: look again shortly
                await asyncio.sleep(min(FLUSH_POLL_S, remaining))

    def _start_writer(self) -> None:
        """A writer task on this thread's running loop, unless one is at work (or nothing
        waits, or this thread runs no loop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        with self._lock:
            writer = self._writer
            at_work = writer is not None and not writer.done() and not writer.get_loop().is_closed()
            if at_work or not self._waiting:
                return
            self._writer = loop.create_task(self._run(), name="circuit-reporter")

    async def _run(self) -> None:
        while True:
            with self._lock:
                batch, self._waiting = self._waiting, {}
                if not batch:
                    if self._writer is asyncio.current_task():
                        self._writer = None
                    return
            written: set[str] = set()
            try:
                for transition in batch.values():
                    await self._write(transition)
                    written.add(transition.service)
            except asyncio.CancelledError:  # the loop is closing: the next writer has them
                with self._lock:
                    for service, transition in batch.items():
                        if service not in written:
                            self._waiting.setdefault(service, transition)
                raise

    async def _write(self, transition: Transition) -> None:
        try:
            table = self._table()
            if table is None:
                return
            # A bound of the write's own: the writer task serves later invocations too, so the
            # one it was started in (whose bound it inherits) does not bound it.
            with deadline.within(ROW_WRITE_S, detached=True):
                await table.record(row_of(transition, self._instance, utc_now()))
            self.written += 1
        except Exception as error:
            self.failed += 1
            log.warning(
                "circuit %s -> %s not recorded for the dashboard (%s: %s); the next "
                "transition writes the row again",
                transition.service,
                transition.new.value,
                type(error).__name__,
                str(error).splitlines()[0][:200] if str(error) else "",
            )


def row_of(transition: Transition, instance: str, now: datetime) -> CircuitRow:
    return CircuitRow(
        agent=transition.service,
        instance=instance,
        state=transition.new,
        since=transition.since,
        consecutive_failures=transition.consecutive_failures,
        retry_at=transition.retry_at,
        updated_at=now,
    )
