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
is purged. Readers therefore de-duplicate (:mod:`adapters.archive_reading`: the operations
app reads an order back).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Final, Protocol

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceModifiedError, ResourceNotFoundError
from azure.storage.blob import BlobBlock
from azure.storage.blob.aio import BlobServiceClient, ContainerClient

from adapters.credentials import credential
from adapters.op_counts import COUNTS
from adapters.settings import Connection
from adapters.store.rows import iso, outgoing_json, step_json
from domain.messages import OrderSubmitted
from domain.order import Order, TimelineEntry

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
    """What the purge needs: :class:`BlobArchive`, and devstack.memory's in memory."""

    async def append(self, day: date, records: Sequence[ArchivedOrder]) -> str: ...


def blob_name(day: date, part: int = 0) -> str:
    suffix = "" if part == 0 else f".{part}"
    return f"{day:%Y/%m/%d}{suffix}.jsonl"


# ------------------------------------------------------------------------------- blob store


def blob_service(conn: Connection) -> BlobServiceClient:
    """The state storage account's blob service (the retention purge's ``storage``:
    :class:`adapters.retention_settings.Retention`), reporting to adapters.op_counts.COUNTS."""
    hook = COUNTS.request_hook("blob")
    if conn.connection_string:
        return BlobServiceClient.from_connection_string(
            conn.connection_string, raw_request_hook=hook
        )
    assert conn.endpoint is not None
    return BlobServiceClient(conn.endpoint, credential=credential(conn), raw_request_hook=hook)


class BlobArchive:
    """:class:`Archive` on one Blob container (created on first use if missing)."""

    def __init__(
        self, container: ContainerClient, *, owner: BlobServiceClient | None = None
    ) -> None:
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
                blocks = [*committed, BlobBlock(block_id=block_id)]
                await blob.commit_block_list(blocks, **condition)
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
        return etag, [BlobBlock(block_id=b.id) for b in committed]

    async def _ensure_container(self) -> None:
        try:
            await self._container.create_container()
        except HttpResponseError as exc:
            if exc.status_code != 409:  # ContainerAlreadyExists
                raise


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
