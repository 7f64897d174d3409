"""The archive of purged orders: JSON lines in one block blob per day, in Blob Storage.

Before the purge deletes an order it appends the whole order here - what was submitted, its
state with every step, and its timeline - as one JSON line (:func:`encode`). Blob
``<container>/<yyyy>/<mm>/<dd>.jsonl`` holds the orders archived that day (UTC); past 49,000
appends a day goes on in ``<dd>.1.jsonl``, ``<dd>.2.jsonl``, ...

**Block blobs, not append blobs**: only block blobs have access tiers, so only they can move to
cool storage (the lifecycle rule in infra/app/storage.bicep); an append blob would stay hot.
An append is one staged block plus a commit of the committed list with it, conditional on the
blob's ETag (two purges at once retry, restaging their block: a commit drops the uncommitted
blocks it does not name). One append carries up to a chunk of orders (service.purge), so a day's
blob takes its 50,000-block limit only past millions of orders.

**At least once**: the purge archives first and deletes after, so a crash between the two
leaves the order in the table and archived, and the next run archives it again. An order that
changed after it was archived is skipped (its delete is conditional) and archived again when it
is purged. Readers therefore de-duplicate: of several copies of an order, the one with the
highest timeline sequence (then the latest ``archived_at``) is the order as it was deleted
(:func:`latest`).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, Final, Protocol

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceModifiedError, ResourceNotFoundError

from adapters.store.rows import iso, outgoing_json, outgoing_of, parse_iso, step_json, step_of, utc
from domain import ids
from domain.messages import OrderSubmitted
from domain.order import Order, TimelineEntry
from domain.states import ProcessState

if TYPE_CHECKING:  # the Blob SDK is imported with the first blob client (adapters.clients)
    from azure.storage.blob import BlobBlock
    from azure.storage.blob.aio import ContainerClient

FORMAT: Final = 1
MAX_BLOCKS_PER_BLOB: Final = 49_000
"""Below Blob Storage's 50,000 committed blocks, with room for appends racing to the limit."""
_COMMIT_ATTEMPTS: Final = 8


class ArchiveError(Exception):
    """An archive line or blob cannot be read."""


@dataclass(frozen=True, slots=True)
class ArchivedOrder:
    """One purged order as archived. ``process.etag`` is empty (ETags are not archived)."""

    order_id: str
    archived_at: datetime
    run_id: str
    submitted: OrderSubmitted
    payload_hash: str
    process: Order
    timeline: tuple[TimelineEntry, ...]


class Archive(Protocol):
    """What the purge and the readers need: :class:`BlobArchive`, and devstack.memory's in
    memory."""

    async def append(self, day: date, records: Sequence[ArchivedOrder]) -> str: ...

    def lines(self, blob: str) -> AsyncIterator[bytes]: ...

    async def blobs(self, day: date | None = None) -> list[str]: ...


def blob_name(day: date, part: int = 0) -> str:
    suffix = "" if part == 0 else f".{part}"
    return f"{day:%Y/%m/%d}{suffix}.jsonl"


def day_prefix(day: date) -> str:
    return f"{day:%Y/%m/%d}"


# -------------------------------------------------------------------------------- reading


async def find(archive: Archive, order_id: str, *, day: date | None = None) -> ArchivedOrder | None:
    """The archived copy of ``order_id`` (de-duplicated), searching the day blobs newest
    first (only ``day``'s when given); None if it is not archived."""
    copies = await find_all(archive, order_id, day=day)
    return latest(copies)[0] if copies else None


