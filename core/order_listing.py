"""Orders by state, paged, at a cost that ignores the order history.

The orders table has one partition per order, so "all orders in state X" would be a scan of
every order ever processed. Instead each listable state is read from an index that holds only
the orders that can be in it:

- Pending, Processing, Compensating: the active-order index (:mod:`core.active_index`), one row
  per order generation in flight.
- Error: the Error index (:mod:`core.error_index`), one row per order in Error.
- Processed is not listable: it is the whole history. Look a processed order up by its id.

Neither index copies the state (a copy written outside the order's own transaction could be
stale), so each index row is verified with a point read of its process row. A page therefore
costs one index query per ``FETCH`` rows looked at plus one point read per row looked at:
for Error about ``limit + 1`` requests, for an in-flight state ``1 + rows looked at`` (at most
``max_scan``; rows of other in-flight states are skipped). A page may hold fewer than ``limit``
orders, even none, and still have a cursor: follow cursors until one is None.

Cursors are opaque strings naming the state and the index key after which to go on; one made
for another state, or not made here at all, is refused with :class:`InvalidCursor`.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Final

from core.active_index import ActiveRow
from core.error_index import ERROR_PARTITION, ErrorRow
from core.order import Order
from core.state_store import OrderStateStore
from core.states import ProcessState

MAX_LIMIT: Final = 100
MAX_SCAN: Final = 500
FETCH: Final = 200
_CURSOR_VERSION: Final = 1


class NotListable(ValueError):
    """A state with no index (Processed)."""


class InvalidCursor(ValueError):
    """A cursor this module did not make for this state."""


@dataclass(frozen=True, slots=True)
class OrderListing:
    state: ProcessState
    orders: tuple[Order, ...]
    cursor: str | None
    """Pass it back to go on; None: there is nothing more."""
    scanned: int
    """Index rows looked at for this page (each cost a point read)."""


LISTABLE_STATES: Final = (
    ProcessState.PENDING,
    ProcessState.PROCESSING,
    ProcessState.COMPENSATING,
    ProcessState.ERROR,
)


def list_orders(
    store: OrderStateStore,
    state: ProcessState,
    *,
    limit: int = 50,
    cursor: str | None = None,
    max_scan: int = MAX_SCAN,
) -> OrderListing:
    """Up to ``limit`` orders now in ``state``, in index key order, and where to go on."""
    if state not in LISTABLE_STATES:
        raise NotListable(
            f"orders in state {state} are not listed (that would scan the whole history); "
            f"listable states: {', '.join(s.value for s in LISTABLE_STATES)}. Show a processed "
            "order by its id."
        )
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be from 1 to {MAX_LIMIT}")
    after = decode_cursor(cursor, state)
    found: list[Order] = []
    scanned = 0
    more = True
    while more and len(found) < limit and scanned < max_scan:
        rows, more = _fetch(store, state, min(FETCH, max_scan - scanned), after)
        for position, row in enumerate(rows):
            scanned += 1
            after = _key(row)
            process = store.find(row.order_id)
            if _matches(process, row, state):
                assert process is not None
                found.append(process)
            elif isinstance(row, ErrorRow):
                store.errors.reap(row, process)
            if len(found) >= limit or scanned >= max_scan:
                more = more or position < len(rows) - 1
                break
    next_cursor = encode_cursor(state, after) if more and after is not None else None
    return OrderListing(state=state, orders=tuple(found), cursor=next_cursor, scanned=scanned)


def _fetch(
    store: OrderStateStore, state: ProcessState, size: int, after: tuple[str, str] | None
) -> tuple[tuple[ActiveRow, ...] | tuple[ErrorRow, ...], bool]:
    if state is ProcessState.ERROR:
        page = store.errors.page(size, after=after[1] if after else None)
        return page.rows, page.last_key is not None
    return store.index.page_after(size, after=after)


def _key(row: ActiveRow | ErrorRow) -> tuple[str, str]:
    if isinstance(row, ErrorRow):
        return (ERROR_PARTITION, row.row_key)
    return (row.partition_key, row.row_key)


def _matches(process: Order | None, row: ActiveRow | ErrorRow, state: ProcessState) -> bool:
    return process is not None and process.state is state and process.generation == row.generation


def encode_cursor(state: ProcessState, after: tuple[str, str]) -> str:
    data = {"v": _CURSOR_VERSION, "s": state.value, "pk": after[0], "rk": after[1]}
    raw = json.dumps(data, separators=(",", ":")).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str | None, state: ProcessState) -> tuple[str, str] | None:
    if cursor is None:
        return None
    bad = InvalidCursor(
        "cursor is not one returned by a listing of this state; start again without it"
    )
    if not isinstance(cursor, str) or len(cursor) > 1024:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise bad from None
    if (
        not isinstance(data, dict)
        or data.get("v") != _CURSOR_VERSION
        or data.get("s") != state.value
        or not isinstance(data.get("pk"), str)
        or not isinstance(data.get("rk"), str)
    ):
        raise bad
    return data["pk"], data["rk"]
