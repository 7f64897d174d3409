"""Orders: listing them by state with filters and a sort (:mod:`service.listing`: what each
costs), showing one (per step, what its timeline says it went through:
:mod:`service.operations.step_activity`), watching one for its next change (the CLI's ``--watch``
and ``--wait``), and the actions on one order: resubmit, cancel and restart
(:mod:`service.control`), each naming the operator and saying why.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

from adapters.store.rows import OrderNotFound
from domain.states import ProcessState
from service import control
from service.listing import MAX_LIMIT, InvalidCursor
from service.listing import list_orders as list_by_state
from service.operations import filters, validation
from service.operations.context import OperatorContext
from service.operations.errors import Busy, Conflict, InvalidRequest, NotFound, OperatorError
from service.operations.models import ActionView, OrderDetail, OrderPage, OrderSummary, WatchView

audit = logging.getLogger("operator_api.audit")

MAX_TIMELINE_LIMIT: Final = 1000
MAX_WAIT_SECONDS: Final = 60.0
WATCH_POLL_SECONDS: Final = 0.5
"""How often a watch reads the order (one point read) while it waits for a change."""
_REFUSALS: Final[dict[str, tuple[type[OperatorError], str]]] = {
    "not_found": (NotFound, "order_not_found"),
    "busy": (Busy, "busy"),
    "invalid": (InvalidRequest, "unknown_step"),
}
"""The lifecycle's refusals by code, as operator errors (any other: wrong_state, 409)."""


async def list_orders(
    ctx: OperatorContext,
    state: str,
    *,
    step: str | None = None,
    older_than: str | None = None,
    newer_than: str | None = None,
    text: str | None = None,
    sort: str | None = None,
    limit: int = 50,
    continuation: str | None = None,
) -> OrderPage:
    """Orders now in ``state`` (any state; Processed from a bounded query of the orders
    table), filtered by current step, age (``older_than``/``newer_than``: 90s, 15m, 2h,
    7d since created) and text (in the id, last error or compensation reason), sorted
    (``index``, ``id``, ``created``, ``updated``, ``-`` newest first), paged."""
    wanted = filters.state_of(state)
    validation.check_limit(limit, MAX_LIMIT)
    order_by = filters.sort_of(sort)
    chosen = criteria(ctx, step, older_than, newer_than, text)
    history = ctx.orders_table() if wanted is ProcessState.PROCESSED else None
    try:
        listing = await list_by_state(
            ctx.rt.store,
            wanted,
            where=chosen.where,
            sort=order_by,
            limit=limit,
            cursor=continuation,
            history=history,
        )
    except InvalidCursor as exc:
        raise InvalidRequest("invalid_continuation", str(exc)) from None
    return OrderPage(
        state=wanted.value,
        sort=order_by,
        filters=chosen.shown,
        items=[OrderSummary.of(p) for p in listing.orders],
        continuation=listing.cursor,
        scanned=listing.scanned,
        partial=listing.partial,
    )


def criteria(
    ctx: OperatorContext, step: object, older_than: object, newer_than: object, text: object
) -> filters.Criteria:
    """The filters given, read against the app's workflows and clock."""
    return filters.criteria(
        now=ctx.rt.clock(),
        workflows=ctx.rt.workflows,
        step=step,
        older_than=older_than,
        newer_than=newer_than,
        text=text,
    )


