"""The active-order index: which orders are in flight, at a cost that ignores finished ones.

The Supervisor must look at every order in flight on every tick, and at nothing else, so that
its cost grows with the orders in flight and not with every order ever processed. The orders
table cannot answer "which orders are in flight" without a scan, so a second table does:

- One row per in-flight order *generation*: PartitionKey ``a<nn>`` (crc32 of the order id
  modulo 16, spreading writes over partitions), RowKey ``<order_id>.<generation>``, with
  ``OrderID``, ``Generation``, ``Workflow``, ``WrittenAt``. No copies of mutable fields such as
  CompleteBy: a copy written outside the order's own transaction can be stale in the direction
  that hides an expired order, so the Supervisor point-reads each listed process row instead.
- Crash ordering (there are no cross-table transactions): the row is written BEFORE the
  transaction that puts an order generation in flight (create, resubmit) and deleted AFTER the
  messages of the transaction that made it terminal (Processed, Error) were sent. A crash
  leaves at worst an extra row, never an in-flight order without one; a finished order whose
  row is still there may still owe its final messages, and the Supervisor sends them.
- ``DueAt``: when the Supervisor must look at the order next, never later than the truth
  (:func:`domain.lifecycle.due_at`), so a tick reads only rows that are due (one query per
  bucket) instead of every order in flight. There is no cross-table transaction, so the row is
  kept *early*, never late: a write that moves an order's due time earlier updates the row
  BEFORE the order write (a lost race then leaves it early, which is harmless); a write that
  moves it later leaves the row as it was (early); the Supervisor, finding a row due whose
  order is not, moves the row up to the order's due time, conditional on the row's ETag, so a
  concurrent earlier write always wins.
- A tick that finds more rows due than it handles itself hands them out
  (:meth:`ActiveOrderIndex.hand_out`): one transaction per message's rows moves their
  ``DueAt`` to a lease and records the hand-out (``DispatchId``, ``DispatchedAt``, and
  ``DueSince``: when the row first came due), conditional on each row as found. While the lease
  runs the row may be later than its order's due time: the order is due already, and a message
  for it is on its way to whichever instance recovers it. The recovery moves the row on (and
  clears the hand-out); a row nobody moved on comes due again when the lease ends.
- Rows whose order is missing or at a later generation are garbage, removed by
  :meth:`ActiveOrderIndex.reap` once older than a grace period (a create may still be on its
  way after its row was written) and unchanged since listed (ETag: a resubmit may have
  re-written it meanwhile). The generation in the RowKey keeps the cleanup after an Error from
  deleting the row of a resubmission that followed it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import zlib
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableTransactionError, UpdateMode

from adapters.store.rows import ActivePage, ActiveRow, CorruptOrderState, etag_of, if_unchanged, utc
from adapters.tables import Entity, Pages, Table, may_have_applied
from domain.order import Order

INDEX_BUCKETS: Final = 16
DEFAULT_GRACE: Final = timedelta(minutes=15)
Row = TypeVar("Row")


def index_partition(order_id: str) -> str:
    return bucket_partition(zlib.crc32(order_id.encode("ascii")) % INDEX_BUCKETS)


def bucket_partition(bucket: int) -> str:
    return f"a{bucket:02d}"


def index_row_key(order_id: str, generation: int) -> str:
    return f"{order_id}.{generation}"


MAX_PAGE: Final = 1000  # the most rows one Table query response holds
MAX_TRANSACTION: Final = 100  # the most rows one entity group transaction changes
DISPATCH_ID: Final = "DispatchId"

_log = logging.getLogger(__name__)


class ActiveOrderIndex:
    """Rows of the ``activeorders`` table. Ids are validated by the caller (the state store)."""

    def __init__(self, table: Table, clock: Callable[[], datetime]) -> None:
        self._table = table
        self._clock = clock

    async def put(
        self, order_id: str, generation: int, workflow: str, due: datetime | None = None
    ) -> None:
        """Write (or refresh) the row of an order generation, due at ``due``.

        Without ``due`` the row is due at once, which is always safe (early): the Supervisor
        reads the order on its next tick and moves the row up to the order's due time.
        """
        row = self._row(order_id, generation, workflow, due)
        await self._table.upsert_entity(row, mode=UpdateMode.REPLACE)

    async def add(
        self, order_id: str, generation: int, workflow: str, due: datetime | None = None
    ) -> bool:
        """Insert the row unless it exists; True if this call created it.

        A create uses this: an existing row may be the one thing saying that a finished order
        still owes its final messages, so a duplicate submission must neither replace it nor
        remove it. An insert whose answer was lost is settled by reading the row: there, it is
        False (it may be this call's, but nothing says so, and a row too many is always safe);
        missing, the error is raised (the create comes again).
        """
        try:
            await self._table.create_entity(self._row(order_id, generation, workflow, due))
        except ResourceExistsError:
            return False
        except AzureError as exc:
            if not may_have_applied(exc) or not await self.has(order_id, generation):
                raise
            return False
        return True

    async def postpone(self, row: ActiveRow, due: datetime) -> bool:
        """Move ``row``'s due time to ``due`` unless the row changed since it was read (an
        earlier due time written meanwhile must win), and end its hand-out if it had one; True
        if moved. A move whose answer was lost is read back: moved if the row is due at ``due``.

        A handed-out row that changed since is read: if it is handed out again (its lease ran
        out while the recovery that decided ``due`` was on its way), nobody else moved it on,
        and it is moved on that version."""
        moved = await self._move(row, due)
        if moved is not None:
            return moved
        if not row.dispatch_id:
            return False
        stored = await self._read(row.partition_key, row.row_key)
        if stored is None or not stored.dispatch_id:
            return False
        return await self._move(stored, due) is True

    async def move_on(self, moves: Sequence[tuple[ActiveRow, datetime]]) -> int:
        """:meth:`postpone` each row to its due time, the rows of one bucket (at most
        :data:`MAX_TRANSACTION`) in one transaction; how many were moved. A transaction refused
        (a row changed since it was read) or whose answer was lost is done row by row, each as
        :meth:`postpone` does it."""
        if not moves:
            return 0
        if len({row.partition_key for row, _ in moves}) > 1 or len(moves) > MAX_TRANSACTION:
            raise ValueError(f"move at most {MAX_TRANSACTION} rows of one bucket at once")
        operations = [
            (
                "update",
                {
                    "PartitionKey": row.partition_key,
                    "RowKey": row.row_key,
                    "DueAt": utc(due),
                    DISPATCH_ID: "",
                },
                {"mode": UpdateMode.MERGE, **if_unchanged(row.etag)},
            )
            for row, due in moves
        ]
        try:
            await self._table.submit_transaction(operations)  # type: ignore[arg-type]
        except AzureError as exc:
            if not isinstance(exc, TableTransactionError) and not may_have_applied(exc):
                raise
            moved = await asyncio.gather(*(self.postpone(row, due) for row, due in moves))
            return sum(moved)
        return len(moves)

    async def _move(self, row: ActiveRow, due: datetime) -> bool | None:
        """None if ``row`` changed since it was read."""
        moved = {"PartitionKey": row.partition_key, "RowKey": row.row_key, "DueAt": utc(due)}
        if row.dispatch_id:
            moved[DISPATCH_ID] = ""
        try:
            await self._table.update_entity(moved, mode=UpdateMode.MERGE, **if_unchanged(row.etag))
        except ResourceModifiedError:
            return None
        except ResourceNotFoundError:
            return False
        except AzureError as exc:
            if not may_have_applied(exc):
                raise
            stored = await self._read(row.partition_key, row.row_key)
            return stored is not None and stored.due_at == utc(due) and not stored.dispatch_id
        return True

    async def _read(self, partition_key: str, row_key: str) -> ActiveRow | None:
        """One row as stored now (one point read); None if it is not there."""
        try:
            return _active_row(await self._table.get_entity(partition_key, row_key))
        except ResourceNotFoundError:
            return None

    async def handed_out(self, bucket: int, row_keys: Sequence[str]) -> tuple[ActiveRow, ...]:
        """Those of the rows ``row_keys`` of ``bucket`` that are still handed out (by whichever
        hand-out): one query over their range of keys, in key order."""
        if not row_keys:
            return ()
        wanted = set(row_keys)
        query = self._table.query_entities(
            "PartitionKey eq @pk and RowKey ge @first and RowKey le @last "
            f"and {DISPATCH_ID} ne @none",
            parameters={
                "pk": bucket_partition(bucket),
                "first": min(wanted),
                "last": max(wanted),
                "none": "",
            },
            results_per_page=MAX_PAGE,
        )
        return tuple([_active_row(e) async for e in query if e["RowKey"] in wanted])

    async def hand_out(
        self, rows: Sequence[ActiveRow], until: datetime, at: datetime, dispatch_id: str
    ) -> tuple[ActiveRow, ...]:
        """Mark ``rows`` (of one bucket, at most :data:`MAX_TRANSACTION`) handed out by
        ``dispatch_id`` at ``at``, due again at ``until``, each on condition that it is still
        as found. Returns the rows marked, with their new versions; a row that changed since it
        was found (moved on, or handed out by another tick) is left out.

        One transaction. One refused (a row changed: recoveries move rows on while a tick
        marks) is tried once more without the rows that changed (read one by one); refused
        again, each row is marked on its own. A write whose answer was lost is read back: ours
        if the row carries ``dispatch_id``."""
        if len({row.partition_key for row in rows}) > 1 or len(rows) > MAX_TRANSACTION:
            raise ValueError(f"hand out at most {MAX_TRANSACTION} rows of one bucket at once")
        for _ in range(2):
            if not rows:
                return ()
            operations = [_handed_out(row, until, at, dispatch_id) for row in rows]
            try:
                results = await self._table.submit_transaction(operations)  # type: ignore[arg-type]
            except AzureError as exc:
                refused = isinstance(exc, TableTransactionError)
                if not refused and not may_have_applied(exc):
                    raise
                current = await asyncio.gather(
                    *(self._read(r.partition_key, r.row_key) for r in rows)
                )
                if not refused:
                    return tuple(r for r in current if r and r.dispatch_id == dispatch_id)
                rows = [r for r, now in zip(rows, current, strict=True) if now == r]
                continue
            return tuple(
                _marked(row, until, at, dispatch_id, str(result.get("etag")))
                for row, result in zip(rows, results, strict=True)
            )
        one_by_one = await asyncio.gather(
            *(self._hand_out_one(row, until, at, dispatch_id) for row in rows)
        )
        return tuple(row for row in one_by_one if row is not None)

    async def _hand_out_one(
        self, row: ActiveRow, until: datetime, at: datetime, dispatch_id: str
    ) -> ActiveRow | None:
        _, marked, options = _handed_out(row, until, at, dispatch_id)
        try:
            answer = await self._table.update_entity(marked, **options)
        except (ResourceModifiedError, ResourceNotFoundError):
            return None
        except AzureError as exc:
            if not may_have_applied(exc):
                raise
            stored = await self._read(row.partition_key, row.row_key)
            return stored if stored is not None and stored.dispatch_id == dispatch_id else None
        return _marked(row, until, at, dispatch_id, str(answer.get("etag")))

    async def due(self, bucket: int, now: datetime, limit: int = MAX_PAGE) -> tuple[ActiveRow, ...]:
        """Up to ``limit`` rows of one bucket due at or before ``now``, earliest first.

        One query (more only when the service splits its answer into pages). Rows past
        ``limit`` wait for the next tick, which sees them first.
        """
        query = self._table.query_entities(
            "PartitionKey eq @pk and DueAt le @now",
            parameters={"pk": bucket_partition(bucket), "now": utc(now)},
            results_per_page=min(limit, MAX_PAGE),
        )
        rows: list[ActiveRow] = []
        async for entity in query:
            rows.append(_active_row(entity))
            if len(rows) >= limit:
                break
        return tuple(sorted(rows, key=lambda r: (r.due_at, r.row_key)))

    def _row(
        self, order_id: str, generation: int, workflow: str, due: datetime | None
    ) -> dict[str, object]:
        now = utc(self._clock())
        return {
            "PartitionKey": index_partition(order_id),
            "RowKey": index_row_key(order_id, generation),
            "OrderID": order_id,
            "Generation": generation,
            "Workflow": workflow,
            "WrittenAt": now,
            "DueAt": now if due is None else utc(due),
        }

    async def discard(self, order_id: str, generation: int) -> None:
        """Delete the row of an order generation that has ended; failures are only logged.

        The order's own transition has committed by now and :meth:`reap` removes whatever is
        left behind, so a failure here must not make the caller retry that transition.
        """
        key = index_row_key(order_id, generation)
        try:
            await self._table.delete_entity(index_partition(order_id), key)
        except HttpResponseError as exc:
            _log.warning(
                "could not delete index row %s (left for the supervisor to reap): %s", key, exc
            )

    async def has(self, order_id: str, generation: int) -> bool:
        """Whether the row of an order generation exists (one point read)."""
        try:
            await self._table.get_entity(
                index_partition(order_id), index_row_key(order_id, generation)
            )
        except ResourceNotFoundError:
            return False
        return True

    async def list(self, limit: int = MAX_PAGE, *, continuation: str | None = None) -> ActivePage:
        """One page of at most ``limit`` rows, and where to go on (None: that was the last).

        One request per page. The Supervisor point-reads each listed order's process row, so a
        full pass costs one request per ``limit`` rows plus one per order in flight.
        """
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be from 1 to {MAX_PAGE} (one Table page)")
        token = _decode_continuation(continuation)
        pages = self._table.list_entities(results_per_page=limit).by_page(continuation_token=token)
        rows = tuple(_active_row(entity) for entity in await anext(pages))  # the first page only
        token = pages.continuation_token
        encoded = json.dumps(token, separators=(",", ":"), sort_keys=True) if token else None
        return ActivePage(rows=rows, continuation=encoded)

    async def page_after(
        self, limit: int, *, after: tuple[str, str] | None = None
    ) -> tuple[tuple[ActiveRow, ...], bool]:
        """Up to ``limit`` rows after the key ``after`` (PartitionKey, RowKey), in key order.

        One request (more only if the service answers with empty pages). Returns the rows and
        whether more may follow. Unlike :meth:`list`, a caller
        can resume after any row it has consumed, not only at a page boundary (operator
        listings stop mid-page once they have collected enough matching orders).
        """
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be from 1 to {MAX_PAGE} (one Table page)")
        if after is None:
            entities = self._table.list_entities(results_per_page=limit)
        else:
            entities = self._table.query_entities(
                "(PartitionKey eq @pk and RowKey gt @rk) or PartitionKey gt @pk",
                parameters={"pk": after[0], "rk": after[1]},
                results_per_page=limit,
            )
        return await first_rows(entities.by_page(), _active_row)

    async def reap(
        self, row: ActiveRow, process: Order | None, *, grace: timedelta = DEFAULT_GRACE
    ) -> bool:
        """Delete ``row`` if it is garbage: its order is missing or at a later generation.

        ``process`` must have been read AFTER ``row`` was listed (None: the order is missing).
        A row of the order's current generation is never garbage, even once the order finished:
        it says the order may still owe its final messages (the shell or the Supervisor removes
        it after sending them). The row is also kept while younger than ``grace`` (a create may
        be on its way) and if it changed since it was listed. True once the row is gone.
        """
        live = process is not None and process.generation == row.generation
        if live or utc(self._clock()) - row.written_at < grace:
            return False
        return await delete_unchanged(self._table, row.partition_key, row.row_key, row.etag)


async def delete_unchanged(table: Table, partition_key: str, row_key: str, etag: str) -> bool:
    """Delete a row only if it is still the version read (ETag). False if it changed since;
    True once it is gone (the Table client does not tell a row deleted now from one gone
    already)."""
    try:
        await table.delete_entity(partition_key, row_key, **if_unchanged(etag))
    except ResourceModifiedError:
        return False
    return True


async def first_rows(pages: Pages, decode: Callable[[Entity], Row]) -> tuple[tuple[Row, ...], bool]:
    """The rows of the first page that has any, decoded, and whether more may follow. The
    service may answer a query with an empty page and a continuation token; only a page with
    rows gives a key to resume after."""
    async for page in pages:
        if page:
            return tuple(decode(entity) for entity in page), pages.continuation_token is not None
    return (), False


def _handed_out(row: ActiveRow, until: datetime, at: datetime, dispatch_id: str) -> tuple[Any, ...]:
    marked = {
        "PartitionKey": row.partition_key,
        "RowKey": row.row_key,
        "DueAt": utc(until),
        DISPATCH_ID: dispatch_id,
        "DispatchedAt": utc(at),
        "DueSince": utc(row.overdue_since),
    }
    return ("update", marked, {"mode": UpdateMode.MERGE, **if_unchanged(row.etag)})


def _marked(
    row: ActiveRow, until: datetime, at: datetime, dispatch_id: str, etag: str
) -> ActiveRow:
    return dataclasses.replace(
        row,
        due_at=utc(until),
        etag=etag,
        dispatch_id=dispatch_id,
        dispatched_at=utc(at),
        due_since=row.overdue_since,
    )


def _when(entity: Entity, name: str) -> datetime | None:
    value = entity.get(name)
    return utc(value) if isinstance(value, datetime) else None


def _active_row(entity: Entity) -> ActiveRow:
    try:
        dispatch_id = str(entity.get(DISPATCH_ID) or "")
        return ActiveRow(
            order_id=entity["OrderID"],
            generation=int(entity["Generation"]),
            workflow=entity.get("Workflow", ""),
            written_at=utc(entity["WrittenAt"]),
            due_at=utc(entity.get("DueAt") or entity["WrittenAt"]),
            partition_key=entity["PartitionKey"],
            row_key=entity["RowKey"],
            etag=etag_of(entity),
            dispatch_id=dispatch_id,
            dispatched_at=_when(entity, "DispatchedAt") if dispatch_id else None,
            due_since=_when(entity, "DueSince") if dispatch_id else None,
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptOrderState(
            f"index row {entity.get('RowKey')} is unreadable: {exc!r}"
        ) from None


def _decode_continuation(value: str | None) -> dict[str, str] | None:
    if value is None:
        return None
    try:
        token = json.loads(value)
    except ValueError:
        token = None
    if (
        not isinstance(token, dict)
        or set(token) != {"PartitionKey", "RowKey"}
        or not all(isinstance(v, str) for v in token.values())
    ):
        raise ValueError("continuation is not a token returned by list_active")
    return token
