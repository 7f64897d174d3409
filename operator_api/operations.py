"""Operator operations: the one implementation behind the HTTP API and the CLI.

Each method takes plain Python values, validates them (a refusal is an
:class:`~operator_api.errors.OperatorError` with an HTTP status, a code and a message), and
returns a pydantic model (``model_dump(mode="json")`` gives the JSON both front ends show)::

    ops = Operations(Runtime.from_settings(Settings.from_env()))
    page = ops.list_orders("Error", limit=20)
    ops.resubmit(page.items[0].order_id, operator="alice@example.com", reason="card updated")

Actions (resubmit, cancel, acknowledge) name the operator; the timeline records them as
``operator:<name>``.

Alerts are the messages of the alerts queue, identified by their sequence number; listing and
showing them peeks (nothing changes); acknowledging completes the message (see
:mod:`operator_api.queues`) and, when the alert names an order, records the acknowledgement in
that order's timeline. Dead letters are peeked per queue, the queue named by its role
(``orders``, ``commands``, ``responses``, ``alerts``, ``inventory``, ``payment``, ``shipping``),
never by a free-form name.

A purge (:mod:`core.purge`) archives, then deletes, finished orders older than a number of days
(the RETENTION_DAYS setting unless given); it is recorded with the operator's name and listed
by :meth:`Operations.purge_runs`. Purged orders are read back from the archive by
:meth:`Operations.archived_order`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from datetime import date, timedelta
from typing import Any, Final

from azure.servicebus import ServiceBusClient, ServiceBusReceivedMessage

from core import archive, clients, ids, supervision
from core.archive import ArchiveError, BlobArchive
from core.messages import BadMessage, OperatorAlert, excerpt, parse_message
from core.order_listing import (
    MAX_LIMIT,
    InvalidCursor,
    NotListable,
    list_orders,
)
from core.purge import PurgeReport, PurgeRequest, open_archive, run_purge
from core.retention import PURGEABLE_STATES, ack_detail
from core.runtime import Runtime
from core.state_models import ConcurrencyConflict, OrderNotFound, OrderRecord
from core.states import ProcessState
from operator_api.errors import Busy, Conflict, InvalidRequest, NotFound
from operator_api.models import (
    AckView,
    ActionView,
    AlertPage,
    AlertView,
    ArchivedOrderView,
    BucketView,
    DeadLetterCount,
    DeadLetterPage,
    DeadLetterSummary,
    DeadLetterView,
    OrderDetail,
    OrderPage,
    OrderSummary,
    PurgeRunsView,
    PurgeView,
    SupervisorView,
)
from operator_api.queues import QueueTools
from scheduler import control

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


class Operations:
    """Operator operations over one Runtime (its settings, state store and message sending)."""

    def __init__(
        self, rt: Runtime, *, servicebus: Callable[[], ServiceBusClient] | None = None
    ) -> None:
        self.rt = rt
        conn = rt.settings.servicebus
        # Interactive use: one quick retry, then the operator sees the error and tries again.
        factory = servicebus or (
            lambda: clients.servicebus_client(conn, retry_total=1, retry_backoff_factor=0.2)
        )
        self._queues = QueueTools(factory)
        self._archive: archive.Archive | None = None
        self._archive_lock = threading.Lock()

    def close(self) -> None:
        self._queues.close()
        if isinstance(self._archive, BlobArchive):
            self._archive.close()

    def _archive_store(self) -> archive.Archive:
        with self._archive_lock:
            if self._archive is None:
                self._archive = open_archive(self.rt.settings)
            return self._archive

    def use_archive(self, store: archive.Archive) -> None:
        """Use ``store`` as the archive (tests, the in-memory twin)."""
        self._archive = store

    # ---------------------------------------------------------------------------- orders

    def list_orders(
        self, state: str, *, limit: int = 50, continuation: str | None = None
    ) -> OrderPage:
        """Orders now in ``state`` (Pending, Processing, Compensating or Error), paged."""
        wanted = _state(state)
        _check_limit(limit, MAX_LIMIT)
        try:
            listing = list_orders(self.rt.store, wanted, limit=limit, cursor=continuation)
        except NotListable as exc:
            raise InvalidRequest("state_not_listable", str(exc)) from None
        except InvalidCursor as exc:
            raise InvalidRequest("invalid_continuation", str(exc)) from None
        return OrderPage(
            state=wanted.value,
            items=[OrderSummary.of(p) for p in listing.orders],
            continuation=listing.cursor,
            scanned=listing.scanned,
        )

    def supervisor(self) -> SupervisorView:
        """The Supervisor's progress from its roster: lag, sweeps, leases and the bound."""
        now = self.rt.clock()
        roster = self.rt.store.supervision.read()
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

    def show_order(
        self, order_id: str, *, timeline_after: int = -1, timeline_limit: int = 200
    ) -> OrderDetail:
        """One order: its state, submitted details, steps (state, generation, attempts) and
        timeline (paged)."""
        order_id = _order_id(order_id)
        if isinstance(timeline_after, bool) or not -1 <= timeline_after <= 10**8:
            raise InvalidRequest("invalid_request", "timeline_after must be an integer >= -1")
        _check_limit(timeline_limit, MAX_TIMELINE_LIMIT, name="timeline_limit")
        try:
            order = self.rt.store.get_order(order_id)
        except OrderNotFound:
            raise NotFound("order_not_found", f"order {order_id} does not exist") from None
        entries = self.rt.store.get_timeline(
            order_id, after_seq=timeline_after, limit=timeline_limit + 1
        )
        more = len(entries) > timeline_limit
        return OrderDetail.of(order, entries[:timeline_limit], more)

    def resubmit(self, order_id: str, *, operator: str, reason: str) -> ActionView:
        """Resubmit an Error order (resume at the failed step, or resume its compensation)."""
        return self._act(control.resubmit, order_id, operator, reason)

    def cancel(self, order_id: str, *, operator: str, reason: str) -> ActionView:
        """Cancel a Pending or Processing order: at once, undo every step that may have taken
        effect (the one in flight too), then Error "cancelled" (see :mod:`scheduler.control`)."""
        return self._act(control.cancel, order_id, operator, reason)

    def _act(
        self,
        action: Callable[..., control.ActionResult],
        order_id: str,
        operator: str,
        reason: str,
    ) -> ActionView:
        order_id = _order_id(order_id)
        actor = operator_actor(operator)
        reason = _reason(reason)
        try:
            result = action(self.rt, order_id, actor=actor, reason=reason)
        except control.Refused as refused:
            if refused.code == "not_found":
                raise NotFound("order_not_found", refused.message) from None
            if refused.code == "busy":
                raise Busy("busy", refused.message) from None
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

    def purge(
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
        report = run_purge(
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

    def purge_runs(self, *, limit: int = 20) -> PurgeRunsView:
        """The latest recorded purge runs (timer and operators), newest first."""
        _check_limit(limit, MAX_LIMIT)
        return PurgeRunsView(
            runs=[PurgeView.model_validate(r) for r in self.rt.store.purges.recent(limit)]
        )

    def archived_order(self, order_id: str, *, day: str | None = None) -> ArchivedOrderView:
        """A purged order read back from the archive (searching the newest days first, or
        only ``day``, YYYY-MM-DD)."""
        order_id = _order_id(order_id)
        on = _day(day)
        try:
            copies = archive.find_all(self._archive_store(), order_id, day=on)
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

    def list_alerts(self, *, limit: int = 50, continuation: str | None = None) -> AlertPage:
        """Alerts in the alerts queue, oldest first, without taking them (peek)."""
        _check_limit(limit, MAX_LIMIT)
        start = _sequence_cursor(continuation)
        messages = self._queues.peek(self._queue("alerts"), from_sequence=start, limit=limit)
        more = len(messages) == limit
        return AlertPage(
            items=[_alert_view(m) for m in messages],
            continuation=str(messages[-1].sequence_number + 1) if more else None,
        )

    def peek_alert(self, sequence_number: int) -> AlertView:
        return _alert_view(self._find_alert(_sequence(sequence_number)))

    def acknowledge_alert(self, sequence_number: int, *, operator: str) -> AckView:
        """Remove an alert from the queue and record who acknowledged it."""
        sequence = _sequence(sequence_number)
        actor = operator_actor(operator)
        view = _alert_view(self._find_alert(sequence))
        if not self._queues.complete(self._queue("alerts"), sequence, max_scan=MAX_ACK_SCAN):
            raise Conflict(
                "alert_busy",
                f"alert {sequence} could not be taken: another operator may be acknowledging it "
                "right now. Try again in a moment.",
            )
        order_id = _alert_order(view)
        recorded = order_id is not None and self._record_ack(order_id, sequence, view, actor)
        audit.info("%s acknowledged alert %d (order %s)", actor, sequence, order_id or "-")
        return AckView(
            sequence_number=sequence,
            message_id=view.message_id,
            order_id=order_id,
            acknowledged_by=actor,
            recorded_in_timeline=recorded,
        )

    def _find_alert(self, sequence: int) -> ServiceBusReceivedMessage:
        found = self._queues.peek(self._queue("alerts"), from_sequence=sequence, limit=1)
        if not found or found[0].sequence_number != sequence:
            raise NotFound(
                "alert_not_found",
                f"no alert with sequence number {sequence} (it may have been acknowledged)",
            )
        return found[0]

    def _record_ack(self, order_id: str, sequence: int, view: AlertView, actor: str) -> bool:
        alert = view.alert or {}
        # core.retention reads the reason back: a terminal alert acknowledged resolves an Error.
        detail = ack_detail(sequence, alert.get("severity"), alert.get("reason"))
        for _ in range(_CONFLICT_RETRIES):
            process = self.rt.store.find(order_id)
            if process is None:
                return False
            try:
                self.rt.store.annotate(
                    process, actor=actor, event="alert_acknowledged", detail=detail
                )
                return True
            except ConcurrencyConflict:
                continue
        log.warning("ack of alert %d not recorded on busy order %s", sequence, order_id)
        return False

    # ------------------------------------------------------------------------ dead letters

    def dead_letter_summary(self, *, limit: int = 100) -> DeadLetterSummary:
        """How many dead letters each of the app's queues holds (counted up to ``limit``)."""
        _check_limit(limit, MAX_LIMIT)
        counts = []
        for role, entity in self.rt.settings.queues.items():
            seen = self._queues.peek(entity, from_sequence=1, limit=limit + 1, dead_letter=True)
            counts.append(
                DeadLetterCount(
                    queue=role, entity=entity, count=min(len(seen), limit), more=len(seen) > limit
                )
            )
        return DeadLetterSummary(queues=counts)

    def list_dead_letters(
        self, queue: str, *, limit: int = 50, continuation: str | None = None
    ) -> DeadLetterPage:
        """The dead letters of one of the app's queues, oldest first (peek)."""
        entity = self._queue(queue)
        _check_limit(limit, MAX_LIMIT)
        start = _sequence_cursor(continuation)
        messages = self._queues.peek(entity, from_sequence=start, limit=limit, dead_letter=True)
        more = len(messages) == limit
        return DeadLetterPage(
            queue=queue,
            entity=entity,
            items=[_dead_letter_view(m) for m in messages],
            continuation=str(messages[-1].sequence_number + 1) if more else None,
        )

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


def _state(value: Any) -> ProcessState:
    names = {s.value.lower(): s for s in ProcessState}
    state = names.get(value.strip().lower()) if isinstance(value, str) else None
    if state is None:
        raise InvalidRequest(
            "invalid_state",
            f"state {str(value)[:40]!r} is not one of: {', '.join(s.value for s in ProcessState)}",
        )
    return state


def _purge_states(value: Any) -> tuple[ProcessState, ...]:
    if value == "all":
        return PURGEABLE_STATES
    state = _state(value) if isinstance(value, str) else None
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


# --------------------------------------------------------------------------------- views


def _body(message: ServiceBusReceivedMessage) -> bytes:
    body = message.body
    return body if isinstance(body, bytes) else b"".join(body)


def _alert_view(message: ServiceBusReceivedMessage) -> AlertView:
    raw = _body(message)
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
    raw = _body(message)
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
