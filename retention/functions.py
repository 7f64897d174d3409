"""The retention purge as a timer-triggered function (schedule: the PURGE_SCHEDULE setting).

Each run archives and deletes the finished orders (Processed, and Error once resolved) last
changed more than RETENTION_DAYS ago (:mod:`service.purge`), within a time budget; what is left
waits for the next run. RETENTION_DAYS = 0 turns the timer's purge off.

The schedule is read from the environment when the app is indexed (the Functions host and the
local host both export the app settings before importing the app), so a missing setting means
the default (daily at 02:30 UTC) rather than a host that refuses to start, and a malformed one
stops the host with a message naming it (:func:`adapters.settings.purge_schedule`).
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Final

import azure.functions as func

from adapters.archive import BlobArchive
from adapters.settings import purge_schedule
from adapters.telemetry import tracer
from service import runtime
from service.purge import PurgeRequest, open_archive, run_purge

RUN_BUDGET: Final = timedelta(minutes=8)
"""Well inside the Functions timeout (10 minutes at the least on any plan)."""

bp = func.Blueprint()
log = logging.getLogger("retention")

_archive: tuple[runtime.Runtime, BlobArchive] | None = None


async def archive_of(rt: runtime.Runtime) -> BlobArchive:
    """The archive of the process-wide Runtime's settings (rebuilt if it is replaced).

    Its clients belong to the event loop the functions run on, as the Runtime's do. Nothing is
    awaited between the check and the swap, so two runs never both build one; the archive it
    replaces is closed after."""
    global _archive
    if _archive is None or _archive[0] is not rt:
        previous = _archive
        _archive = (rt, open_archive(rt.settings))
        if previous is not None:
            await previous[1].close()
    return _archive[1]


@bp.timer_trigger(arg_name="timer", schedule=purge_schedule(os.environ), run_on_startup=False)
async def retention_purge(timer: func.TimerRequest) -> None:
    rt = runtime.current()
    days = rt.settings.retention_days
    if days == 0:
        log.info("retention purge is off (RETENTION_DAYS = 0)")
        return
    with tracer.start_as_current_span("retention_purge") as span:
        report = await run_purge(
            rt.store,
            await archive_of(rt),
            PurgeRequest(
                older_than=timedelta(days=days),
                requested_by=rt.actor("retention"),
                budget=RUN_BUDGET,
            ),
            clock=rt.clock,
        )
        span.set_attributes(
            {
                "retention.examined": report.examined,
                "retention.purged": report.purged,
                "retention.archived": report.archived,
                "retention.skipped_changed": report.skipped_changed,
                "retention.more": report.more,
            }
        )
