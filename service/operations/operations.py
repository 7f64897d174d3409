"""Operator operations: the one implementation behind the HTTP API and the CLI.

Each method takes plain Python values, validates them (a refusal is an
:class:`~service.operations.errors.OperatorError` with an HTTP status, a code and a message), and
returns a pydantic model (``model_dump(mode="json")`` gives the JSON both front ends show)::

    ops = Operations(Runtime.from_settings(Settings.from_env()))
    page = await ops.list_orders("Error", limit=20)
    await ops.resubmit(page.items[0].order_id, operator="alice@example.com", reason="card updated")

Actions (resubmit, cancel, restart, acknowledge, dead-letter replay and purge) name the
operator and say why (``reason``); the timeline records them as ``operator:<name>`` with the
reason. A dead-letter replay or purge is also written, whole, to the dead-letter log
(:mod:`service.operations.dead_letter_log`): that is where an action on messages that name no order
is recorded. Bulk resubmit and cancel
(:mod:`service.operations.bulk`) act on the orders a filter selects, one by one.

Orders are listed by state with filters and a sort (:mod:`service.listing`: what each costs);
:meth:`Operations.watch_order` waits for an order's next change (the CLI's ``--watch`` and
``--wait``). An order's view carries, per step, what its timeline says it went through
(:mod:`service.operations.step_activity`).

Alerts are the messages of the alerts queue, identified by their sequence number; listing and
showing them peeks (nothing changes) and says whether each is resolved, from its order's state
and timeline (:mod:`service.operations.alert_resolution`); acknowledging completes the message (see
:mod:`adapters.queues`) and, when the alert names an order, records the acknowledgement in
that order's timeline. Dead letters are peeked, replayed or purged per queue
(:mod:`service.operations.dead_letter_settler`), the queue named by its role (``orders``,
``commands``, ``responses``, ``alerts``, ``inventory``, ``payment``, ``shipping``), never by a
free-form name.

:meth:`Operations.health` says, cheaply, whether the app can work: settings loaded, the orders
table and Service Bus reachable.

A purge (:mod:`service.purge`) archives, then deletes, finished orders older than a number of days
(the RETENTION_DAYS setting unless given); it is recorded with the operator's name and listed
by :meth:`Operations.purge_runs`. Purged orders are read back from the archive by
:meth:`Operations.archived_order`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import date, timedelta
from typing import Any, Final, Literal

from azure.core.exceptions import ResourceNotFoundError
from azure.servicebus import ServiceBusReceivedMessage
from azure.servicebus.aio import ServiceBusClient

from adapters import archive, clients
from adapters.archive import ArchiveError, BlobArchive
from adapters.queues import QueueTools, body_of
from adapters.store import supervision
from adapters.store.rows import ConcurrencyConflict, OrderNotFound, OrderRecord
from adapters.tables import Table
from domain import ids
from domain.messages import BadMessage, OperatorAlert, excerpt, parse_message
from domain.order import Order
from domain.retention import PURGEABLE_STATES, ack_detail
from domain.states import ProcessState
from service import control
from service.listing import MAX_LIMIT, InvalidCursor, list_orders
from service.operations import alert_resolution, bulk, dead_letter_log, dead_letter_settler, filters
from service.operations.errors import Busy, Conflict, InvalidRequest, NotFound, OperatorError
from service.operations.models import (
    AckView,
    ActionView,
    AlertPage,
    AlertView,
    ArchivedOrderView,
    BucketView,
    BulkItem,
    BulkView,
    DeadLetterActionView,
    DeadLetterCount,
    DeadLetterLogView,
    DeadLetterOutcome,
    DeadLetterPage,
    DeadLetterSummary,
    DeadLetterView,
    HealthCheck,
    HealthView,
    OrderDetail,
    OrderPage,
    OrderSummary,
    PurgeRunsView,
    PurgeView,
    SupervisorView,
    WatchView,
)
from service.purge import PurgeReport, PurgeRequest, open_archive, run_purge
from service.runtime import Runtime

log = logging.getLogger("operator_api")
audit = logging.getLogger("operator_api.audit")

MAX_REASON_CHARS: Final = 1024
MAX_TIMELINE_LIMIT: Final = 1000
MAX_ACK_SCAN: Final = 500
MAX_BODY_SHOWN: Final = 16 * 1024
_MAX_SEQUENCE: Final = 2**63 - 1
_CONFLICT_RETRIES: Final = 3
MAX_PURGE_LIMIT: Final = 10_000
PURGE_BUDGET: Final = timedelta(seconds=60)
"""One purge call stops examining after this (``more``): an HTTP call must end in minutes."""
CheckName = Literal["settings", "table", "servicebus"]
MAX_WAIT_SECONDS: Final = 60.0
WATCH_POLL_SECONDS: Final = 0.5
"""How often a watch reads the order (one point read) while it waits for a change."""


class Operations:
    """Operator operations over one Runtime (its settings, state store and message sending)."""

    def __init__(
        self,
        rt: Runtime,
        *,
        servicebus: Callable[[], ServiceBusClient] | None = None,
        duplicate_window: timedelta = dead_letter_settler.DUPLICATE_WINDOW,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.rt = rt
        self._duplicate_window = duplicate_window
        self._sleep = sleep
        self._orders_table: Table | None = None
        conn = rt.settings.servicebus
        # Interactive use: one quick retry, then the operator sees the error and tries again.
        factory = servicebus or (
            lambda: clients.servicebus_client(conn, retry_total=1, retry_backoff_factor=0.2)
        )
        self._queues = QueueTools(factory)
        self._archive: archive.Archive | None = None

    async def close(self) -> None:
        await self._queues.close()
        if isinstance(self._archive, BlobArchive):
            await self._archive.close()
        if self._orders_table is not None:
            await self._orders_table.close()

    def _history(self) -> Table:
        """The orders table itself, for reads the state store has no index for (built on
        first use; building awaits nothing, so calls on the event loop never build two)."""
        if self._orders_table is None:
            service = clients.table_service(self.rt.settings.storage)
            self._orders_table = service.get_table_client(
                self.rt.settings.orders_table, owns_service=True
            )
        return self._orders_table

    def _archive_store(self) -> archive.Archive:
        if self._archive is None:
            self._archive = open_archive(self.rt.settings)
        return self._archive

    def use_archive(self, store: archive.Archive) -> None:
        """Use ``store`` as the archive (tests: devstack.memory's in memory)."""
        self._archive = store

    # ---------------------------------------------------------------------------- orders

    async def list_orders(
        self,
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
        _check_limit(limit, MAX_LIMIT)
        order_by = filters.sort_of(sort)
        chosen = self._criteria(step, older_than, newer_than, text)
        history = self._history() if wanted is ProcessState.PROCESSED else None
        try:
            listing = await list_orders(
                self.rt.store,
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

    def _criteria(self, step: Any, older_than: Any, newer_than: Any, text: Any) -> filters.Criteria:
        return filters.criteria(
            now=self.rt.clock(),
            workflows=self.rt.workflows,
            step=step,
            older_than=older_than,
            newer_than=newer_than,
            text=text,
        )

    async def supervisor(self) -> SupervisorView:
        """The Supervisor's progress from its roster: lag, sweeps, leases and the bound."""
        now = self.rt.clock()
        roster = await self.rt.store.supervision.read()
        bound = supervision.recovery_bound(self.rt.settings)
        return SupervisorView(
            **supervision.lag(roster, now, bound).as_dict(),
            bound=bound.as_dict(),
            buckets=[
                BucketView(
                    bucket=b.bucket,
                    holder=None if b.free(now) else b.holder,
                    leased_until=b.until,
                    swept_at=b.swept_at,
                    swept_by=b.swept_by or None,
                    lag_s=b.lag_s,
                    due_found=b.due_found,
                )
                for b in roster.buckets
            ],
        )

    async def show_order(
        self, order_id: str, *, timeline_after: int = -1, timeline_limit: int = 200
    ) -> OrderDetail:
        """One order: its state, submitted details, steps (state, generation, attempts, and
        what the timeline says each went through) and timeline (paged)."""
        order_id = _order_id(order_id)
        if isinstance(timeline_after, bool) or not isinstance(timeline_after, int):
            raise InvalidRequest("invalid_request", "timeline_after must be an integer >= -1")
        if not -1 <= timeline_after <= 10**8:
            raise InvalidRequest("invalid_request", "timeline_after must be an integer >= -1")
        _check_limit(timeline_limit, MAX_TIMELINE_LIMIT, name="timeline_limit")
        try:
            order = await self.rt.store.get_order(order_id)
        except OrderNotFound:
            raise NotFound("order_not_found", f"order {order_id} does not exist") from None
        entries = await self.rt.store.get_timeline(
            order_id, after_seq=timeline_after, limit=timeline_limit + 1
        )
        more = len(entries) > timeline_limit
        whole = timeline_after < 0 and not more
        history = (
            entries
            if whole
            else await self.rt.store.get_timeline(order_id, limit=MAX_TIMELINE_LIMIT)
        )
        return OrderDetail.of(
            order, entries[:timeline_limit], more, history=history, now=self.rt.clock()
        )

    async def watch_order(
        self, order_id: str, *, after_seq: int = -1, wait_s: float = 20.0
    ) -> WatchView:
        """The order once it has changed since its timeline entry ``after_seq`` (its new
        entries), or after ``wait_s`` seconds without a change; at once if it is finished.
        While it waits it reads the order every half second (one point read)."""
        order_id = _order_id(order_id)
        if isinstance(after_seq, bool) or not isinstance(after_seq, int) or after_seq < -1:
            raise InvalidRequest("invalid_request", "after must be an integer >= -1")
        if isinstance(wait_s, bool) or not isinstance(wait_s, int | float):
            raise InvalidRequest("invalid_wait", f"wait must be 0 to {MAX_WAIT_SECONDS:g} s")
        if not 0 <= wait_s <= MAX_WAIT_SECONDS:
            raise InvalidRequest("invalid_wait", f"wait must be 0 to {MAX_WAIT_SECONDS:g} s")
        deadline = time.monotonic() + wait_s
        while True:
            order = await self.rt.store.find(order_id)
            if order is None:
                raise NotFound("order_not_found", f"order {order_id} does not exist")
            remaining = deadline - time.monotonic()
            if order.timeline_seq > after_seq or order.state.terminal or remaining <= 0:
                break
            await self._sleep(min(WATCH_POLL_SECONDS, remaining))
        detail = await self.show_order(order_id, timeline_after=after_seq)
        return WatchView(
            changed=bool(detail.timeline),
            terminal=ProcessState(detail.order.state).terminal,
            detail=detail,
        )

    async def resubmit(self, order_id: str, *, operator: str, reason: str) -> ActionView:
        """Resubmit an Error order (resume at the failed step, or resume its compensation)."""
        return await self._act(control.resubmit, order_id, operator, reason)

    async def cancel(self, order_id: str, *, operator: str, reason: str) -> ActionView:
        """Cancel a Pending or Processing order: at once, undo every step that may have taken
        effect (the one in flight too), then Error "cancelled" (see :mod:`service.control`)."""
        return await self._act(control.cancel, order_id, operator, reason)

    async def restart(self, order_id: str, *, step: str, operator: str, reason: str) -> ActionView:
        """Restart an Error order from ``step``: it and every later step are redone (next
        generation), even a kept result; the steps before it resume as a resubmit does."""
        act = functools.partial(control.restart, step=filters.step_name(step))
        return await self._act(act, order_id, operator, reason)

    async def bulk(
        self,
        action: bulk.BulkAction,
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
        limit: int = bulk.MAX_BULK,
    ) -> BulkView:
        """Resubmit or cancel the orders a filter selects (a state, step, age or text; at
        least one), at most ``limit``; a dry run only lists them. With ``order_ids`` (what a
        dry run listed), only those, each if it still matches."""
        actor = operator_actor(operator)
        if action not in bulk.STATES:
            raise InvalidRequest("invalid_request", "action must be resubmit or cancel")
        if not isinstance(dry_run, bool):
            raise InvalidRequest("invalid_request", "dry_run must be true or false")
        why = "" if dry_run and not reason else _reason(reason)
        states = bulk.states_for(action, state)
        chosen = self._criteria(step, older_than, newer_than, text)
        if state in (None, "") and chosen.where.empty:
            raise InvalidRequest(
                "empty_filter",
                "say which orders: a state, step, age or text filter (or name one order)",
            )
        _check_limit(limit, bulk.MAX_BULK)
        shown = chosen.shown | ({"state": str(state)} if state else {})
        if order_ids is None:
            selected, more = await bulk.select(self.rt.store, states, chosen.where, limit)
            candidates: list[tuple[str, Order | None]] = [(o.order_id, o) for o in selected]
        else:
            candidates = [(i, await self.rt.store.find(i)) for i in bulk.named(order_ids)]
            more = False
        items = [
            await self._bulk_item(action, order_id, order, states, chosen, actor, why, dry_run)
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

    async def _bulk_item(
        self,
        action: bulk.BulkAction,
        order_id: str,
        order: Order | None,
        states: Sequence[ProcessState],
        chosen: filters.Criteria,
        actor: str,
        reason: str,
        dry_run: bool,
    ) -> BulkItem:
        summary = OrderSummary.of(order) if order is not None else None
        if order is None or not bulk.still_matches(order, states, chosen.where):
            detail = "no longer matches the filter" if order else "no longer exists"
            return BulkItem(
                order_id=order_id, order=summary, outcome="skipped", detail=detail, state=None
            )
        if dry_run:
            return BulkItem(
                order_id=order_id, order=summary, outcome=f"would_{action}", detail="", state=None
            )
        act = self.resubmit if action == "resubmit" else self.cancel
        try:
            done = await act(order_id, operator=actor, reason=reason)
        except OperatorError as refused:
            detail = f"{refused.message} ({refused.code})"
            return BulkItem(
                order_id=order_id, order=summary, outcome="refused", detail=detail, state=None
            )
        return BulkItem(
            order_id=order_id,
            order=summary,
            outcome=done.outcome,
            detail=done.detail,
            state=done.state,
        )

    async def _act(
        self,
        action: Callable[..., Awaitable[control.ActionResult]],
        order_id: str,
        operator: str,
        reason: str,
    ) -> ActionView:
        order_id = _order_id(order_id)
        actor = operator_actor(operator)
        reason = _reason(reason)
        try:
            result = await action(self.rt, order_id, actor=actor, reason=reason)
        except control.Refused as refused:
            if refused.code == "not_found":
                raise NotFound("order_not_found", refused.message) from None
            if refused.code == "busy":
                raise Busy("busy", refused.message) from None
            if refused.code == "invalid":
                raise InvalidRequest("unknown_step", refused.message) from None
            raise Conflict("wrong_state", refused.message) from None
        audit.info("%s %s %s: %s", actor, result.action, order_id, result.outcome)
        return ActionView(
            order_id=result.order_id,
            action=result.action,
            outcome=result.outcome,
            state=result.state.value,
            step=result.step,
            generation=result.generation,
            requested_by=result.requested_by,
            detail=result.detail,
        )

    # ----------------------------------------------------------------------------- purge

    async def purge(
        self,
        *,
        operator: str,
        state: str = "all",
        older_than_days: int | None = None,
        dry_run: bool = False,
        limit: int = 1000,
    ) -> PurgeView:
        """Archive, then delete, finished orders last changed more than ``older_than_days``
        ago (default: the RETENTION_DAYS setting); ``state``: Processed, Error (resolved ones
        only) or all. A dry run only counts. Never an order in flight."""
        actor = operator_actor(operator)
        states = _purge_states(state)
        days = self.rt.settings.retention_days if older_than_days is None else older_than_days
        if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= 3650:
            if older_than_days is None:
                raise InvalidRequest(
                    "invalid_older_than",
                    "older_than_days is required: the RETENTION_DAYS setting is 0 (the timer's "
                    "purge is off), so say how old an order must be, in days from 1 to 3650",
                )
            raise InvalidRequest(
                "invalid_older_than", "older_than_days must be an integer from 1 to 3650"
            )
        if not isinstance(dry_run, bool):
            raise InvalidRequest("invalid_request", "dry_run must be true or false")
        _check_limit(limit, MAX_PURGE_LIMIT)
        report = await run_purge(
            self.rt.store,
            self._archive_store(),
            PurgeRequest(
                older_than=timedelta(days=days),
                requested_by=actor,
                states=states,
                dry_run=dry_run,
                limit=limit,
                budget=PURGE_BUDGET,
            ),
            clock=self.rt.clock,
        )
        audit.info("%s", report.summary())
        return _purge_view(report)

    async def purge_runs(self, *, limit: int = 20) -> PurgeRunsView:
        """The latest recorded purge runs (timer and operators), newest first."""
        _check_limit(limit, MAX_LIMIT)
        runs = await self.rt.store.purges.recent(limit)
        return PurgeRunsView(runs=[PurgeView.model_validate(r) for r in runs])

    async def archived_order(self, order_id: str, *, day: str | None = None) -> ArchivedOrderView:
        """A purged order read back from the archive (searching the newest days first, or
        only ``day``, YYYY-MM-DD)."""
        order_id = _order_id(order_id)
        on = _day(day)
        try:
            copies = await archive.find_all(self._archive_store(), order_id, day=on)
        except ArchiveError as exc:
            raise Conflict("archive_unreadable", str(exc)) from None
        if not copies:
            where = f"on {on}" if on else "on any day"
            raise NotFound("not_archived", f"order {order_id} is not in the archive {where}")
        found = archive.latest(copies)[0]
        record = OrderRecord(
            details=found.submitted, payload_hash=found.payload_hash, process=found.process
        )
        return ArchivedOrderView(
            archived_at=found.archived_at,
            run_id=found.run_id,
            copies=len(copies),
            order=OrderDetail.of(record, list(found.timeline), False),
        )

    # ---------------------------------------------------------------------------- alerts

    async def list_alerts(
        self, *, limit: int = 50, continuation: str | None = None, open_only: bool = False
    ) -> AlertPage:
        """Alerts in the alerts queue, oldest first, without taking them (peek), each with its
        resolution; ``open_only``: only those still open or retrying (a page may then hold
        fewer than ``limit`` and still have a continuation). Costs a point read per order
        named, and a timeline read per terminal alert whose order failed again."""
        _check_limit(limit, MAX_LIMIT)
        if not isinstance(open_only, bool):
            raise InvalidRequest("invalid_request", "open must be true or false")
        start = _sequence_cursor(continuation)
        messages = await self._queues.peek(self._queue("alerts"), from_sequence=start, limit=limit)
        more = len(messages) == limit
        views = await self._resolved([_alert_view(m) for m in messages])
        if open_only:
            views = [v for v in views if v.resolution in alert_resolution.STILL_OPEN]
        return AlertPage(
            items=views,
            continuation=str(messages[-1].sequence_number + 1) if more else None,
            open_only=open_only,
        )

    async def peek_alert(self, sequence_number: int) -> AlertView:
        found = await self._find_alert(_sequence(sequence_number))
        return (await self._resolved([_alert_view(found)]))[0]

    async def _resolved(self, views: list[AlertView]) -> list[AlertView]:
        orders: dict[str, Order | None] = {}
        shown = []
        for view in views:
            alert = view.alert or {}
            order_id = _alert_order(view)
            if order_id is not None and order_id not in orders:
                orders[order_id] = await self._find_order(order_id)
            order = orders.get(order_id) if order_id else None
            after = alert_resolution.needs_timeline(alert, order)
            later = (
                await self.rt.store.get_timeline(
                    order_id, after_seq=after, limit=MAX_TIMELINE_LIMIT
                )
                if after is not None and order_id
                else []
            )
            shown.append(
                view.model_copy(
                    update={
                        "resolution": alert_resolution.resolution(alert, order, later),
                        "order_state": order.state.value if order else None,
                    }
                )
            )
        return shown

    async def _find_order(self, order_id: str) -> Order | None:
        try:
            return await self.rt.store.find(order_id)
        except ids.InvalidId:
            return None

    async def acknowledge_alert(
        self, sequence_number: int, *, operator: str, reason: str | None = None
    ) -> AckView:
        """Remove an alert from the queue and record who acknowledged it, and why (``reason``
        is required: None or blank is refused, saying so)."""
        sequence = _sequence(sequence_number)
        actor = operator_actor(operator)
        why = _reason(reason)
        view = _alert_view(await self._find_alert(sequence))
        alerts = self._queue("alerts")
        if not await self._queues.complete(alerts, sequence, max_scan=MAX_ACK_SCAN):
            raise Conflict(
                "alert_busy",
                f"alert {sequence} could not be taken: another operator may be acknowledging it "
                "right now. Try again in a moment.",
            )
        order_id = _alert_order(view)
        recorded = order_id is not None and await self._record_ack(
            order_id, sequence, view, actor, why
        )
        audit.info("%s acknowledged alert %d (order %s): %s", actor, sequence, order_id or "-", why)
        return AckView(
            sequence_number=sequence,
            message_id=view.message_id,
            order_id=order_id,
            acknowledged_by=actor,
            recorded_in_timeline=recorded,
        )

    async def _find_alert(self, sequence: int) -> ServiceBusReceivedMessage:
        found = await self._queues.peek(self._queue("alerts"), from_sequence=sequence, limit=1)
        if not found or found[0].sequence_number != sequence:
            raise NotFound(
                "alert_not_found",
                f"no alert with sequence number {sequence} (it may have been acknowledged)",
            )
        return found[0]

    async def _record_ack(
        self, order_id: str, sequence: int, view: AlertView, actor: str, why: str
    ) -> bool:
        alert = view.alert or {}
        # domain.retention reads the alert's reason back from the start of the detail (a terminal
        # alert acknowledged resolves an Error): the operator's reason goes after it.
        detail = ack_detail(sequence, alert.get("severity"), alert.get("reason"))
        return await self._annotate(order_id, actor, "alert_acknowledged", f"{detail}: {why}")

    async def _annotate(self, order_id: str, actor: str, event: str, detail: str) -> bool:
        """Record ``event`` in the order's timeline; False if it is gone or kept changing."""
        for _ in range(_CONFLICT_RETRIES):
            process = await self.rt.store.find(order_id)
            if process is None:
                return False
            try:
                await self.rt.store.annotate(process, actor=actor, event=event, detail=detail)
                return True
            except ConcurrencyConflict:
                continue
        log.warning("%s not recorded on busy order %s", event, order_id)
        return False

    # ------------------------------------------------------------------------ dead letters

    async def dead_letter_summary(self, *, limit: int = 100) -> DeadLetterSummary:
        """How many dead letters each of the app's queues holds (counted up to ``limit``)."""
        _check_limit(limit, MAX_LIMIT)
        counts = []
        queues = self.rt.settings.queues
        peeked = await self._queues.peek_each(
            queues.values(), from_sequence=1, limit=limit + 1, dead_letter=True
        )
        for (role, entity), seen in zip(queues.items(), peeked, strict=True):
            counts.append(
                DeadLetterCount(
                    queue=role, entity=entity, count=min(len(seen), limit), more=len(seen) > limit
                )
            )
        return DeadLetterSummary(queues=counts)

    async def list_dead_letters(
        self, queue: str, *, limit: int = 50, continuation: str | None = None
    ) -> DeadLetterPage:
        """The dead letters of one of the app's queues, oldest first (peek)."""
        entity = self._queue(queue)
        _check_limit(limit, MAX_LIMIT)
        start = _sequence_cursor(continuation)
        messages = await self._queues.peek(
            entity, from_sequence=start, limit=limit, dead_letter=True
        )
        more = len(messages) == limit
        return DeadLetterPage(
            queue=queue,
            entity=entity,
            items=[_dead_letter_view(m) for m in messages],
            continuation=str(messages[-1].sequence_number + 1) if more else None,
        )

    async def replay_dead_letters(
        self,
        queue: str,
        *,
        operator: str,
        sequence_numbers: Sequence[int] | None = None,
        everything: bool = False,
        dry_run: bool = False,
        limit: int = 100,
        reason: str | None = None,
    ) -> DeadLetterActionView:
        """Send dead letters back to their queue as first sent, then remove them from the
        dead letters (see :mod:`service.operations.dead_letter_settler` for what is refused, and
        why). ``reason`` is required unless ``dry_run``."""
        return await self._settle(
            "replay", queue, operator, sequence_numbers, everything, dry_run, limit, reason
        )

    async def purge_dead_letters(
        self,
        queue: str,
        *,
        operator: str,
        sequence_numbers: Sequence[int] | None = None,
        everything: bool = False,
        dry_run: bool = False,
        limit: int = 100,
        reason: str | None = None,
    ) -> DeadLetterActionView:
        """Remove dead letters for good. ``reason`` is required unless ``dry_run``."""
        return await self._settle(
            "purge", queue, operator, sequence_numbers, everything, dry_run, limit, reason
        )

    async def _settle(
        self,
        kind: dead_letter_settler.Kind,
        queue: str,
        operator: str,
        sequence_numbers: Sequence[int] | None,
        everything: bool,
        dry_run: bool,
        limit: int,
        reason: str | None,
    ) -> DeadLetterActionView:
        entity = self._queue(queue)
        actor = operator_actor(operator)
        wanted = dead_letter_settler.selection(
            list(sequence_numbers) if sequence_numbers else None, everything
        )
        _check_limit(limit, dead_letter_settler.MAX_SELECTED)
        if not isinstance(dry_run, bool):
            raise InvalidRequest("invalid_request", "dry_run must be true or false")
        why = "" if dry_run and not reason else _reason(reason)
        settler = dead_letter_settler.Settler(
            kind=kind,
            role=queue,
            entity=entity,
            keyring=self.rt.settings.keyring,
            now=self.rt.clock,
            wanted=wanted,
            window=self._duplicate_window,
        )
        scan = limit if wanted is None else dead_letter_settler.MAX_SCAN
        if dry_run:
            start = 1 if wanted is None else min(wanted)
            seen = await self._queues.peek(
                entity, from_sequence=start, limit=scan, dead_letter=True
            )
            for message in seen:
                settler.consider(message)
            more = len(seen) == scan and not settler.enough()
        else:
            more = await self._queues.settle_dead_letters(
                entity, settler.act, max_scan=scan, enough=settler.enough
            )
        items = [
            await self._recorded(o, actor, kind, entity, why) for o in settler.outcomes.values()
        ]
        items = sorted(items + settler.missing(), key=lambda o: o.sequence_number)
        audit.info("%s %s dead letters of %s: %d: %s", actor, kind, entity, len(items), why)
        logged = not dry_run and await self._log_dead_letters(actor, kind, queue, why, items)
        return DeadLetterActionView(
            action=kind,
            queue=queue,
            entity=entity,
            dry_run=dry_run,
            items=items,
            more=more and wanted is None,
            recorded_in_log=logged,
        )

    async def _log_dead_letters(
        self, actor: str, kind: str, queue: str, why: str, items: list[DeadLetterOutcome]
    ) -> bool:
        """Write the action to the dead-letter log; False (and a warning) if it cannot be: the
        messages are settled already, so the action stands and the answer says so."""
        entity = dead_letter_log.to_entity(self.rt.clock(), actor, kind, queue, why, items)
        try:
            await dead_letter_log.DeadLetterLog(self._history()).record(entity)
        except Exception:
            log.warning("%s %s of %s not written to the dead-letter log", actor, kind, queue,
                        exc_info=True)  # fmt: skip
            return False
        return True

    async def dead_letter_log(self, *, limit: int = 20) -> DeadLetterLogView:
        """The latest dead-letter replays and purges (who, when, why, each message's outcome),
        newest first."""
        _check_limit(limit, dead_letter_log.MAX_RECENT)
        logged = await dead_letter_log.DeadLetterLog(self._history()).recent(limit)
        return DeadLetterLogView(actions=[dead_letter_log.to_view(a) for a in logged])

    async def _recorded(
        self, outcome: DeadLetterOutcome, actor: str, kind: str, entity: str, why: str
    ) -> DeadLetterOutcome:
        if outcome.order_id is None or outcome.outcome not in ("replayed", "purged"):
            return outcome
        detail = f"{entity} dead letter {outcome.sequence_number} ({outcome.message_id}): {why}"
        recorded = await self._annotate(
            outcome.order_id, actor, f"dead_letter_{outcome.outcome}", detail
        )
        return outcome.model_copy(update={"recorded_in_timeline": recorded})

    # ---------------------------------------------------------------------------- health

    async def health(self) -> HealthView:
        """Whether the app can work, cheaply: its settings loaded (it would not have started
        otherwise), the orders table answers (one point read of a row that never exists),
        Service Bus answers (one peek of the alerts queue)."""
        settings = self.rt.settings
        checks = [
            HealthCheck(
                name="settings",
                ok=True,
                detail=f"{len(settings.queues)} queues, orders table {settings.orders_table}, "
                f"workflows {', '.join(sorted(self.rt.workflows))}",
                duration_ms=0.0,
            ),
            await _timed("table", self._table_check),
            await _timed("servicebus", self._bus_check),
        ]
        return HealthView(status="ok" if all(c.ok for c in checks) else "failing", checks=checks)

    async def _table_check(self) -> tuple[bool, str]:
        name = self.rt.settings.orders_table
        try:
            await self._history().get_entity("~health", "probe")
        except ResourceNotFoundError as missing:
            if getattr(missing, "error_code", None) == "TableNotFound":
                return False, f"table {name} does not exist"
            return True, f"table {name} answers"
        return True, f"table {name} answers"

    async def _bus_check(self) -> tuple[bool, str]:
        entity = self._queue("alerts")
        await self._queues.peek(entity, from_sequence=1, limit=1)
        return True, f"queue {entity} answers"

    def _queue(self, role: str) -> str:
        queues = self.rt.settings.queues
        if not isinstance(role, str) or role not in queues:
            known = ", ".join(queues)
            raise NotFound("unknown_queue", f"no queue {str(role)[:64]!r}; known: {known}")
        return queues[role]


# ------------------------------------------------------------------------------ validation


def operator_actor(operator: str) -> str:
    """``operator:<name>``, the actor recorded for an operator's action."""
    if not isinstance(operator, str) or not operator.strip():
        raise InvalidRequest("invalid_operator", "say who you are: operator is required")
    try:
        name = ids.validate_instance_id(operator.strip(), "operator")
    except ids.InvalidId as exc:
        raise InvalidRequest("invalid_operator", str(exc)) from None
    return name if name.startswith("operator:") else f"operator:{name}"


def _order_id(value: Any) -> str:
    try:
        return ids.validate_order_id(value)
    except ids.InvalidId as exc:
        raise InvalidRequest("invalid_order_id", str(exc)) from None


def _purge_states(value: Any) -> tuple[ProcessState, ...]:
    if value == "all":
        return PURGEABLE_STATES
    state = filters.state_of(value) if isinstance(value, str) else None
    if state not in PURGEABLE_STATES:
        raise InvalidRequest(
            "invalid_state",
            f"state {str(value)[:40]!r} cannot be purged; purge Processed, Error or all "
            "(orders in flight are never purged)",
        )
    return (state,)


def _day(value: Any) -> date | None:
    if value is None:
        return None
    if isinstance(value, str) and len(value) == 10:
        try:
            return date.fromisoformat(value)
        except ValueError:
            pass
    raise InvalidRequest("invalid_day", f"day {str(value)[:20]!r} is not a date like 2025-06-01")


def _purge_view(report: PurgeReport) -> PurgeView:
    return PurgeView.model_validate(report.as_dict())


def _reason(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest("invalid_reason", "say why: reason is required")
    if len(value) > MAX_REASON_CHARS:
        raise InvalidRequest("invalid_reason", f"reason is over {MAX_REASON_CHARS} characters")
    return value.strip()


def _check_limit(value: Any, maximum: int, *, name: str = "limit") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidRequest("invalid_limit", f"{name} must be an integer from 1 to {maximum}")


def _sequence(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_SEQUENCE:
        raise InvalidRequest(
            "invalid_sequence_number", "an alert is named by its sequence number, an integer >= 1"
        )
    return value


def _sequence_cursor(value: str | None) -> int:
    if value is None:
        return 1
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() or len(value) > 19:
        raise InvalidRequest(
            "invalid_continuation", "continuation is not one returned by this listing"
        )
    return _sequence(int(value))


async def _timed(name: CheckName, check: Callable[[], Awaitable[tuple[bool, str]]]) -> HealthCheck:
    started = time.perf_counter()
    try:
        ok, detail = await check()
    except Exception as error:  # any failure is the answer: the check says what it was
        first = (str(error).strip().splitlines() or [""])[0][:200]
        ok, detail = False, f"{type(error).__name__}: {first}"
        log.warning("health check %s failed: %s", name, detail)
    elapsed = round((time.perf_counter() - started) * 1000, 1)
    return HealthCheck(name=name, ok=ok, detail=detail, duration_ms=elapsed)


# --------------------------------------------------------------------------------- views


def _alert_view(message: ServiceBusReceivedMessage) -> AlertView:
    raw = body_of(message)
    alert: dict[str, Any] | None = None
    problem: str | None = None
    try:
        alert = parse_message(raw, OperatorAlert).model_dump(mode="json")
    except BadMessage as bad:
        problem = bad.reason
    return AlertView(
        sequence_number=message.sequence_number or 0,
        message_id=message.message_id,
        enqueued_at=message.enqueued_time_utc,
        alert=alert,
        raw=None if alert is not None else excerpt(raw),
        problem=problem,
    )


def _alert_order(view: AlertView) -> str | None:
    order_id = (view.alert or {}).get("order_id")
    return order_id if isinstance(order_id, str) else None


def _dead_letter_view(message: ServiceBusReceivedMessage) -> DeadLetterView:
    raw = body_of(message)
    body: Any = None
    shown: str | None = None
    if len(raw) <= MAX_BODY_SHOWN:
        try:
            body = json.loads(raw, parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError, RecursionError):
            shown = excerpt(raw)
    else:
        shown = excerpt(raw)
    return DeadLetterView(
        sequence_number=message.sequence_number or 0,
        message_id=message.message_id,
        enqueued_at=message.enqueued_time_utc,
        delivery_count=message.delivery_count,
        reason=message.dead_letter_reason,
        description=message.dead_letter_error_description,
        subject=message.subject,
        body=body,
        raw=shown,
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
