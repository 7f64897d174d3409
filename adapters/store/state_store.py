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

Operators' reads, the annotation an operator's action records and the retention purge are
:class:`adapters.store.records.OrderRecords`'s: the pattern app never does them.

Every id is validated (:mod:`domain.ids`) before any request; every filter is parameterized.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Final, Self

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.data.tables import TableTransactionError, UpdateMode

from adapters.store.active_index import DEFAULT_GRACE, ActiveOrderIndex
from adapters.store.circuits import CircuitTable
from adapters.store.error_index import ErrorOrderIndex
from adapters.store.rows import (
    DETAILS_ROW,
    PROCESS_ROW,
    ActiveRow,
    AlreadyExists,
    ConcurrencyConflict,
    CorruptOrderState,
    OrderNotFound,
    Unconfirmed,
    details_entity,
    etag_of,
    if_unchanged,
    order_entity,
    order_from_entity,
    timeline_entity,
)
from adapters.store.supervision import SupervisionTable
from adapters.tables import Entity, Table, TableService, may_have_applied
from domain import ids
from domain.messages import OrderSubmitted, utc_now
from domain.order import Order, TimelineEntry
from domain.states import ProcessState

DEFAULT_ORDERS_TABLE: Final = "orders"
DEFAULT_ACTIVE_TABLE: Final = "activeorders"
DEFAULT_SUPERVISION_TABLE: Final = "supervision"


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

    async def _details_and_process(self, order_id: str) -> tuple[Entity | None, Entity | None]:
        """The order's details and process rows (None for one that does not exist): two point
        reads. A partition query would do it in one request, but Azurite answers any query by
        scanning the whole table, and a duplicate submission is on the hot path."""
        rows: list[Entity | None] = [None, None]
        for n, row_key in enumerate((DETAILS_ROW, PROCESS_ROW)):
            with contextlib.suppress(ResourceNotFoundError):
                rows[n] = await self._orders.get_entity(order_id, row_key)
        return rows[0], rows[1]

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

    # ------------------------------------------------------------------------------ index

    async def reap_active(
        self, row: ActiveRow, order: Order | None, *, grace: timedelta = DEFAULT_GRACE
    ) -> bool:
        """Delete an index row that is garbage (see :meth:`ActiveOrderIndex.reap`)."""
        return await self.index.reap(row, order, grace=grace)


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
