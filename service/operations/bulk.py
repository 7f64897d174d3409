"""Bulk resubmit and cancel: which orders a filter selects, each then acted on exactly as one
order is (:mod:`service.control`), so the lifecycle decides for each.

Selection walks the listing (:mod:`service.listing`) in index order, at most ``limit``
orders and ``MAX_SCAN`` rows per call; ``more`` says to run it again. A dry run only selects.
A confirmed run may name the orders its dry run listed (``order_ids``): each is read again and
acted on only if it still matches, so an operator never acts on an order they did not see.
Each order's outcome is listed: acted on, refused (and why), skipped (no longer matches), or what
a dry run would do.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Final, Literal

from adapters.store.state_store import OrderStateStore
from domain import ids
from domain.order import Order
from domain.states import ProcessState
from service.listing import MAX_LIMIT, OrderFilter, list_orders
from service.operations import filters, orders, validation
from service.operations.context import OperatorContext
from service.operations.errors import InvalidRequest, OperatorError
from service.operations.filters import state_of
from service.operations.models import BulkItem, BulkView, OrderSummary

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
            size = min(MAX_LIMIT, limit + 1 - len(found))
            listing = await list_orders(store, state, where=where, limit=size, cursor=cursor)
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


async def bulk(
    ctx: OperatorContext,
    action: BulkAction,
    *,
    operator: str,
    reason: str | None,
    state: str | None = None,
    step: str | None = None,
    older_than: str | None = None,
    newer_than: str | None = None,
    text: str | None = None,
    dry_run: bool = False,
    order_ids: Sequence[str] | None = None,
    limit: int = MAX_BULK,
) -> BulkView:
    """Resubmit or cancel the orders a filter selects (a state, step, age or text; at
    least one), at most ``limit``; a dry run only lists them. With ``order_ids`` (what a
    dry run listed), only those, each if it still matches."""
    actor = validation.operator_actor(operator)
    if action not in STATES:
        raise InvalidRequest("invalid_request", "action must be resubmit or cancel")
    validation.dry_run(dry_run)
    why = "" if dry_run and not reason else validation.reason(reason)
    states = states_for(action, state)
    chosen = orders.criteria(ctx, step, older_than, newer_than, text)
    if state in (None, "") and chosen.where.empty:
        raise InvalidRequest(
            "empty_filter",
            "say which orders: a state, step, age or text filter (or name one order)",
        )
    validation.check_limit(limit, MAX_BULK)
    shown = chosen.shown | ({"state": str(state)} if state else {})
    if order_ids is None:
        selected, more = await select(ctx.rt.store, states, chosen.where, limit)
        candidates: list[tuple[str, Order | None]] = [(o.order_id, o) for o in selected]
    else:
        candidates = [(i, await ctx.rt.store.find(i)) for i in named(order_ids)]
        more = False
    items = [
        await _item(ctx, action, order_id, order, states, chosen, actor, why, dry_run)
        for order_id, order in candidates
    ]
    return BulkView(
        action=action,
        dry_run=dry_run,
        states=[s.value for s in states],
        filters=shown,
        items=items,
        acted=sum(1 for item in items if item.state is not None),
        more=more,
    )


async def _item(
    ctx: OperatorContext,
    action: BulkAction,
    order_id: str,
    order: Order | None,
    states: Sequence[ProcessState],
    chosen: filters.Criteria,
    actor: str,
    reason: str,
    dry_run: bool,
) -> BulkItem:
    item = functools.partial(
        BulkItem, order_id=order_id, order=OrderSummary.of(order) if order is not None else None
    )
    if order is None or order.state not in states or not chosen.where.matches(order):
        detail = "no longer matches the filter" if order else "no longer exists"
        return item(outcome="skipped", detail=detail, state=None)
    if dry_run:
        return item(outcome=f"would_{action}", detail="", state=None)
    act = orders.resubmit if action == "resubmit" else orders.cancel
    try:
        done = await act(ctx, order_id, operator=actor, reason=reason)
    except OperatorError as refused:
        return item(outcome="refused", detail=f"{refused.message} ({refused.code})", state=None)
    return item(outcome=done.outcome, detail=done.detail, state=done.state)
