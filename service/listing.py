"""Orders by state, filtered, sorted and paged, at a cost that ignores the order history where
it can.

The orders table has one partition per order, so "all orders in state X" is a scan of every
order ever processed. The states an order can be stuck in are read from an index that holds
only the orders that can be in them:

- Pending, Processing, Compensating: the active-order index (:mod:`adapters.store.active_index`),
one row
  per order generation in flight.
- Error: the Error index (:mod:`adapters.store.error_index`), one row per order in Error.

Neither index copies the state (a copy written outside the order's own transaction could be
stale), so each index row is verified with a point read of its process row: a page costs one
index query per ``FETCH`` rows looked at plus one point read per row looked at (at most
``max_scan``). Rows of other states, and orders the filter leaves out, are skipped.

- Processed has no index (one would add a write to every order's hot path). It is read from the
  orders table itself with a query on the process rows (``RowKey eq 'process' and ProcessState
  eq 'Processed'``, plus the step and age filters), selecting the summary's columns only. The
  service scans the table to answer it, so one call makes at most ``MAX_HISTORY_REQUESTS``
  requests of up to ``FETCH`` rows and then stops with a cursor; with retention in force the
  table holds at most RETENTION_DAYS of history. Operator reads only: nothing on the hot path.

Filters (:class:`OrderFilter`): the current step, the age (when the order was created) and a
text found in the order id, its last error or its compensation reason (case-insensitive).

Sorting: ``index`` (the default) walks the source in its own key order and pages with a cursor,
so each page costs what it looks at. Any other sort (``id``, ``created``, ``updated``, ``-`` for
newest first) reads every candidate up to ``max_scan`` (Processed: up to the request budget),
sorts them and returns the ``limit`` after the cursor; ``partial`` says the candidates did not
all fit, so the order covers only those read (narrow the filter). Every page repeats that read.

A page may hold fewer than ``limit`` orders, even none, and still have a cursor: follow cursors
until one is None. Cursors are opaque strings naming the state, the sort and where to go on; one
made for another state or sort, or not made here at all, is refused with :class:`InvalidCursor`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from adapters.store.active_index import ActiveRow
from adapters.store.error_index import ERROR_PARTITION, ErrorRow
from adapters.store.rows import PROCESS_ROW, etag_of, order_from_entity, utc
from adapters.store.state_store import OrderStateStore
from adapters.tables import Table
from domain.order import Order
from domain.states import ProcessState

MAX_LIMIT: Final = 100
MAX_SCAN: Final = 500
FETCH: Final = 200
MAX_HISTORY_REQUESTS: Final = 5
MAX_TEXT: Final = 200
_CURSOR_VERSION: Final = 1

LISTABLE_STATES: Final = (
    ProcessState.PENDING,
    ProcessState.PROCESSING,
    ProcessState.COMPENSATING,
    ProcessState.ERROR,
    ProcessState.PROCESSED,
)
SORTS: Final = ("index", "id", "created", "-created", "updated", "-updated")
SUMMARY_COLUMNS: Final = [
    "PartitionKey", "RowKey", "OrderID", "Workflow", "ProcessState", "LockedBy", "CompleteBy",
    "FailureCount", "Attempt", "Generation", "CurrentStep", "CurrentOperation", "ReplyTo",
    "LastError", "NextAttemptAt", "CreatedAt", "UpdatedAt", "TimelineSeq", "CompensationCause",
    "CompensationReason",
]  # fmt: skip
"""What a Processed listing reads of each process row: not its steps, payload or outbox."""


class NotListable(ValueError):
    """A state this listing cannot read here (Processed without the orders table)."""


class InvalidCursor(ValueError):
    """A cursor this module did not make for this state and sort."""


@dataclass(frozen=True, slots=True)
class OrderFilter:
    """Which orders a listing keeps; None: any."""

    step: str | None = None
    created_before: datetime | None = None
    created_after: datetime | None = None
    text: str | None = None

    @property
    def empty(self) -> bool:
        return self == OrderFilter()

    def matches(self, order: Order) -> bool:
        if self.step is not None and order.current_step != self.step:
            return False
        if self.created_before is not None and not order.created_at < self.created_before:
            return False
        if self.created_after is not None and not order.created_at > self.created_after:
            return False
        if self.text:
            needle = self.text.casefold()
            fields = (order.order_id, order.last_error, order.compensation_reason)
            return any(needle in field.casefold() for field in fields if field)
        return True


ANY: Final = OrderFilter()


@dataclass(frozen=True, slots=True)
class OrderListing:
    state: ProcessState
    orders: tuple[Order, ...]
    cursor: str | None
    """Pass it back to go on; None: there is nothing more."""
    scanned: int
    """Rows looked at for this page (index rows each cost a point read)."""
    partial: bool = False
    """A sorted listing read fewer than all candidates: its order covers those it read."""


async def list_orders(
    store: OrderStateStore,
    state: ProcessState,
    *,
    where: OrderFilter = ANY,
    sort: str = "index",
    limit: int = 50,
    cursor: str | None = None,
    max_scan: int = MAX_SCAN,
    history: Table | None = None,
) -> OrderListing:
    """Up to ``limit`` orders now in ``state`` that ``where`` keeps, and where to go on.

    ``history``: the orders table, needed for Processed (see the module docstring)."""
    if state not in LISTABLE_STATES or (state is ProcessState.PROCESSED and history is None):
        raise NotListable(f"orders in state {state} cannot be listed here")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be from 1 to {MAX_LIMIT}")
    if sort not in SORTS:
        raise ValueError(f"sort must be one of: {', '.join(SORTS)}")
    if sort == "index":
        scan = _Scan(store, history, state, where, decode_cursor(cursor, state), max_scan)
        return await _index_page(scan, limit)
    after = decode_sorted_cursor(cursor, state, sort)
    return await _sorted_page(
        _Scan(store, history, state, where, None, max_scan), sort, limit, after
    )


async def _index_page(scan: _Scan, limit: int) -> OrderListing:
    found: list[Order] = []
    async for order in scan:
        if order is not None:
            found.append(order)
            if len(found) >= limit:
                break
    more = not scan.exhausted and scan.position is not None
    next_cursor = encode_cursor(scan.state, scan.position) if more and scan.position else None
    return OrderListing(scan.state, tuple(found), next_cursor, scan.scanned)


async def _sorted_page(
    scan: _Scan, sort: str, limit: int, after: tuple[str, str] | None
) -> OrderListing:
    key = _sort_key(sort)
    newest_first = sort.startswith("-")
    read = [o async for o in scan if o is not None]
    ordered = sorted(read, key=key, reverse=newest_first)
    if after is not None:
        ordered = [o for o in ordered if (key(o) < after if newest_first else key(o) > after)]
    page = ordered[:limit]
    more = len(ordered) > limit
    next_cursor = encode_sorted_cursor(scan.state, sort, key(page[-1])) if more else None
    return OrderListing(
        scan.state, tuple(page), next_cursor, scan.scanned, partial=not scan.exhausted
    )


def _sort_key(sort: str) -> Callable[[Order], tuple[str, str]]:
    field = sort.lstrip("-")
    if field == "id":
        return lambda o: (o.order_id, "")
    if field == "created":
        return lambda o: (_stamp(o.created_at), o.order_id)
    return lambda o: (_stamp(o.updated_at), o.order_id)


def _stamp(value: datetime) -> str:
    return f"{utc(value):%Y-%m-%dT%H:%M:%S.%f}"


@dataclass
class _Scan:
    """The rows of one state's source from ``position`` on, each examined once. Iterating
    yields, per row, its order if it is one in ``state`` that ``where`` keeps, else None. Once
    iteration stops (or is stopped), ``position`` is the key after which to go on and
    ``exhausted`` says there is nothing after it."""

    store: OrderStateStore
    history: Table | None
    state: ProcessState
    where: OrderFilter
    position: tuple[str, str] | None
    max_scan: int
    scanned: int = 0
    exhausted: bool = False

    def __aiter__(self) -> AsyncIterator[Order | None]:
        if self.state is ProcessState.PROCESSED:
            assert self.history is not None
            return self._history_rows(self.history)
        return self._index_rows()

    async def _index_rows(self) -> AsyncIterator[Order | None]:
        more = True
        while more and self.scanned < self.max_scan:
            size = min(FETCH, self.max_scan - self.scanned)
            rows, more = await _fetch(self.store, self.state, size, self.position)
            for position, row in enumerate(rows):
                self.scanned += 1
                self.position = _key(row)
                self.exhausted = not more and position == len(rows) - 1
                process = await self.store.find(row.order_id)
                if (
                    process is not None
                    and process.state is self.state
                    and process.generation == row.generation
                ):
                    yield process if self.where.matches(process) else None
                    continue
                if isinstance(row, ErrorRow):
                    await self.store.errors.reap(row, process)
                yield None
        self.exhausted = self.exhausted or not more

    async def _history_rows(self, history: Table) -> AsyncIterator[Order | None]:
        condition, parameters = _history_query(self.state, self.where, self.position)
        pages = history.query_entities(
            condition, parameters=parameters, select=SUMMARY_COLUMNS, results_per_page=FETCH
        ).by_page()
        requests = 0
        async for page in pages:
            requests += 1
            rows = list(page)
            token: Any = pages.continuation_token
            for position, entity in enumerate(rows):
                self.scanned += 1
                self.position = (entity["PartitionKey"], PROCESS_ROW)
                self.exhausted = token is None and position == len(rows) - 1
                order = order_from_entity(entity, etag_of(entity))
                yield order if self.where.matches(order) else None
                if self.scanned >= self.max_scan:
                    return
            if token is None:
                self.exhausted = True
                return
            if requests >= MAX_HISTORY_REQUESTS:
                self.position = _resume_at(token)
                return


def _history_query(
    state: ProcessState, where: OrderFilter, after: tuple[str, str] | None
) -> tuple[str, dict[str, Any]]:
    # The SDK substitutes @names only between spaces.
    parts = ["RowKey eq @row", "ProcessState eq @state"]
    parameters: dict[str, Any] = {"row": PROCESS_ROW, "state": state.value}
    if where.step is not None:
        parts.append("CurrentStep eq @step")
        parameters["step"] = where.step
    if where.created_before is not None:
        parts.append("CreatedAt lt @before")
        parameters["before"] = utc(where.created_before)
    if where.created_after is not None:
        parts.append("CreatedAt gt @since")
        parameters["since"] = utc(where.created_after)
    if after is not None:
        # One process row per partition: after (pk, 'process') means the next partition.
        parts.append(
            "PartitionKey gt @after" if after[1] >= PROCESS_ROW else "PartitionKey ge @after"
        )
        parameters["after"] = after[0]
    return " and ".join(parts), parameters


def _resume_at(token: Any) -> tuple[str, str]:
    """The service's continuation (resume *at* this key) as a position to go on *after*."""
    partition, row = token.get("PartitionKey") or "", token.get("RowKey") or ""
    return (partition, "") if row <= PROCESS_ROW else (partition, PROCESS_ROW)


