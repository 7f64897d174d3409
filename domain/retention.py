"""Retention: which finished orders may be purged, decided without I/O.

An order is **purgeable** when all of these hold:

- It is finished: Processed, or Error *and resolved*. An Error order is resolved once an
  operator acknowledged its terminal alert (the one alert every Error raises, with a reason in
  :data:`domain.order.TERMINAL_ALERT_REASONS`) *after* the order last entered Error: the
  acknowledgement is the operator saying "handled". A resubmitted order is not in Error any
  more (it is in flight, then Processed or Error again, and a new Error needs a new
  acknowledgement). Acknowledging another alert about the order (a rejected duplicate, say)
  resolves nothing.
- It has not changed for ``older_than``: its ``UpdatedAt`` (the last write of any kind,
  annotations included) is before ``now - older_than``. Counting from the last change, not
  from the finish, keeps an order that someone still looks at or acknowledges.
- Its active-index row is gone: the row of a finished order is deleted only after its final
  messages were sent (:mod:`adapters.store.active_index`), so a row still there means the order
  may owe them and the Supervisor will send them.

The purge itself (:mod:`service.purge`) deletes an order's rows in Table transactions of at most
:data:`MAX_BATCH` operations, conditional on the process row's ETag: :func:`delete_plan` says
which rows go in which transaction.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final

from domain.messages import OrderSubmitted
from domain.order import TERMINAL_ALERT_REASONS, Order, TimelineEntry
from domain.states import ProcessState

MAX_BATCH: Final = 100
"""Operations in one Table transaction (entity group transaction)."""
PURGEABLE_STATES: Final = (ProcessState.PROCESSED, ProcessState.ERROR)
ACK_EVENT: Final = "alert_acknowledged"
_ACK_DETAIL = re.compile(r"alert (?P<seq>\d+) \((?P<severity>[^,()]*), (?P<reason>[a-z_]+)\) ")


@dataclass(frozen=True, slots=True)
class Candidate:
    """A row the purge's scan found: a finished order's process row old enough to look at, or
    the marker of a purge that was interrupted (``interrupted``)."""

    order_id: str
    state: ProcessState | None
    updated_at: datetime | None
    interrupted: bool = False


@dataclass(frozen=True, slots=True)
class OrderSnapshot:
    """Every row of one order, read at once: what the purge archives and then deletes."""

    submitted: OrderSubmitted
    payload_hash: str
    process: Order
    """With the ETag the deletion is conditional on."""
    timeline: tuple[TimelineEntry, ...]
    other_rows: tuple[str, ...]
    """RowKeys of every row but ``details`` and ``process`` (the timeline), in key order."""


class DeleteOutcome(StrEnum):
    PURGED = "purged"
    CHANGED = "changed"
    """The process row changed since the snapshot (or a row is missing): nothing deleted."""
    GONE = "gone"
    """The order was deleted already (another purge, or an SDK retry of this one)."""


class Verdict(StrEnum):
    """What the purge does with one order, and why."""

    PURGE = "purge"
    IN_FLIGHT = "in_flight"
    STATE_NOT_SELECTED = "state_not_selected"
    TOO_RECENT = "too_recent"
    UNRESOLVED_ERROR = "unresolved_error"
    OWES_MESSAGES = "owes_messages"


def ack_detail(sequence: int, severity: object, reason: object) -> str:
    """The timeline detail of an alert acknowledgement (read back by :func:`acked_reason`)."""
    return f"alert {sequence} ({severity}, {reason}) acknowledged"


def acked_reason(entry: TimelineEntry) -> str | None:
    """The reason of the alert an ``alert_acknowledged`` entry acknowledges, else None."""
    if entry.event != ACK_EVENT:
        return None
    match = _ACK_DETAIL.match(entry.detail)
    return match["reason"] if match else None


def error_resolved(timeline: Sequence[TimelineEntry]) -> bool:
    """Whether an operator acknowledged a terminal alert after the order last entered Error."""
    entered = None
    for entry in timeline:
        if entry.to_state is ProcessState.ERROR and entry.from_state is not ProcessState.ERROR:
            entered = entry.seq
    if entered is None:
        return False
    return any(
        entry.seq > entered and acked_reason(entry) in TERMINAL_ALERT_REASONS for entry in timeline
    )


def cutoff(now: datetime, older_than: timedelta) -> datetime:
    """Orders last changed before this are old enough."""
    if older_than < timedelta(0):
        raise ValueError("older_than must not be negative")
    return now - older_than


def verdict(
    order: Order,
    timeline: Sequence[TimelineEntry],
    *,
    now: datetime,
    older_than: timedelta,
    states: Iterable[ProcessState] = PURGEABLE_STATES,
    index_row: bool,
) -> Verdict:
    """Whether ``order`` (with its whole ``timeline``) may be purged now; see the module doc.

    ``index_row``: the order's current generation still has its active-index row.
    """
    if order.state.in_flight:
        return Verdict.IN_FLIGHT
    if order.state not in frozenset(states):
        return Verdict.STATE_NOT_SELECTED
    if order.updated_at >= cutoff(now, older_than):
        return Verdict.TOO_RECENT
    if order.state is ProcessState.ERROR and not error_resolved(timeline):
        return Verdict.UNRESOLVED_ERROR
    if index_row:
        return Verdict.OWES_MESSAGES
    return Verdict.PURGE


@dataclass(frozen=True, slots=True)
class DeletePlan:
    """The Table transactions that delete one order's rows, in order.

    ``first`` holds the process row (deleted on condition of its ETag) and, when everything
    fits, every other row too: then the purge is one atomic transaction. Otherwise ``first``
    also writes a marker row, the ``middle`` transactions delete timeline rows, and ``last``
    deletes the rest with the details row and the marker (a crash in between leaves the marker
    for the next run to finish; the details row stays to the end, so no new order can be
    created under the id while old rows remain).
    """

    first: tuple[str, ...]
    middle: tuple[tuple[str, ...], ...]
    last: tuple[str, ...]

    @property
    def atomic(self) -> bool:
        return not self.middle and not self.last


def delete_plan(
    process: str, details: str, others: Sequence[str], batch: int = MAX_BATCH
) -> DeletePlan:
    """Split the deletion of ``process``, ``details`` and ``others`` (timeline rows, oldest
    first) into transactions of at most ``batch`` operations (see :class:`DeletePlan`)."""
    if batch < 4:
        raise ValueError("a transaction must hold at least 4 operations")
    if 2 + len(others) <= batch:
        return DeletePlan(first=(process, details, *others), middle=(), last=())
    # first: process + marker create + timeline rows; last: timeline rows + details + marker.
    room = batch - 2
    first = (process, *others[:room])
    rest = list(others[room:])
    middle: list[tuple[str, ...]] = []
    while len(rest) > room:
        middle.append(tuple(rest[:batch]))
        rest = rest[batch:]
    return DeletePlan(first=first, middle=tuple(middle), last=(*rest, details))
