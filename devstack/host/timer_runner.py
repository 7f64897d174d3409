"""Timer triggers: fire at each NCRONTAB occurrence, one run at a time.

One coroutine per timer function, on the host's event loop, runs it at each occurrence (UTC): a
coroutine function is awaited there, as the Python worker awaits it; a sync function runs on a
thread of the timer's own. Occurrences that fall while a run is still going are skipped and
counted, as the Functions host never overlaps runs of one timer. ``past_due`` is set when a run
starts later than one schedule period after its occurrence. A failing run is logged and not
retried; the next occurrence runs as usual. Without storage there is no schedule monitor
(``useMonitor``) and no singleton lease: each local host process runs its timers.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Callable
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any

from azure.functions.timer import TimerRequest

from devstack.host.indexing import IndexedFunction, TimerTrigger
from devstack.host.invoke import Invoker, SyncCalls
from devstack.host.ncrontab import NcrontabSchedule
from devstack.host.stats import StatsCounter

log = logging.getLogger("devstack.host.timer")


def utc_now() -> datetime:
    return datetime.now(UTC)


def skip_missed(schedule: NcrontabSchedule, after: datetime, now: datetime) -> tuple[datetime, int]:
    """The first occurrence after ``after`` that is still ahead of ``now``, and how many
    occurrences in between (all already due) are skipped."""
    upcoming, skipped = schedule.next_after(after), 0
    while upcoming <= now:
        skipped += 1
        upcoming = schedule.next_after(upcoming)
    return upcoming, skipped


def is_past_due(schedule: NcrontabSchedule, occurrence: datetime, started: datetime) -> bool:
    """A run is past due when it starts more than one schedule period after its occurrence."""
    return started - occurrence > schedule.period_at(occurrence)


class TimerRunner:
    """Drives one timer trigger from a coroutine on the host's loop.

    Its methods are called from the host's thread; what they do runs on the loop."""

    def __init__(
        self,
        function: IndexedFunction,
        *,
        invoker: Invoker,
        stats: StatsCounter,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        assert isinstance(function.trigger, TimerTrigger)
        self.function = function
        self.trigger: TimerTrigger = function.trigger
        self.is_async = inspect.iscoroutinefunction(function.user_function)
        self.invoker = invoker
        self.stats = stats
        self.clock = clock
        self.name = f"host-timer-{function.name}"
        self._stop = asyncio.Event()  # set on the loop
        self._last: datetime | None = None
        self._running = False
        self._sync_calls: SyncCalls | None = None
        self._served: Future[Any] | None = None

    def start(self) -> None:
        self._served = self.invoker.submit(self._run())

    def request_stop(self) -> None:
        self.invoker.call_soon(self._stop.set)

    def wait(self, timeout: float) -> bool:
        """Wait until the timer has ended; False if it still runs after ``timeout``."""
        if self._served is None:
            return True
        try:
            self._served.result(timeout)
        except TimeoutError:
            return False
        except BaseException:  # cancelled at the loop's close, or failed: ended either way
            pass
        return True

    def running(self) -> list[str]:
        """The timer, while its function runs."""
        return [self.name] if self._running else []

    async def _run(self) -> None:
        try:
            schedule = self.trigger.schedule
            if self.trigger.run_on_startup:
                await self._invoke(occurrence=None, past_due=False)
            due = schedule.next_after(self.clock())
            while not await self._stopped_within((due - self.clock()).total_seconds()):
                started = self.clock()
                if started < due:  # woke a little early
                    continue
                await self._invoke(occurrence=due, past_due=is_past_due(schedule, due, started))
                due, skipped = skip_missed(schedule, due, self.clock())
                if skipped:
                    self.stats.add(skipped_ticks=skipped)
                    log.info(
                        "%s: skipped %d occurrence(s) of %r that fell while the run was going",
                        self.function.name, skipped, schedule.expression,
                    )  # fmt: skip
        finally:
            if self._sync_calls is not None:
                self._sync_calls.close()

    async def _stopped_within(self, seconds: float) -> bool:
        """Whether stop is requested within ``seconds`` (True at once if it was already)."""
        try:
            await asyncio.wait_for(self._stop.wait(), max(0.0, seconds))
        except TimeoutError:
            return False
        return True

    async def _invoke(self, occurrence: datetime | None, past_due: bool) -> None:
        now = self.clock()
        upcoming = self.trigger.schedule.next_after(occurrence or now)
        request = TimerRequest(
            past_due=past_due,
            schedule_status={
                "Last": (self._last or now).isoformat(),
                "Next": upcoming.isoformat(),
                "LastUpdated": now.isoformat(),
            },
            schedule={"AdjustForDST": True},
        )
        self._last = occurrence or now
        self.stats.started()
        self._running = True
        try:
            await self._call(request)
            ok = True
        except Exception:
            ok = False
            log.exception(
                "%s failed (timer run for %s, past_due=%s); the next occurrence runs as usual",
                self.function.name, occurrence.isoformat() if occurrence else "startup", past_due,
            )  # fmt: skip
        finally:
            self._running = False
        self.stats.finished(ok)

    async def _call(self, request: TimerRequest) -> None:
        """A coroutine function awaited here, on the loop; a sync one on the timer's thread."""
        if self.is_async:
            await self.invoker.call_async(self.function, request)
            return
        if self._sync_calls is None:
            self._sync_calls = SyncCalls(self.name)
        await self._sync_calls.call(functools.partial(self.invoker.call, self.function, request))
