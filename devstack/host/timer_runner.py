"""Timer triggers: fire at each NCRONTAB occurrence, one run at a time.

One thread per timer function runs it at each occurrence (UTC). Occurrences that fall while a
run is still going are skipped and counted, as the Functions host never overlaps runs of one
timer. ``past_due`` is set when a run starts later than one schedule period after its
occurrence. A failing run is logged and not retried; the next occurrence runs as usual.
Without storage there is no schedule monitor (``useMonitor``) and no singleton lease: each
local host process runs its timers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from azure.functions.timer import TimerRequest

from devstack.host.indexing import IndexedFunction, TimerTrigger
from devstack.host.invoke import Invoker
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
        self.invoker = invoker
        self.stats = stats
        self.clock = clock
        self.stopping = threading.Event()
        self._last: datetime | None = None
        self.thread = threading.Thread(
            target=self._run, name=f"host-timer-{function.name}", daemon=True
        )

    def wait(self, timeout: float) -> bool:
        """Wait until the timer's thread has ended; False if it still runs after ``timeout``."""
        if self.thread.ident is not None:
            self.thread.join(timeout)
        return not self.thread.is_alive()

    def running(self) -> list[str]:
        return [self.thread.name] if self.thread.is_alive() else []

    def start(self) -> None:
        self.thread.start()

    def request_stop(self) -> None:
        self.stopping.set()

    def _run(self) -> None:
        schedule = self.trigger.schedule
        if self.trigger.run_on_startup:
            self._invoke(occurrence=None, past_due=False)
        due = schedule.next_after(self.clock())
        while not self.stopping.wait(max(0.0, (due - self.clock()).total_seconds())):
            started = self.clock()
            if started < due:  # woke a little early
                continue
            self._invoke(occurrence=due, past_due=is_past_due(schedule, due, started))
            due, skipped = skip_missed(schedule, due, self.clock())
            if skipped:
                self.stats.add(skipped_ticks=skipped)
                log.info(
                    "%s: skipped %d occurrence(s) of %r that fell while the run was going",
                    self.function.name, skipped, schedule.expression,
                )  # fmt: skip

    def _invoke(self, occurrence: datetime | None, past_due: bool) -> None:
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
        try:
            self.invoker.call(self.function, request)
            ok = True
        except Exception:
            ok = False
            log.exception(
                "%s failed (timer run for %s, past_due=%s); the next occurrence runs as usual",
                self.function.name, occurrence.isoformat() if occurrence else "startup", past_due,
            )  # fmt: skip
        self.stats.finished(ok)