async def find_all(
    archive: Archive, order_id: str, *, day: date | None = None
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


# ------------------------------------------------------------------------------- blob store


def _block(block_id: str) -> BlobBlock:
    from azure.storage.blob import BlobBlock  # loaded with the container's client already

    return BlobBlock(block_id=block_id)


class BlobArchive:
    """:class:`Archive` on one Blob container (created on first use if missing)."""

    def __init__(self, container: ContainerClient, *, owner: Any = None) -> None:
        self._container = container
        self._owner = owner
        """The BlobServiceClient the container client came from, closed with it."""

    async def close(self) -> None:
        await self._container.close()
        if self._owner is not None:
            await self._owner.close()

    async def append(self, day: date, records: Sequence[ArchivedOrder]) -> str:
        """Append ``records`` to ``day``'s blob as one block; returns the blob's name."""
        data = b"".join(encode(record) for record in records)
        part = 0
        for _ in range(_COMMIT_ATTEMPTS):
            name = blob_name(day, part)
            blob = self._container.get_blob_client(name)
            etag, committed = await self._committed(name)
            if len(committed) >= MAX_BLOCKS_PER_BLOB:
                part += 1
                continue
            block_id = base64.b64encode(uuid.uuid4().hex.encode()).decode()
            try:
                await blob.stage_block(block_id, data, length=len(data))
                condition: dict[str, Any] = {"match_condition": MatchConditions.IfMissing}
                if etag:
                    condition = {"etag": etag, "match_condition": MatchConditions.IfNotModified}
                await blob.commit_block_list([*committed, _block(block_id)], **condition)
            except ResourceModifiedError:
                continue  # another purge appended first: restage against its list
            except HttpResponseError as exc:
                if exc.status_code == 409 and not etag:
                    continue  # the blob was created meanwhile
                raise
            return name
        raise ArchiveError(
            f"could not append to the archive of {day}: its blob kept changing "
            f"({_COMMIT_ATTEMPTS} attempts); nothing was deleted, the next run tries again"
        )

    async def _committed(self, name: str) -> tuple[str | None, list[BlobBlock]]:
        blob = self._container.get_blob_client(name)
        try:
            etag = (await blob.get_blob_properties()).etag
        except ResourceNotFoundError:
            await self._ensure_container()
            return None, []
        committed, _ = await blob.get_block_list("committed")
        return etag, [_block(b.id) for b in committed]

    async def _ensure_container(self) -> None:
        try:
            await self._container.create_container()
        except HttpResponseError as exc:
            if exc.status_code != 409:  # ContainerAlreadyExists
                raise

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


# ---------------------------------------------------------------------------------- format


def encode(record: ArchivedOrder) -> bytes:
    """One JSON line (UTF-8, ending in a newline); ``order_id`` comes first."""
    document = {
        "order_id": record.order_id,
        "format": FORMAT,
        "archived_at": record.archived_at.isoformat(),
        "run_id": record.run_id,
        "payload_hash": record.payload_hash,
        "submitted": record.submitted.model_dump(mode="json"),
        "process": order_json(record.process),
        "timeline": [timeline_json(entry) for entry in record.timeline],
    }
    text = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8") + b"\n"


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


def order_json(order: Order) -> dict[str, Any]:
    return {
        "order_id": order.order_id,
        "workflow": order.workflow,
        "state": order.state.value,
        "locked_by": order.locked_by,
        "complete_by": iso(order.complete_by),
        "failure_count": order.failure_count,
        "attempt": order.attempt,
        "generation": order.generation,
        "current_step": order.current_step,
        "current_operation": order.current_operation,
        "reply_to": order.reply_to,
        "payload": order.payload,
        "steps": [step_json(step) for step in order.steps],
        "created_at": iso(order.created_at),
        "updated_at": iso(order.updated_at),
        "next_attempt_at": iso(order.next_attempt_at),
        "last_error": order.last_error,
        "compensation_cause": order.compensation_cause,
        "compensation_reason": order.compensation_reason,
        "compensation_started_at": iso(order.compensation_started_at),
        "compensation_warned": order.compensation_warned,
        "status_seq": order.status_seq,
        "outbox": [outgoing_json(o) for o in order.outbox],
        "timeline_seq": order.timeline_seq,
    }


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


def timeline_json(entry: TimelineEntry) -> dict[str, Any]:
    return {
        "seq": entry.seq,
        "at": entry.at.isoformat(),
        "actor": entry.actor,
        "event": entry.event,
        "from_state": entry.from_state.value if entry.from_state else None,
        "to_state": entry.to_state.value,
        "step": entry.step,
        "attempt": entry.attempt,
        "detail": entry.detail,
    }


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
