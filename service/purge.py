"""The purge: archive finished orders past retention, then delete them (the imperative shell).

One run (the retention timer, ``POST /api/purge`` or ``orderctl purge``):

1. Scan for candidates (:meth:`adapters.store.records.OrderRecords.purge_candidates`):
   process rows of the selected finished states last changed before the cutoff.
2. Per chunk of candidates, read each order whole (one partition query) and whether its
   active-index row is still there (one point read), and decide (:func:`domain.retention.verdict`):
   never an order in flight, never an unresolved Error, never one that may still owe messages.
3. Archive the chunk's purgeable orders (one append to the day's blob), THEN delete each one
   in Table transactions conditional on the ETag its snapshot was read with. An order that
   changed since (resubmitted, annotated, back in flight) fails that condition and is skipped,
   untouched. A crash between archive and delete leaves the orders in place and archived; the
   next run archives them again and deletes them (the archive's readers de-duplicate).
4. Record the run (:mod:`adapters.store.purge_log`) and log it.

A dry run does steps 1 and 2 only: it reports what would be purged and changes nothing.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Final, Protocol, TypeVar

from adapters.archive import Archive, ArchivedOrder, BlobArchive, blob_service
from adapters.retention_settings import retention_of
from adapters.settings import Settings
from adapters.store.rows import StoreError, utc
from domain.retention import (
    PURGEABLE_STATES,
    Candidate,
    DeleteOutcome,
    OrderSnapshot,
    Verdict,
    cutoff,
    verdict,
)
from domain.states import ProcessState
from service import deadlines

CHUNK: Final = 50
"""Orders archived per append (one block of the day's blob)."""
DEFAULT_LIMIT: Final = 10_000
log = logging.getLogger("retention")
A = TypeVar("A", bound=BlobArchive)


class PurgeStore(Protocol):
    """What the purge needs of a store (the Table store, and devstack.memory's in memory)."""

    index: Any
    errors: Any
    purges: Any

    def purge_candidates(
        self, before: datetime, states: Any = ..., *, page_size: int = ...
    ) -> AsyncIterator[Candidate]: ...

    async def snapshot(self, order_id: str) -> OrderSnapshot | None: ...

    async def purge(self, snapshot: OrderSnapshot) -> DeleteOutcome: ...

    async def finish_purge(self, order_id: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class PurgeRequest:
    older_than: timedelta
    """Purge orders last changed longer ago than this."""
    requested_by: str
    """The actor recorded with the run: ``retention:<instance>`` or ``operator:<name>``."""
    states: tuple[ProcessState, ...] = PURGEABLE_STATES
    dry_run: bool = False
    limit: int = DEFAULT_LIMIT
    """Candidates examined at most; the rest wait for the next run (``more``)."""
    budget: timedelta | None = None
    """Stop examining new candidates after this long (``more``)."""


@dataclass(slots=True)
class PurgeReport:
    run_id: str
    requested_by: str
    dry_run: bool
    states: list[str]
    older_than_days: float
    cutoff: datetime
    started_at: datetime
    finished_at: datetime | None = None
    examined: int = 0
    """Candidates read whole and decided on."""
    purgeable: int = 0
    """Orders found purgeable (in a dry run: what would be purged)."""
    archived: int = 0
    purged: int = 0
    skipped_changed: int = 0
    """Archived, but changed before the delete (or found changed): left untouched."""
    already_gone: int = 0
    kept: dict[str, int] = field(default_factory=dict)
    """Examined but not purgeable, by reason (too_recent, unresolved_error, owes_messages...)."""
    interrupted_finished: int = 0
    """Purges a crash had interrupted, finished by this run."""
    failed: int = 0
    """Orders that could not be read (logged with the reason)."""
    more: bool = False
    """The limit or the time budget stopped the run: candidates are left for the next one."""
    blobs: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("cutoff", "started_at", "finished_at"):
            value = data[key]
            data[key] = value.isoformat() if isinstance(value, datetime) else value
        return data

    def summary(self) -> str:
        kept = sum(self.kept.values())
        return (
            f"purge run {self.run_id} by {self.requested_by}"
            f"{' (dry run)' if self.dry_run else ''}: states {','.join(self.states)} older "
            f"than {self.older_than_days:g} days (before {self.cutoff:%Y-%m-%d %H:%M}Z): "
            f"examined {self.examined}, purgeable {self.purgeable}, archived {self.archived}, "
            f"purged {self.purged}, skipped (changed) {self.skipped_changed}, kept {kept}, "
            f"failed {self.failed}{', more left' if self.more else ''}"
        )


async def run_purge(
    store: PurgeStore,
    archive: Archive,
    request: PurgeRequest,
    *,
    clock: Callable[[], datetime],
    monotonic: Callable[[], float] = time.monotonic,
) -> PurgeReport:
    """One purge run (see the module docstring); records it unless it is a dry run."""
    if request.limit < 1:
        raise ValueError("limit must be at least 1")
    now = utc(clock())
    report = PurgeReport(
        run_id=uuid.uuid4().hex[:12],
        requested_by=request.requested_by,
        dry_run=request.dry_run,
        states=[s.value for s in request.states],
        older_than_days=request.older_than / timedelta(days=1),
        cutoff=cutoff(now, request.older_than),
        started_at=now,
    )
    stop_at = None if request.budget is None else monotonic() + request.budget.total_seconds()
    with deadlines.purge(request.budget):
        candidates = store.purge_candidates(report.cutoff, request.states)
        chunk: list[OrderSnapshot] = []
        async for candidate in candidates:
            if report.examined >= request.limit or (stop_at is not None and monotonic() > stop_at):
                report.more = True
                break
            if candidate.interrupted:
                if not request.dry_run and await store.finish_purge(candidate.order_id):
                    report.interrupted_finished += 1
                continue
            snapshot = await _examine(store, candidate, request, now, report)
            if snapshot is not None:
                chunk.append(snapshot)
            if len(chunk) >= CHUNK:
                await _archive_then_delete(store, archive, chunk, request, now, report)
                chunk = []
        await _archive_then_delete(store, archive, chunk, request, now, report)
        report.finished_at = utc(clock())
        if not request.dry_run:
            await store.purges.record(report.run_id, report.started_at, report.as_dict())
    log.info("%s", report.summary())
    return report


async def _examine(
    store: PurgeStore,
    candidate: Candidate,
    request: PurgeRequest,
    now: datetime,
    report: PurgeReport,
) -> OrderSnapshot | None:
    """Read one candidate whole and decide; the snapshot if it is purgeable."""
    try:
        snapshot = await store.snapshot(candidate.order_id)
    except StoreError as exc:
        report.failed += 1
        log.warning("purge: order %s could not be read (left in place): %s", candidate, exc)
        return None
    if snapshot is None:
        report.already_gone += 1
        return None
    report.examined += 1
    order = snapshot.process
    decided = verdict(
        order,
        snapshot.timeline,
        now=now,
        older_than=request.older_than,
        states=request.states,
        index_row=order.state.terminal and await store.index.has(order.order_id, order.generation),
    )
    if decided is not Verdict.PURGE:
        report.kept[decided.value] = report.kept.get(decided.value, 0) + 1
        return None
    report.purgeable += 1
    return snapshot


async def _archive_then_delete(
    store: PurgeStore,
    archive: Archive,
    chunk: list[OrderSnapshot],
    request: PurgeRequest,
    now: datetime,
    report: PurgeReport,
) -> None:
    if not chunk or request.dry_run:
        return
    records = [
        ArchivedOrder(
            order_id=s.process.order_id,
            archived_at=now,
            run_id=report.run_id,
            submitted=s.submitted,
            payload_hash=s.payload_hash,
            process=replace(s.process, etag="", write_id=""),
            timeline=s.timeline,
        )
        for s in chunk
    ]
    blob = await archive.append(now.date(), records)
    report.archived += len(records)
    if blob not in report.blobs:
        report.blobs.append(blob)
    for snapshot in chunk:
        outcome = await store.purge(snapshot)
        order = snapshot.process
        if outcome is DeleteOutcome.PURGED:
            report.purged += 1
            if order.state is ProcessState.ERROR:
                await store.errors.discard(order.order_id, order.generation)
        elif outcome is DeleteOutcome.CHANGED:
            report.skipped_changed += 1
            log.info("purge: order %s changed after it was read; left in place", order.order_id)
        else:
            report.already_gone += 1


def open_archive(settings: Settings, kind: type[A] = BlobArchive) -> A:  # type: ignore[assignment]
    """The archive container of the state storage account, as ``kind`` (the operations app
    reads it back: :class:`adapters.archive_reading.ReadableBlobArchive`); close it when done.
    ``settings``: the operations app's (:class:`adapters.retention_settings.RetentionSettings`)."""
    retention = retention_of(settings)
    service = blob_service(retention.storage)
    return kind(service.get_container_client(retention.container), owner=service)
