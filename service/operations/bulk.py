"""Bulk resubmit and cancel: which orders a filter selects, each then acted on exactly as one
order is (:mod:`service.control`), so the lifecycle decides for each.

Selection walks the listing (:mod:`service.listing`) in index order, at most ``limit``
orders and ``MAX_SCAN`` rows per call; ``more`` says to run it again. A dry run only selects.
A confirmed run may name the orders its dry run listed (``order_ids``): each is read again and
acted on only if it still matches, so an operator never acts on an order they did not see.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

from adapters.store.state_store import OrderStateStore
from domain import ids
from domain.order import Order
from domain.states import ProcessState
from service.listing import MAX_LIMIT, OrderFilter, list_orders
from service.operations.errors import InvalidRequest
from service.operations.filters import state_of

BulkAction = Literal["resubmit", "cancel"]
MAX_BULK: Final = 100
MAX_SCAN: Final = 2000
STATES: Final[dict[str, tuple[ProcessState, ...]]] = {
    "resubmit": (ProcessState.ERROR,),
    "cancel": (ProcessState.PENDING, ProcessState.PROCESSING),
}


def states_for(action: BulkAction, state: object) -> tuple[ProcessState, ...]:
    if state is None or state == "":
        return STATES[action]
    wanted = state_of(state)
    if wanted not in STATES[action]:
        allowed = " or ".join(s.value for s in STATES[action])
        raise InvalidRequest(
            "invalid_state", f"{action} applies to {allowed} orders, not to {wanted} ones"
        )
    return (wanted,)


async def select(
    store: OrderStateStore,
    states: Sequence[ProcessState],
    where: OrderFilter,
    limit: int,
) -> tuple[list[Order], bool]:
    """Up to ``limit`` orders in ``states`` that ``where`` keeps, and whether more may match."""
    found: list[Order] = []
    scanned = 0
    for state in states:
        cursor = None
        while True:
            listing = await list_orders(
                store,
                state,
                where=where,
                limit=min(MAX_LIMIT, limit + 1 - len(found)),
                cursor=cursor,
            )
            found += listing.orders
            scanned += listing.scanned
            cursor = listing.cursor
            if len(found) > limit:
                return found[:limit], True
            if cursor is None:
                break
            if scanned >= MAX_SCAN:
                return found, True
    return found, False


def named(order_ids: object) -> list[str]:
    """The order ids a confirmed run names, validated."""
    if not isinstance(order_ids, list | tuple) or not 1 <= len(order_ids) <= MAX_BULK:
        raise InvalidRequest("invalid_request", f"order_ids must list 1 to {MAX_BULK} order ids")
    try:
        return list(dict.fromkeys(ids.validate_order_id(order_id) for order_id in order_ids))
    except ids.InvalidId as exc:
        raise InvalidRequest("invalid_order_id", str(exc)) from None


def still_matches(order: Order | None, states: Sequence[ProcessState], where: OrderFilter) -> bool:
    return order is not None and order.state in states and where.matches(order)
