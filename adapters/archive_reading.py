"""Reading the archive of purged orders back (the operations app; the purge only appends:
:mod:`adapters.archive`).

An order may be archived more than once (a purge retried after a crash archives it again), so
readers de-duplicate: of several copies of an order, the one with the highest timeline sequence
(then the latest ``archived_at``) is the order as it was deleted (:func:`latest`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import date, datetime
from typing import Any, Protocol

from azure.core.exceptions import ResourceNotFoundError

from adapters.archive import FORMAT, Archive, ArchivedOrder, ArchiveError, BlobArchive
from adapters.store.rows import outgoing_of, parse_iso, step_of, utc
from domain import ids
from domain.messages import OrderSubmitted
from domain.order import Order, TimelineEntry
from domain.states import ProcessState


class ReadableArchive(Archive, Protocol):
    """What the readers need: :class:`ReadableBlobArchive`, and devstack.memory's in memory."""

    def lines(self, blob: str) -> AsyncIterator[bytes]: ...

    async def blobs(self, day: date | None = None) -> list[str]: ...


class ReadableBlobArchive(BlobArchive):
    """:class:`adapters.archive.BlobArchive`, read back."""

    async def lines(self, blob: str) -> AsyncIterator[bytes]:
        download = await self._container.get_blob_client(blob).download_blob()
        data = await download.readall()
        for line in data.splitlines():
            if line.strip():
                yield line

    async def blobs(self, day: date | None = None) -> list[str]:
        prefix = day_prefix(day) if day is not None else None
        try:
            return [b.name async for b in self._container.list_blobs(name_starts_with=prefix)]
        except ResourceNotFoundError:
            return []  # no container yet: nothing was ever archived


def day_prefix(day: date) -> str:
    return f"{day:%Y/%m/%d}"


async def find(
    archive: ReadableArchive, order_id: str, *, day: date | None = None
) -> ArchivedOrder | None:
    """The archived copy of ``order_id`` (de-duplicated), searching the day blobs newest
    first (only ``day``'s when given); None if it is not archived."""
    copies = await find_all(archive, order_id, day=day)
    return latest(copies)[0] if copies else None


async def find_all(
    archive: ReadableArchive, order_id: str, *, day: date | None = None
) -> list[ArchivedOrder]:
    """Every copy of ``order_id`` in the newest blob that holds it (not de-duplicated).

    A later copy is always archived on the same day or later, so the newest blob holding the
    order holds its latest copy.
    """
    order_id = ids.validate_order_id(order_id)
    # encode() writes order_id first: a line of another order is skipped without parsing it.
    head = b"{" + json.dumps({"order_id": order_id}, separators=(",", ":"))[1:-1].encode() + b","
    for blob in sorted(await archive.blobs(day), key=_blob_order, reverse=True):
        copies = [decode(line) async for line in archive.lines(blob) if line.startswith(head)]
        if copies:
            return copies
    return []


def latest(records: Iterable[ArchivedOrder]) -> list[ArchivedOrder]:
    """One record per order id: the copy with the highest timeline sequence, then the latest
    ``archived_at`` (a crash between archive and delete archives an order twice)."""
    best: dict[str, ArchivedOrder] = {}
    for record in records:
        kept = best.get(record.order_id)
        if kept is None or _rank(record) > _rank(kept):
            best[record.order_id] = record
    return list(best.values())


def _rank(record: ArchivedOrder) -> tuple[int, datetime, datetime]:
    return (record.process.timeline_seq, record.process.updated_at, record.archived_at)


def _blob_order(name: str) -> tuple[str, int]:
    stem = name.removesuffix(".jsonl")
    base, _, part = stem.partition(".")
    return (base, int(part) if part.isdigit() else 0)


def decode(line: bytes) -> ArchivedOrder:
    try:
        document = json.loads(line)
        if document.get("format") != FORMAT:
            raise ValueError(f"unknown archive format {document.get('format')!r}")
        return ArchivedOrder(
            order_id=document["order_id"],
            archived_at=parse_iso(document["archived_at"]),
            run_id=document["run_id"],
            submitted=OrderSubmitted.model_validate(document["submitted"]),
            payload_hash=document["payload_hash"],
            process=order_of(document["process"]),
            timeline=tuple(timeline_of(item) for item in document["timeline"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ArchiveError(f"archive line is unreadable: {exc!r}: {line[:120]!r}") from None


def order_of(item: Mapping[str, Any]) -> Order:
    return Order(
        order_id=item["order_id"],
        workflow=item["workflow"],
        state=ProcessState(item["state"]),
        locked_by=item["locked_by"],
        complete_by=parse_iso(item["complete_by"]),
        failure_count=int(item["failure_count"]),
        attempt=int(item["attempt"]),
        generation=int(item["generation"]),
        current_step=item["current_step"],
        current_operation=ids.validate_operation(item["current_operation"]),
        reply_to=item["reply_to"],
        payload=item["payload"],
        steps=tuple(step_of(step) for step in item["steps"]),
        created_at=_required_dt(item["created_at"]),
        updated_at=_required_dt(item["updated_at"]),
        next_attempt_at=parse_iso(item["next_attempt_at"]),
        last_error=item["last_error"],
        compensation_cause=item["compensation_cause"],
        compensation_reason=item["compensation_reason"],
        # Absent from lines archived before compensation had a budget.
        compensation_started_at=parse_iso(item.get("compensation_started_at")),
        compensation_warned=bool(item.get("compensation_warned")),
        status_seq=int(item["status_seq"]),
        outbox=tuple(outgoing_of(o) for o in item["outbox"]),
        timeline_seq=int(item["timeline_seq"]),
    )


def timeline_of(item: Mapping[str, Any]) -> TimelineEntry:
    return TimelineEntry(
        seq=int(item["seq"]),
        at=_required_dt(item["at"]),
        actor=item["actor"],
        event=item["event"],
        from_state=ProcessState(item["from_state"]) if item["from_state"] else None,
        to_state=ProcessState(item["to_state"]),
        step=item["step"],
        attempt=int(item["attempt"]),
        detail=item["detail"],
    )


def _required_dt(value: str) -> datetime:
    return utc(datetime.fromisoformat(value))
