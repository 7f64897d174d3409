"""Order state in Azure Table Storage: one partition per order, one entity per order's state.

Layout: see :mod:`adapters.store.rows`. The rules that keep it correct:

- **Create is one transaction**: ``details``, ``process`` and timeline row 0. A second create
  of the same id fails as a whole (409) and is answered from the stored payload hash.
- **One point read loads an order** (the ``process`` row holds all of its mutable state), and
  **one ETag-conditional batch changes it**: the ``process`` row replaced on condition of the
  ETag it was read with, plus the next timeline row. A lost race writes nothing at all.
- **A write whose outcome is unknown is resolved by reading, never guessed.** The SDK may resend
  a batch whose first try committed (after a 500 or 503, as azure-core does for a POST); the 412
  or 409 that follows would be our own write. A batch whose answer was lost (a read timeout, a
  reset or a disconnect after it may have been sent, the invocation's deadline, a 5xx the
  retries could not get past: :func:`adapters.tables.may_have_applied`) may have committed or
  not. Each write carries a random ``WriteId``: in both cases the store reads the row once; if
  it carries our WriteId the write is ours, and otherwise the caller decides again on what is
  stored (:class:`Unconfirmed`). A create is settled the same way. Only a write certainly
  refused (a 4xx) or never sent (no connection could be made for it) is not read for. A read
  that cannot be made (the deadline has passed, the service is down) raises: the invocation
  fails and its redelivery decides again.

Active-order index (table ``activeorders``, :mod:`adapters.store.active_index`): a row per order
generation that is in flight or still owes messages. It is written BEFORE the transaction that
puts a generation in flight (create, resubmit) and deleted by the shell AFTER a finished
order's outbox was sent (:mod:`service.apply`), so a crash leaves at worst a row too many, which
the Supervisor resolves: it resends what a finished order owes, then deletes the row. The Error
index (:mod:`adapters.store.error_index`) is written before the write that enters Error and
deleted after the one that leaves it.

Purge (:mod:`service.purge`, off the hot path): :meth:`OrderStateStore.purge_candidates` scans the
process rows of finished orders last changed before a cutoff (one pass over the table per run;
no index, so nothing is added to the hot path), :meth:`~OrderStateStore.snapshot` reads one
order's rows in one partition query, and :meth:`~OrderStateStore.purge` deletes them in Table
transactions, the first conditional on the process row's ETag
(:func:`domain.retention.delete_plan`). A first transaction whose answer was lost is settled
by reading the process row: gone, the order is (a marker left is finished by the next run);
unchanged, it did not land and the error is raised; changed, it is left alone.

Every id is validated (:mod:`domain.ids`) before any request; every filter is parameterized.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, Final, Self

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.data.tables import TableTransactionError, UpdateMode

from adapters.store.active_index import DEFAULT_GRACE, ActiveOrderIndex
from adapters.store.circuits import CircuitTable
from adapters.store.error_index import ErrorOrderIndex
from adapters.store.purge_log import PurgeLog
from adapters.store.rows import (
    DETAILS_ROW,
    PROCESS_ROW,
    TIMELINE_END,
    TIMELINE_PREFIX,
    ActivePage,
    ActiveRow,
    AlreadyExists,
    ConcurrencyConflict,
    CorruptOrderState,
    OrderNotFound,
    OrderRecord,
    Unconfirmed,
    details_entity,
    etag_of,
    get_json,
    if_unchanged,
    order_entity,
    order_from_entity,
    timeline_entity,
    timeline_from_entity,
    timeline_row_key,
    utc,
)
from adapters.store.supervision import SupervisionTable
from adapters.tables import Entity, Table, TableService, may_have_applied
from domain import ids
from domain.messages import OrderSubmitted, utc_now
from domain.order import Order, TimelineEntry
from domain.retention import (
    MAX_BATCH,
    PURGEABLE_STATES,
    Candidate,
    DeleteOutcome,
    OrderSnapshot,
    delete_plan,
)
from domain.states import ProcessState

DEFAULT_ORDERS_TABLE: Final = "orders"
DEFAULT_ACTIVE_TABLE: Final = "activeorders"
DEFAULT_SUPERVISION_TABLE: Final = "supervision"
PURGE_MARKER_ROW: Final = "purging"
"""Written by the first transaction of a purge that needs several; deleted by the last."""


class OrderStateStore:
    """Reads and ETag-conditional writes of orders; see the module docstring for the rules.

    Give it a :class:`adapters.tables.TableService` built any way (connection string
    locally, managed identity in Azure). Call :meth:`ensure_tables` once at startup. Safe to
    call from several threads.
    """

    def __init__(
        self,
        service: TableService,
        *,
        orders_table: str = DEFAULT_ORDERS_TABLE,
        active_table: str = DEFAULT_ACTIVE_TABLE,
        supervision_table: str = DEFAULT_SUPERVISION_TABLE,
        clock: Callable[[], datetime] = utc_now,
        owns_service: bool = False,
    ) -> None:
        self._service = service
        self._orders_name = ids.validate_table_name(orders_table)
        self._active_name = ids.validate_table_name(active_table)
        self._supervision_name = ids.validate_table_name(supervision_table)
        names = (self._orders_name, self._active_name, self._supervision_name)
        if len({name.lower() for name in names}) != 3:
            raise ValueError("the orders, active-order and supervision tables must differ")
        self._orders: Table = service.get_table_client(self._orders_name)
        self._active: Table = service.get_table_client(self._active_name)
        self.index = ActiveOrderIndex(self._active, clock)
        """The active-order index; the Supervisor lists and reaps through it."""
        self.errors = ErrorOrderIndex(self._orders, clock)
        """The index of orders in Error (a partition of the orders table)."""
        self.purges = PurgeLog(self._orders)
        """The record of purge runs (a partition of the orders table)."""
        self._supervision: Table = service.get_table_client(self._supervision_name)
        self.supervision = SupervisionTable(self._supervision)
        """The Supervisor instances' bucket leases and sweep checkpoints."""
        self.circuits = CircuitTable(self._supervision)
        """Each instance's circuit breakers, as the dashboard shows them."""
        self._clock = clock
        self._owns_service = owns_service

    @classmethod
    def from_connection_string(cls, connection_string: str, **kwargs: Any) -> Self:
        service = TableService.from_connection_string(connection_string)
        return cls(service, owns_service=True, **kwargs)

    @property
    def orders_table(self) -> str:
        return self._orders_name

    async def ensure_tables(self) -> None:
        for name in (self._orders_name, self._active_name, self._supervision_name):
            await self._service.create_table_if_not_exists(name)

    async def close(self) -> None:
        """The tables' clients share the service's pipeline: closing the service closes them."""
        if self._owns_service:
            await self._service.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # ----------------------------------------------------------------------------- create

    async def create(
        self,
        submitted: OrderSubmitted,
        order: Order,
        entry: TimelineEntry,
        *,
        due: datetime | None = None,
    ) -> Order | AlreadyExists:
        """Insert a new order with its details and first timeline row in one transaction; or,
        when the id is taken, what is stored under it. Its index row first, due at ``due``
        (default: at once, which is always safe; see adapters.store.active_index)."""
        order_id = ids.validate_order_id(order.order_id)
        ids.validate_instance_id(entry.actor, "actor")
        payload_hash = submitted.content_hash()
        order = dataclasses.replace(order, write_id=uuid.uuid4().hex)
        operations: list[tuple[str, dict[str, Any]]] = [
            ("create", details_entity(submitted, payload_hash)),
            ("create", order_entity(order)),
            ("create", timeline_entity(order_id, entry)),
        ]
        added = await self.index.add(order_id, order.generation, order.workflow, due)
        try:
            results = await self._orders.submit_transaction(operations)
        except AzureError as exc:
            taken = _entity_exists(exc)
            if not taken and not may_have_applied(exc):
                raise
            # The id is taken (by another create, or by this one: an SDK resend's 409), or the
            # answer was lost: the rows say which.
            existing = await self._existing(order, payload_hash, remove_index_row=added)
            if existing is not None:
                return existing
            if taken:
                raise CorruptOrderState(
                    f"order {order_id} has rows but no details row and no process row; an "
                    "earlier write was not one transaction"
                ) from None
            raise  # it did not land: the submission comes again and is decided again
        return dataclasses.replace(order, etag=results[1]["etag"])

    async def _existing(
        self, created: Order, payload_hash: str, *, remove_index_row: bool
    ) -> Order | AlreadyExists | None:
        """What is stored under ``created``'s id (two point reads): ``created`` itself if its
        create landed (the process row carries its WriteId), None if there are no rows."""
        order_id = created.order_id
        details, process = await self._details_and_process(order_id)
        if details is None and process is None:
            return None
        if details is None or process is None:
            raise CorruptOrderState(
                f"order {order_id} has rows but no {'details' if details is None else 'process'}"
                " row; an earlier write was not one transaction"
            )
        order = order_from_entity(process, etag_of(process))
        if order.write_id == created.write_id:
            return order
        if remove_index_row and (order.state.terminal or order.generation != 1):
            # This create just added the generation-1 index row of an order long past it.
            await self.index.discard(order_id, 1)
        existing_hash = details.get("PayloadHash", "")
        return AlreadyExists(existing_hash == payload_hash, existing_hash, order)

    # ------------------------------------------------------------------------------ reads

    async def load(self, order_id: str) -> Order:
        """The order's state: one point read of its ``process`` row (with its ETag)."""
        order_id = ids.validate_order_id(order_id)
        try:
            entity = await self._orders.get_entity(order_id, PROCESS_ROW)
        except ResourceNotFoundError:
            raise OrderNotFound(order_id) from None
        return order_from_entity(entity, etag_of(entity))

    async def find(self, order_id: str) -> Order | None:
        try:
            return await self.load(order_id)
        except OrderNotFound:
            return None

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

    async def _details_and_process(self, order_id: str) -> tuple[Entity | None, Entity | None]:
        """The order's details and process rows (None for one that does not exist): two point
        reads. A partition query would do it in one request, but Azurite answers any query by
        scanning the whole table, and a duplicate submission is on the hot path."""
        rows: list[Entity | None] = [None, None]
        for n, row_key in enumerate((DETAILS_ROW, PROCESS_ROW)):
            with contextlib.suppress(ResourceNotFoundError):
                rows[n] = await self._orders.get_entity(order_id, row_key)
        return rows[0], rows[1]

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

    # ----------------------------------------------------------------------------- writes

    async def save(
        self, before: Order, after: Order, entry: TimelineEntry, *, due: datetime | None = None
    ) -> Order:
        """Replace ``before`` with ``after`` and append ``entry``: one batch, conditional on
        ``before``'s ETag. With ``due``, the order's index row is first written due then (an
        order back in flight, or one whose due time moves earlier: adapters.store.active_index).

        Raises :class:`ConcurrencyConflict` if the order changed since ``before`` was read (load
        it again and decide again) and :class:`OrderNotFound` if it is gone.
        """
        ids.validate_order_id(before.order_id)
        ids.validate_instance_id(entry.actor, "actor")
        ids.validate_name(entry.event, "event")
        after = dataclasses.replace(after, write_id=uuid.uuid4().hex)
        replace = {"mode": UpdateMode.REPLACE, **if_unchanged(before.etag)}
        operations: list[tuple[Any, ...]] = [
            ("update", order_entity(after), replace),
            ("create", timeline_entity(before.order_id, entry)),
        ]
        if due is not None or (before.state.terminal and after.state.in_flight):
            await self.index.put(after.order_id, after.generation, after.workflow, due)
        error_row = None
        if after.state is ProcessState.ERROR and before.state is not ProcessState.ERROR:
            error_row = await self.errors.put(after.order_id, after.generation)
        try:
            saved = await self._submit(before, after, operations)
        except (ConcurrencyConflict, OrderNotFound) as lost:
            # An unconfirmed write may still land: its Error row stays (listings verify rows
            # against their orders and reap strays).
            if error_row is not None and not isinstance(lost, Unconfirmed):
                await self.errors.discard(after.order_id, after.generation, etag=error_row)
            raise
        if before.state is ProcessState.ERROR and after.state is not ProcessState.ERROR:
            await self.errors.discard(before.order_id, before.generation)
        return saved

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

    async def _submit(
        self, before: Order, after: Order, operations: list[tuple[Any, ...]]
    ) -> Order:
        try:
            results = await self._orders.submit_transaction(operations)
        except AzureError as exc:
            refused = exc.status_code if isinstance(exc, TableTransactionError) else None
            if refused == 404:
                raise OrderNotFound(before.order_id) from None
            if refused == 412 or _entity_exists(exc):
                # 412: the process row changed; 409: our timeline row exists. Either way someone
                # else wrote - unless that someone was an SDK resend of this very batch.
                error, lost = ConcurrencyConflict, ""
            elif may_have_applied(exc):
                error, lost = Unconfirmed, f"the write's answer was lost ({exc}); "
            else:
                raise
        else:
            return dataclasses.replace(after, etag=results[0]["etag"])
        stored = await self.find(before.order_id)
        if stored is not None and stored.write_id == after.write_id:
            return stored
        raise error(before.order_id, lost + _moved(before, stored)) from None

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

    async def reap_active(
        self, row: ActiveRow, order: Order | None, *, grace: timedelta = DEFAULT_GRACE
    ) -> bool:
        """Delete an index row that is garbage (see :meth:`ActiveOrderIndex.reap`)."""
        return await self.index.reap(row, order, grace=grace)


def _submitted(order_id: str, details: Entity) -> OrderSubmitted:
    try:
        return OrderSubmitted.model_validate_json(get_json(details, "Payload") or "")
    except ValueError as exc:
        raise CorruptOrderState(f"details of order {order_id} are unreadable: {exc}") from None


def _key(partition_key: str, row_key: str) -> dict[str, Any]:
    return {"PartitionKey": partition_key, "RowKey": row_key}


def _entity_exists(error: Exception) -> bool:
    # Only a row that already exists; a 409 can also mean e.g. a table being deleted.
    return (
        isinstance(error, TableTransactionError)
        and error.status_code == 409
        and getattr(error, "error_code", None) == "EntityAlreadyExists"
    )


def _moved(before: Order, stored: Order | None) -> str:
    now = f"{stored.state} at {stored.timeline_seq}" if stored else "gone"
    return f"expected {before.state} at timeline {before.timeline_seq}; now {now}"