async def show_order(
    ctx: OperatorContext, order_id: str, *, timeline_after: int = -1, timeline_limit: int = 200
) -> OrderDetail:
    """One order: its state, submitted details, steps (state, generation, attempts, and
    what the timeline says each went through) and timeline (paged)."""
    order_id = validation.order_id(order_id)
    if not _integer(timeline_after) or not -1 <= timeline_after <= 10**8:
        raise InvalidRequest("invalid_request", "timeline_after must be an integer >= -1")
    validation.check_limit(timeline_limit, MAX_TIMELINE_LIMIT, name="timeline_limit")
    store = ctx.rt.store
    try:
        order = await store.get_order(order_id)
    except OrderNotFound:
        raise NotFound("order_not_found", f"order {order_id} does not exist") from None
    entries = await store.get_timeline(order_id, after_seq=timeline_after, limit=timeline_limit + 1)
    more = len(entries) > timeline_limit
    whole = timeline_after < 0 and not more
    history = entries if whole else await store.get_timeline(order_id, limit=MAX_TIMELINE_LIMIT)
    now = ctx.rt.clock()
    return OrderDetail.of(order, entries[:timeline_limit], more, history=history, now=now)


async def watch_order(
    ctx: OperatorContext, order_id: str, *, after_seq: int = -1, wait_s: float = 20.0
) -> WatchView:
    """The order once it has changed since its timeline entry ``after_seq`` (its new
    entries), or after ``wait_s`` seconds without a change; at once if it is finished.
    While it waits it reads the order every half second (one point read)."""
    order_id = validation.order_id(order_id)
    if not _integer(after_seq) or after_seq < -1:
        raise InvalidRequest("invalid_request", "after must be an integer >= -1")
    if not _integer(wait_s, float) or not 0 <= wait_s <= MAX_WAIT_SECONDS:
        raise InvalidRequest("invalid_wait", f"wait must be 0 to {MAX_WAIT_SECONDS:g} s")
    deadline = time.monotonic() + wait_s
    while True:
        order = await ctx.rt.store.find(order_id)
        if order is None:
            raise NotFound("order_not_found", f"order {order_id} does not exist")
        remaining = deadline - time.monotonic()
        if order.timeline_seq > after_seq or order.state.terminal or remaining <= 0:
            break
        await ctx.sleep(min(WATCH_POLL_SECONDS, remaining))
    detail = await show_order(ctx, order_id, timeline_after=after_seq)
    return WatchView(
        changed=bool(detail.timeline),
        terminal=ProcessState(detail.order.state).terminal,
        detail=detail,
    )


async def resubmit(
    ctx: OperatorContext, order_id: str, *, operator: str, reason: str
) -> ActionView:
    """Resubmit an Error order (resume at the failed step, or resume its compensation)."""
    return await _act(ctx, control.resubmit, order_id, operator, reason)


async def cancel(ctx: OperatorContext, order_id: str, *, operator: str, reason: str) -> ActionView:
    """Cancel a Pending or Processing order: at once, undo every step that may have taken
    effect (the one in flight too), then Error "cancelled" (see :mod:`service.control`)."""
    return await _act(ctx, control.cancel, order_id, operator, reason)


async def restart(
    ctx: OperatorContext, order_id: str, *, step: str | None, operator: str, reason: str | None
) -> ActionView:
    """Restart an Error order from ``step``: it and every later step are redone (next
    generation), even a kept result; the steps before it resume as a resubmit does."""
    act = functools.partial(control.restart, step=filters.step_name(step))
    return await _act(ctx, act, order_id, operator, reason)


async def _act(
    ctx: OperatorContext,
    action: Callable[..., Awaitable[control.ActionResult]],
    order_id: str,
    operator: str,
    reason: str,
) -> ActionView:
    order_id = validation.order_id(order_id)
    actor = validation.operator_actor(operator)
    reason = validation.reason(reason)
    try:
        result = await action(ctx.rt, order_id, actor=actor, reason=reason)
    except control.Refused as refused:
        error, code = _REFUSALS.get(refused.code, (Conflict, "wrong_state"))
        raise error(code, refused.message) from None
    audit.info("%s %s %s: %s", actor, result.action, order_id, result.outcome)
    return ActionView.model_validate(result, from_attributes=True)


def _integer(value: object, *also: type) -> bool:
    """An int (not a bool), or one of the types ``also``."""
    return not isinstance(value, bool) and isinstance(value, (int, *also))
