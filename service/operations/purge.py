"""Purging finished orders as an operator: a purge run (:mod:`service.purge`: archive, then
delete, finished orders older than a number of days, the RETENTION_DAYS setting unless given),
recorded with the operator's name; the recorded runs (the timer's too), newest first; and a
purged order read back from the archive.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import date, timedelta
from typing import Any, Final

from adapters import archive_reading as archive
from adapters.archive import ArchiveError
from adapters.retention_settings import retention_of
from adapters.store.records import OrderRecord
from domain.retention import PURGEABLE_STATES
from domain.states import ProcessState
from service.listing import MAX_LIMIT
from service.operations import filters, validation
from service.operations.context import OperatorContext
from service.operations.errors import Conflict, InvalidRequest, NotFound
from service.operations.models import ArchivedOrderView, OrderDetail, PurgeRunsView, PurgeView
from service.purge import PurgeRequest, run_purge

audit = logging.getLogger("operator_api.audit")

MAX_PURGE_LIMIT: Final = 10_000
PURGE_BUDGET: Final = timedelta(seconds=60)
"""One purge call stops examining after this (``more``): an HTTP call must end in minutes."""


async def purge(
    ctx: OperatorContext,
    *,
    operator: str,
    state: str = "all",
    older_than_days: int | None = None,
    dry_run: bool = False,
    limit: int = 1000,
) -> PurgeView:
    """Archive, then delete, finished orders last changed more than ``older_than_days``
    ago (default: the RETENTION_DAYS setting); ``state``: Processed, Error (resolved ones
    only) or all. A dry run only counts. Never an order in flight."""
    actor = validation.operator_actor(operator)
    states = _states(state)
    days = retention_of(ctx.rt.settings).days if older_than_days is None else older_than_days
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= 3650:
        if older_than_days is None:
            raise InvalidRequest(
                "invalid_older_than",
                "older_than_days is required: the RETENTION_DAYS setting is 0 (the timer's "
                "purge is off), so say how old an order must be, in days from 1 to 3650",
            )
        raise InvalidRequest(
            "invalid_older_than", "older_than_days must be an integer from 1 to 3650"
        )
    validation.dry_run(dry_run)
    validation.check_limit(limit, MAX_PURGE_LIMIT)
    report = await run_purge(
        ctx.rt.store,
        ctx.archive(),
        PurgeRequest(
            older_than=timedelta(days=days),
            requested_by=actor,
            states=states,
            dry_run=dry_run,
            limit=limit,
            budget=PURGE_BUDGET,
        ),
        clock=ctx.rt.clock,
    )
    audit.info("%s", report.summary())
    return PurgeView.model_validate(report.as_dict())


async def purge_runs(ctx: OperatorContext, *, limit: int = 20) -> PurgeRunsView:
    """The latest recorded purge runs (timer and operators), newest first."""
    validation.check_limit(limit, MAX_LIMIT)
    runs = await ctx.rt.store.purges.recent(limit)
    return PurgeRunsView(runs=[PurgeView.model_validate(r) for r in runs])


async def archived_order(
    ctx: OperatorContext, order_id: str, *, day: str | None = None
) -> ArchivedOrderView:
    """A purged order read back from the archive (searching the newest days first, or
    only ``day``, YYYY-MM-DD)."""
    order_id = validation.order_id(order_id)
    on = _day(day)
    try:
        copies = await archive.find_all(ctx.archive(), order_id, day=on)
    except ArchiveError as exc:
        raise Conflict("archive_unreadable", str(exc)) from None
    if not copies:
        where = f"on {on}" if on else "on any day"
        raise NotFound("not_archived", f"order {order_id} is not in the archive {where}")
    found = archive.latest(copies)[0]
    record = OrderRecord(
        details=found.submitted, payload_hash=found.payload_hash, process=found.process
    )
    return ArchivedOrderView(
        archived_at=found.archived_at,
        run_id=found.run_id,
        copies=len(copies),
        order=OrderDetail.of(record, list(found.timeline), False),
    )


def _states(value: Any) -> tuple[ProcessState, ...]:
    if value == "all":
        return PURGEABLE_STATES
    state = filters.state_of(value) if isinstance(value, str) else None
    if state not in PURGEABLE_STATES:
        raise InvalidRequest(
            "invalid_state",
            f"state {str(value)[:40]!r} cannot be purged; purge Processed, Error or all "
            "(orders in flight are never purged)",
        )
    return (state,)


def _day(value: Any) -> date | None:
    if value is None:
        return None
    if isinstance(value, str) and len(value) == 10:
        with contextlib.suppress(ValueError):
            return date.fromisoformat(value)
    raise InvalidRequest("invalid_day", f"day {str(value)[:20]!r} is not a date like 2025-06-01")
