"""The plain parts of :mod:`service.apply` (no I/O), which re-exports them (``apply.Busy`` and the
rest): the exceptions callers catch (:class:`Busy`, :class:`Parked`), the constants, the pure
helpers every decision uses, and the memory of reply queues that could not be sent to.

That memory is process-wide: whether a submitter's reply queue can be sent to is a fact about
the queue, not about which trigger found out, and one alert per queue per
:data:`FAILURE_MEMORY` must hold for the process; :func:`forget_failures` forgets. Its lock is
a ``threading.Lock`` held around dictionary work only, never across an ``await``: a process may
run more than one event loop (an in-process local host beside a test's). What the memory spares
is the try, never the update: an update not tried because of it is held like one refused
(:class:`domain.lifecycle.RepliesRefused`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final, Protocol

from azure.servicebus.exceptions import (
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
)

from domain.lifecycle import DEFAULT_FLUSH_GRACE, REPLY_RETRY_FIRST, Context, due_at
from domain.messages import OrderSubmitted
from domain.order import Order
from domain.states import ProcessState
from domain.workflows import Workflow, workflow_ref

if TYPE_CHECKING:
    import random

    from adapters.settings import Settings

MAX_CONFLICT_RETRIES: Final = 5
FAILURE_MEMORY: Final = REPLY_RETRY_FIRST
"""How long a process does not try a reply queue that refused: no longer than an order holds
the updates it refused, so their retry finds the queue tried afresh."""
_MAX_REMEMBERED: Final = 1024
UNREACHABLE_QUEUE: Final = (
    MessagingEntityNotFoundError,
    MessagingEntityDisabledError,
    ServiceBusAuthorizationError,
    ServiceBusAuthenticationError,
)
"""Errors that may say the reply queue cannot be sent to at all (missing, disabled,
forbidden); :func:`refuses` tells. Any other error propagates: the triggering message comes
again and the outbox is resent."""
REFUSED_TOKEN_STATUS: Final = frozenset({401, 403, 404})
"""How Service Bus (and the development broker) answer the token for a queue that does not
exist (404) or that the app may not use (401, 403); the SDK raises that as an authentication
error."""

PARKED_RECHECK: Final = timedelta(minutes=15)
"""How often the Supervisor looks at a parked order again (and repeats its alert)."""


def refuses(error: Exception) -> bool:
    """Whether ``error`` says the reply queue will not take a send until someone changes it.

    An authentication error counts only when the token for the queue was refused: one that
    broke the link, expired or timed out (a broker restarting, a network fault) may pass on the
    next try, so it propagates like any failure and the outbox sends the update again.
    """
    if isinstance(error, ServiceBusAuthenticationError):
        status = getattr(error.inner_exception, "status_code", None)
        return status in REFUSED_TOKEN_STATUS
    return isinstance(error, UNREACHABLE_QUEUE)


class Busy(Exception):
    """The order kept changing under us; the caller's message will come again."""


class Parked(Exception):
    """The order is on a workflow version this deployment does not carry. Nothing was decided
    or written; an alert says which version is missing (:func:`service.apply.park`)."""


class Decides(Protocol):
    """What the pure helpers read of a runtime: ``service.runtime.Runtime`` and
    ``service.runtime.Runtime`` both are one."""

    settings: Settings
    workflows: Mapping[str, Workflow]
    rng: random.Random
    clock: Callable[[], datetime]

    def workflow(self, ref: str) -> Workflow: ...


def new_order_ref(rt: Decides, submitted: OrderSubmitted) -> str:
    """The workflow version a new order runs: the one it asks for, else the current one."""
    name = submitted.workflow
    return workflow_ref(name, submitted.workflow_version or rt.settings.current_version(name))


def context(rt: Decides, workflow: str, actor: str) -> Context:
    """What a decision on an order of ``workflow`` (a reference, ``order@2``) may know, taken
    from the runtime now. Raises UnknownWorkflow for a version this deployment lacks."""
    return Context(
        workflow=rt.workflow(workflow),
        now=rt.clock(),
        actor=actor,
        jitter=rt.rng.random(),
        stale_after=rt.settings.pending_stale_after,
        compensation_budget=rt.settings.compensation_budget,
        compensation_warn_after=rt.settings.compensation_warn_after,
        skew=rt.settings.clock_skew,
    )


def due(rt: Decides, order: Order) -> datetime:
    """When the Supervisor must next look at ``order`` (see domain.lifecycle.due_at)."""
    return due_at(
        order, rt.settings.pending_stale_after, DEFAULT_FLUSH_GRACE, rt.settings.clock_skew
    )


def earliest_due(rt: Decides, now: datetime) -> datetime:
    """The soonest an order written at ``now`` or later can be due (:func:`due`).

    An index row whose order is not there yet (a create or resubmit may be on its way) is kept
    no later than this, so the order that follows is never found late.
    """
    budgets = [s.deadline_budget for flow in rt.workflows.values() for s in flow.steps]
    return now + min(DEFAULT_FLUSH_GRACE, rt.settings.pending_stale_after / 2, *budgets)


def _writes_beside(rt: Decides, before: Order, after: Order) -> bool:
    """Whether writing ``after`` over ``before`` first writes an index row: the order's
    active-index row moved earlier, or its Error-index row on entering Error. Neither is undone
    cleanly when the order write then loses: the moved row may end up later than the order,
    and the Error row written over one the winner wrote is deleted with ours."""
    if _index_due(rt, before, after) is not None:
        return True
    return after.state is ProcessState.ERROR and before.state is not ProcessState.ERROR


def _index_due(rt: Decides, before: Order, after: Order) -> datetime | None:
    """The due time to write to the order's index row before writing ``after``, if any.

    The row must never be later than the order's due time (adapters.store.active_index): an order
    back
    in flight gets its row, and one whose due time moves earlier moves its row first. A due
    time that moves later leaves the row early; the Supervisor moves it up when it finds it.
    """
    if after.state.terminal:
        return None
    due_after = due(rt, after)
    if before.state.terminal or due_after < due(rt, before):
        return due_after
    if before.workflow != after.workflow:
        # A migration: the row records the version too (service.versions counts it).
        return min(due_after, due(rt, before))
    return None


class _FailureMemory:
    """Reply queues that failed recently, process-wide, bounded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[datetime, str]] = OrderedDict()

    def get(self, queue: str, now: datetime) -> str | None:
        key = queue.casefold()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if now - entry[0] > FAILURE_MEMORY:
                del self._entries[key]
                return None
            return entry[1]

    def put(self, queue: str, failure: str, now: datetime) -> None:
        key = queue.casefold()
        with self._lock:
            self._entries[key] = (now, failure)
            self._entries.move_to_end(key)
            while len(self._entries) > _MAX_REMEMBERED:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_failures = _FailureMemory()


def forget_failures() -> None:
    """Forget remembered reply-queue failures (tests; an operator after fixing a queue)."""
    _failures.clear()