async def _fetch(
    store: OrderStateStore, state: ProcessState, size: int, after: tuple[str, str] | None
) -> tuple[tuple[ActiveRow, ...] | tuple[ErrorRow, ...], bool]:
    if state is ProcessState.ERROR:
        page = await store.errors.page(size, after=after[1] if after else None)
        return page.rows, page.last_key is not None
    return await store.index.page_after(size, after=after)


def _key(row: ActiveRow | ErrorRow) -> tuple[str, str]:
    if isinstance(row, ErrorRow):
        return (ERROR_PARTITION, row.row_key)
    return (row.partition_key, row.row_key)


# -------------------------------------------------------------------------------- cursors


def _encode(data: dict[str, Any]) -> str:
    raw = json.dumps({"v": _CURSOR_VERSION, **data}, separators=(",", ":")).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _decode(cursor: str, valid: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The data of ``cursor``, if ``valid`` says it is a cursor for this listing."""
    bad = InvalidCursor(
        "cursor is not one returned by a listing of this state and sort; start again without it"
    )
    if not isinstance(cursor, str) or len(cursor) > 1024:
        raise bad
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise bad from None
    if not isinstance(data, dict) or data.get("v") != _CURSOR_VERSION or not valid(data):
        raise bad
    return data


def encode_cursor(state: ProcessState, after: tuple[str, str]) -> str:
    return _encode({"s": state.value, "pk": after[0], "rk": after[1]})


def decode_cursor(cursor: str | None, state: ProcessState) -> tuple[str, str] | None:
    if cursor is None:
        return None
    data = _decode(
        cursor,
        lambda d: (
            d.get("s") == state.value
            and "o" not in d
            and isinstance(d.get("pk"), str)
            and isinstance(d.get("rk"), str)
        ),
    )
    return data["pk"], data["rk"]


def encode_sorted_cursor(state: ProcessState, sort: str, after: tuple[str, str]) -> str:
    return _encode({"s": state.value, "o": sort, "k": list(after)})


def decode_sorted_cursor(
    cursor: str | None, state: ProcessState, sort: str
) -> tuple[str, str] | None:
    if cursor is None:
        return None
    data = _decode(
        cursor,
        lambda d: (
            d.get("s") == state.value
            and d.get("o") == sort
            and isinstance(d.get("k"), list)
            and len(d["k"]) == 2
            and all(isinstance(part, str) for part in d["k"])
        ),
    )
    return data["k"][0], data["k"][1]
