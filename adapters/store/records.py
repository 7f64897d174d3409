"""The order store as operators and tools use it: what the pattern app never does with an order.

:class:`OrderRecords` is :class:`adapters.store.state_store.OrderStateStore` and, beside the hot
path's reads and ETag-conditional writes, the reads an operator makes (an order with what was
submitted, its timeline, every row of the active-order index), the annotation an operator's action
records, and the retention purge. The operations app's composition root and the tools build it;
the pattern app's instances build the plain store and never load this module (an import contract
says so).

Purge (:mod:`service.purge`, off the hot path): :meth:`OrderRecords.purge_candidates` scans the
process rows of finished orders last changed before a cutoff (one pass over the table per run;
no index, so nothing is added to the hot path), :meth:`~OrderRecords.snapshot` reads one
order's rows in one partition query, and :meth:`~OrderRecords.purge` deletes them in Table
transactions, the first conditional on the process row's ETag
(:func:`domain.retention.delete_plan`). A first transaction whose answer was lost is settled
by reading the process row: gone, the order is (a marker left is finished by the next run);
unchanged, it did not land and the error is raised; changed, it is left alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterable
from datetime import datetime
from functools import cached_property
from typing import Any, Final

from azure.core.exceptions import AzureError
from azure.data.tables import TableTransactionError

from adapters.store.purge_log import PurgeLog
from adapters.store.rows import (
    DETAILS_ROW,
    PROCESS_ROW,
    TIMELINE_END,
    TIMELINE_PREFIX,
    ActivePage,
    ActiveRow,
    CorruptOrderState,
    OrderNotFound,
    etag_of,
    get_json,
    if_unchanged,
    order_from_entity,
    timeline_from_entity,
    timeline_row_key,
    utc,
)
from adapters.store.state_store import OrderStateStore
from adapters.tables import Entity, may_have_applied
from domain import ids
from domain.messages import OrderSubmitted
from domain.order import Order, StepRecord, TimelineEntry
from domain.retention import (
    MAX_BATCH,
    PURGEABLE_STATES,
    Candidate,
    DeleteOutcome,
    OrderSnapshot,
    delete_plan,
)
from domain.states import ProcessState

PURGE_MARKER_ROW: Final = "purging"
"""Written by the first transaction of a purge that needs several; deleted by the last."""


@dataclasses.dataclass(frozen=True, slots=True)
class OrderRecord:
    """An order as operators see it: what was submitted and its state (timeline apart)."""

    details: OrderSubmitted
    payload_hash: str
    process: Order

    @property
    def order_id(self) -> str:
        return self.process.order_id

    @property
    def steps(self) -> tuple[StepRecord, ...]:
        return self.process.steps


class OrderRecords(OrderStateStore):
    """The state store with operators' reads, their annotations and the retention purge."""

    @cached_property
    def purges(self) -> PurgeLog:
        """The record of purge runs (a partition of the orders table)."""
        return PurgeLog(self._orders)

    # ------------------------------------------------------------------------------ reads

    async def get_order(self, order_id: str) -> OrderRecord:
        """What was submitted and the order's state, for operators (two point reads)."""
        order_id = ids.validate_order_id(order_id)
        details, process = await self._details_and_process(order_id)
        if details is None and process is None:
            raise OrderNotFound(order_id)
        if details is None or process is None:
            raise CorruptOrderState(f"order {order_id} lacks its details or process row")
        return OrderRecord(
            details=_submitted(order_id, details),
            payload_hash=details.get("PayloadHash", ""),
            process=order_from_entity(process, etag_of(process)),
        )

    async def get_timeline(
        self, order_id: str, *, after_seq: int = -1, limit: int = 1000
    ) -> list[TimelineEntry]:
        """Timeline rows with ``seq > after_seq``, oldest first, at most ``limit``."""
        order_id = ids.validate_order_id(order_id)
        if limit < 1:
            raise ValueError("limit must be at least 1")
        low = TIMELINE_PREFIX if after_seq < 0 else timeline_row_key(after_seq)
        entries: list[TimelineEntry] = []
        query = self._orders.query_entities(
            "PartitionKey eq @pk and RowKey gt @low and RowKey lt @high",
            parameters={"pk": order_id, "low": low, "high": TIMELINE_END},
            results_per_page=min(limit, 1000),
        )
        async for row in query:
            entries.append(timeline_from_entity(row))
            if len(entries) >= limit:
                break
        return entries

    async def annotate(self, order: Order, *, actor: str, event: str, detail: str = "") -> Order:
        """Record something about an order without changing it (an operator acknowledging an
        alert): one conditional write of the same state and a timeline row."""
        now = utc(self._clock())
        after = dataclasses.replace(order, updated_at=now, timeline_seq=order.timeline_seq + 1)
        entry = TimelineEntry(
            seq=after.timeline_seq,
            at=now,
            actor=actor,
            event=event,
            from_state=order.state,
            to_state=order.state,
            step=None,
            attempt=order.attempt,
            detail=detail,
        )
        return await self.save(order, after, entry)

    # ------------------------------------------------------------------------------ index

    async def list_active(
        self, limit: int = 1000, *, continuation: str | None = None
    ) -> ActivePage:
        """One page of the active-order index (see :meth:`ActiveOrderIndex.list`)."""
        return await self.index.list(limit, continuation=continuation)

    async def all_active(self) -> AsyncIterator[ActiveRow]:
        """Every row of the active-order index, one request per page of 1,000."""
        continuation = None
        while True:
            page = await self.list_active(1000, continuation=continuation)
            for row in page.rows:  # noqa: UP028, RUF100 (an async generator has no yield from)
                yield row
            continuation = page.continuation
            if continuation is None:
                return

    # ------------------------------------------------------------------------------ purge

    async def purge_candidates(
        self,
        before: datetime,
        states: Iterable[ProcessState] = PURGEABLE_STATES,
        *,
        page_size: int = 1000,
    ) -> AsyncIterator[Candidate]:
        """Process rows in one of ``states`` last changed before ``before``, and the markers of
        interrupted purges: a scan of the orders table (one request per page the service
        answers), reading four properties per row."""
        wanted = sorted({ProcessState(s) for s in states})
        if not wanted or any(s.in_flight for s in wanted):
            raise ValueError("only finished states (Processed, Error) can be purged")
        params: dict[str, Any] = {"process": PROCESS_ROW, "marker": PURGE_MARKER_ROW}
        params |= {"before": utc(before)}
        params |= {f"s{n}": state.value for n, state in enumerate(wanted)}
        either = " or ".join(f"ProcessState eq @s{n}" for n in range(len(wanted)))
        query = self._orders.query_entities(
            # The SDK substitutes @names only between spaces, hence "( ... )".
            f"( RowKey eq @process and UpdatedAt lt @before and ( {either} ) ) "
            "or RowKey eq @marker",
            parameters=params,
            select=["PartitionKey", "RowKey", "ProcessState", "UpdatedAt"],
            results_per_page=page_size,
        )
        async for entity in query:
            if entity["RowKey"] == PURGE_MARKER_ROW:
                yield Candidate(entity["PartitionKey"], None, None, interrupted=True)
            else:
                yield Candidate(
                    order_id=entity["PartitionKey"],
                    state=ProcessState(entity["ProcessState"]),
                    updated_at=utc(entity["UpdatedAt"]),
                )

    async def snapshot(self, order_id: str) -> OrderSnapshot | None:
        """Every row of an order (one partition query); None if it has no process row (gone,
        or its purge was interrupted: see :meth:`finish_purge`)."""
        order_id = ids.validate_order_id(order_id)
        rows = {row["RowKey"]: row for row in await self._partition(order_id)}
        details, process = rows.get(DETAILS_ROW), rows.get(PROCESS_ROW)
        if process is None or PURGE_MARKER_ROW in rows:
            return None
        if details is None:
            raise CorruptOrderState(f"order {order_id} has a process row but no details row")
        others = sorted(key for key in rows if key not in (DETAILS_ROW, PROCESS_ROW))
        return OrderSnapshot(
            submitted=_submitted(order_id, details),
            payload_hash=details.get("PayloadHash", ""),
            process=order_from_entity(process, etag_of(process)),
            timeline=tuple(
                timeline_from_entity(rows[key]) for key in others if key.startswith(TIMELINE_PREFIX)
            ),
            other_rows=tuple(others),
        )

    async def purge(self, snapshot: OrderSnapshot) -> DeleteOutcome:
        """Delete every row of the order in ``snapshot`` if its process row is unchanged.

        One transaction when the order has at most 100 rows; otherwise the first transaction
        (process row, conditional, plus a marker) decides, and the others follow
        (:class:`domain.retention.DeletePlan`). Nothing is deleted when the order changed.
        """
        order_id = ids.validate_order_id(snapshot.process.order_id)
        plan = delete_plan(PROCESS_ROW, DETAILS_ROW, snapshot.other_rows, MAX_BATCH)
        condition = if_unchanged(snapshot.process.etag)
        first: list[tuple[Any, ...]] = [("delete", _key(order_id, PROCESS_ROW), condition)]
        first += [("delete", _key(order_id, row)) for row in plan.first[1:]]
        if not plan.atomic:
            marker = _key(order_id, PURGE_MARKER_ROW) | {
                "Generation": snapshot.process.generation,
                "StartedAt": utc(self._clock()),
            }
            first.append(("create", marker))
        try:
            await self._orders.submit_transaction(first)
        except AzureError as exc:
            refused = isinstance(exc, TableTransactionError) and exc.status_code in (404, 409, 412)
            if not refused and not may_have_applied(exc):
                raise
            stored = await self.find(order_id)
            if stored is None:  # deleted: a marker left behind is finished by the next run
                return DeleteOutcome.GONE
            if not refused and stored.etag == snapshot.process.etag:
                raise  # its answer was lost and it did not land: the next run tries again
            return DeleteOutcome.CHANGED
        if not plan.atomic:
            for rows in plan.middle:
                await self._orders.submit_transaction([("delete", _key(order_id, r)) for r in rows])
            await self._delete_last(order_id, plan.last)
        return DeleteOutcome.PURGED

    async def finish_purge(self, order_id: str) -> bool:
        """Delete what an interrupted purge left (its marker says the process row is gone);
        False if there is nothing to finish."""
        order_id = ids.validate_order_id(order_id)
        keys = sorted(row["RowKey"] for row in await self._partition(order_id))
        if PURGE_MARKER_ROW not in keys or PROCESS_ROW in keys:
            return False
        rest = [k for k in keys if k not in (DETAILS_ROW, PURGE_MARKER_ROW)]
        while len(rest) > MAX_BATCH - 2:
            batch, rest = rest[:MAX_BATCH], rest[MAX_BATCH:]
            await self._orders.submit_transaction([("delete", _key(order_id, r)) for r in batch])
        await self._delete_last(order_id, (*rest, *([DETAILS_ROW] if DETAILS_ROW in keys else [])))
        return True

    async def _delete_last(self, order_id: str, rows: Iterable[str]) -> None:
        operations = [("delete", _key(order_id, r)) for r in rows]
        operations.append(("delete", _key(order_id, PURGE_MARKER_ROW)))
        await self._orders.submit_transaction(operations)

    async def _partition(self, order_id: str) -> list[Any]:
        query = self._orders.query_entities(
            "PartitionKey eq @pk", parameters={"pk": order_id}, results_per_page=1000
        )
        return [row async for row in query]


def _submitted(order_id: str, details: Entity) -> OrderSubmitted:
    try:
        return OrderSubmitted.model_validate_json(get_json(details, "Payload") or "")
    except ValueError as exc:
        raise CorruptOrderState(f"details of order {order_id} are unreadable: {exc}") from None


def _key(partition_key: str, row_key: str) -> dict[str, Any]:
    return {"PartitionKey": partition_key, "RowKey": row_key}
