"""The Error index: which orders are in Error, listable without scanning the order history.

Operators list Error orders to repair them. The orders table cannot answer "which orders are in
Error" without a scan, and the active-order index only holds orders in flight, so Error orders
get a small index of their own: one partition of the orders table (no extra table to deploy),
PartitionKey ``~error`` (no order id can start with ``~``, see :mod:`domain.ids`), RowKey
``<order_id>.<generation>``, with ``OrderID``, ``Generation`` and ``WrittenAt``.

Crash ordering mirrors the active index: the row is written BEFORE the transition into Error and
deleted AFTER the transition out of it (a resubmission). A transition that then loses its race
deletes the row it wrote, on condition of that row's ETag, so it never removes a row another
instance wrote for the same order in the meantime. A crash therefore leaves at worst an extra
row, never an Error order without one. Listing verifies each row against the order's process
row and deletes old extra rows it meets (:meth:`ErrorOrderIndex.reap`).

The index holds every order still in Error: it grows with unresolved failures, not with history.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)

from adapters.store.active_index import DEFAULT_GRACE, MAX_PAGE, delete_unchanged, first_rows
from adapters.store.active_index import index_row_key as error_row_key
from adapters.store.rows import CorruptOrderState, etag_of, if_unchanged, utc
from adapters.tables import Entity, Table, may_have_applied
from domain.order import Order
from domain.states import ProcessState


@dataclass(frozen=True, slots=True)
class ErrorRow:
    order_id: str
    generation: int
    written_at: datetime
    row_key: str
    etag: str


@dataclass(frozen=True, slots=True)
class ErrorRowPage:
    rows: tuple[ErrorRow, ...]
    last_key: str | None
    """RowKey to continue after (None: the index ended with this page)."""


ERROR_PARTITION: Final = "~error"

_log = logging.getLogger(__name__)


class ErrorOrderIndex:
    """Rows of the ``~error`` partition. Ids are validated by the caller (the state store)."""

    def __init__(self, table: Table, clock: Callable[[], datetime]) -> None:
        self._table = table
        self._clock = clock

    async def put(self, order_id: str, generation: int) -> str | None:
        """Write the row of an order generation about to enter Error, if it has none; its ETag,
        or None when the row was there already (another writer entering Error, or an earlier
        try): that row is not this writer's to delete if its order write then loses. An insert
        whose answer was lost is settled by reading the row: there, None (nothing says it is
        this writer's; a stray row is reaped by listings); missing, the error is raised."""
        key = error_row_key(order_id, generation)
        try:
            metadata = await self._table.create_entity(
                {
                    "PartitionKey": ERROR_PARTITION,
                    "RowKey": key,
                    "OrderID": order_id,
                    "Generation": generation,
                    "WrittenAt": utc(self._clock()),
                }
            )
        except ResourceExistsError:
            return None
        except AzureError as exc:
            if not may_have_applied(exc) or not await self._exists(key):
                raise
            return None
        return str(metadata.get("etag", ""))

    async def _exists(self, key: str) -> bool:
        try:
            await self._table.get_entity(ERROR_PARTITION, key)
        except ResourceNotFoundError:
            return False
        return True

    async def discard(self, order_id: str, generation: int, *, etag: str | None = None) -> None:
        """Delete a row (only if unchanged since ``etag``, when given); failures are logged.

        Whatever this leaves behind is verified away by listings and reaped there.
        """
        key = error_row_key(order_id, generation)
        try:
            await self._table.delete_entity(
                ERROR_PARTITION, key, **(if_unchanged(etag) if etag else {})
            )
        except ResourceModifiedError:
            pass
        except HttpResponseError as exc:
            _log.warning("could not delete error index row %s (reaped later): %s", key, exc)

    async def page(self, limit: int, *, after: str | None = None) -> ErrorRowPage:
        """Up to ``limit`` rows with RowKey > ``after``, in key order: one request."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be from 1 to {MAX_PAGE}")
        query = self._table.query_entities(
            "PartitionKey eq @pk and RowKey gt @after",
            parameters={"pk": ERROR_PARTITION, "after": after or ""},
            results_per_page=limit,
        )
        rows, more = await first_rows(query.by_page(), _error_row)
        return ErrorRowPage(rows=rows, last_key=rows[-1].row_key if more else None)

    async def reap(
        self, row: ErrorRow, process: Order | None, *, grace: timedelta = DEFAULT_GRACE
    ) -> bool:
        """Delete ``row`` if its order generation is not in Error (and the row is old enough)."""
        live = (
            process is not None
            and process.state is ProcessState.ERROR
            and process.generation == row.generation
        )
        if live or utc(self._clock()) - row.written_at < grace:
            return False
        return await delete_unchanged(self._table, ERROR_PARTITION, row.row_key, row.etag)


def _error_row(entity: Entity) -> ErrorRow:
    try:
        return ErrorRow(
            order_id=entity["OrderID"],
            generation=int(entity["Generation"]),
            written_at=utc(entity["WrittenAt"]),
            row_key=entity["RowKey"],
            etag=etag_of(entity),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptOrderState(
            f"error index row {entity.get('RowKey')} is unreadable: {exc!r}"
        ) from None
