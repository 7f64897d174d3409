"""The retention purge as a timer-triggered function (schedule: the PURGE_SCHEDULE setting) of
the operations app, beside the operator API's on-demand purge (``POST /api/purge``).

Each run archives and deletes the finished orders (Processed, and Error once resolved) last
changed more than RETENTION_DAYS ago (:mod:`service.purge`), within a time budget; what is left
waits for the next run. RETENTION_DAYS = 0 turns the timer's purge off.

It is housekeeping, not the pattern: it runs in the operations app, so the pattern app's
instances, which scale out with the queues, never load the purge or the archive, and its
identity holds no role on the archive (docs/decisions/005-two-apps-one-package.md).

The schedule is read from the environment when the app is indexed (the Functions host and the
local host both export the app settings before importing the app), so a missing setting means
the default (daily at 02:30 UTC) rather than a host that refuses to start, and a malformed one
stops the host with a message naming it (:func:`adapters.retention_settings.purge_schedule`).
The Runtime and the archive are the operations app's composition root's
(:mod:`service.operations.composition`), its settings the operations app's
(:class:`adapters.retention_settings.RetentionSettings`).
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Final

import azure.functions as func

from adapters.archive import Archive
from adapters.retention_settings import purge_schedule, retention_of
from adapters.telemetry import tracer
from service.operations.composition import OperationsRoot
from service.purge import PurgeRequest, run_purge
from service.runtime import Runtime

RUN_BUDGET: Final = timedelta(minutes=8)
"""Well inside the Functions timeout (10 minutes at the least on any plan)."""

log = logging.getLogger("retention")


def blueprint(root: OperationsRoot) -> func.Blueprint:
    bp = func.Blueprint()

    @bp.timer_trigger(arg_name="timer", schedule=purge_schedule(os.environ), run_on_startup=False)
    async def retention_purge(timer: func.TimerRequest) -> None:
        rt = root.runtime()
        if retention_of(rt.settings).days == 0:
            log.info("retention purge is off (RETENTION_DAYS = 0)")
            return
        await purge(rt, root.archive())

    return bp


async def purge(rt: Runtime, archive: Archive) -> None:
    """One run of the purge, in its own span."""
    with tracer.start_as_current_span("retention_purge") as span:
        report = await run_purge(
            rt.store,
            archive,
            PurgeRequest(
                older_than=timedelta(days=retention_of(rt.settings).days),
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
