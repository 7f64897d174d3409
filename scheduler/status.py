"""Status replies: StatusUpdate messages to the queue a submitter named in ``reply_to``.

Each transition of an order may report up to :data:`SLOTS` updates (an advance reports the step
completed and the next one started). Their ``sequence`` is ``TimelineSeq * SLOTS + k``: the
process row's TimelineSeq goes up by one with every ETag-guarded write, so the sequence grows
across scheduler instances without any extra state, and a redelivered handler that sends the
same update again sends the same MessageId (``st:<order>:<sequence>``), which duplicate
detection drops. Sequences have gaps (not every transition reports); receivers order by them.

A reply queue that cannot be sent to (missing, no permission, any broker error after the status
client's one retry) never holds up the order: the first failure is recorded on the process row
(``ReplyError``, a timeline entry) and alerted once; later updates of that order are skipped.
The ETag makes "once" hold across instances: only the write that sets ReplyError alerts. Queues
that just failed are remembered process-wide for :data:`FAILURE_MEMORY`, so other orders naming
the same missing queue do not each wait for the broker to refuse it again.

A submitter may not name one of the app's own queues as its reply queue: intake refuses such an
order (status messages injected into, say, the agent-response queue would be parsed as replies).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from core.messages import OperatorAlert, OrderStatus, StatusEvent, StatusUpdate
from core.runtime import Runtime
from core.settings import Settings
from core.state_models import ConcurrencyConflict, OrderNotFound, ProcessRecord

log = logging.getLogger("scheduler.status")

SLOTS: Final = 4
FAILURE_MEMORY: Final = timedelta(minutes=5)
_MAX_REMEMBERED: Final = 1024
_CONFLICT_RETRIES: Final = 3


@dataclass(frozen=True, slots=True)
class Status:
    """One update to report; ``state`` defaults to the record's ProcessState."""

    event: StatusEvent
    step: str | None = None
    detail: str = ""
    state: OrderStatus | None = None


def is_app_queue(settings: Settings, name: str) -> bool:
    """True if ``name`` is one of this app's queues (entity names are case-insensitive)."""
    folded = name.casefold()
    return any(folded == queue.casefold() for queue in settings.queues.values())


def publish(rt: Runtime, process: ProcessRecord, *statuses: Status) -> ProcessRecord:
    """Send ``statuses`` for the transition that produced ``process``; never raises.

    Returns the record to carry on with: ``process`` itself, or its successor when a send
    failure was recorded on it (callers that write again must use the returned record).
    """
    if not statuses or process.reply_to is None or process.reply_error is not None:
        return process
    if len(statuses) > SLOTS:
        raise ValueError(f"a transition reports at most {SLOTS} status updates")
    queue = process.reply_to
    failure = _failures.get(queue, rt.clock())
    if failure is None:
        try:
            for k, status in enumerate(statuses):
                rt.status_bus().send(queue, _update(process, k, status))
            return process
        # Status replies are a side channel: no error in sending one may fail the order's own
        # processing, whatever the SDK raises.
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
            _failures.put(queue, failure, rt.clock())
            log.warning("order %s: status reply to %s failed: %s", process.order_id, queue, failure)
    return _stop_replies(rt, process, failure)


def _update(process: ProcessRecord, k: int, status: Status) -> StatusUpdate:
    return StatusUpdate(
        order_id=process.order_id,
        sequence=process.timeline_seq * SLOTS + k,
        state=status.state or process.state.value,
        event=status.event,
        step=status.step,
        detail=status.detail,
        updated_at=process.updated_at,
    )


def _stop_replies(rt: Runtime, process: ProcessRecord, failure: str) -> ProcessRecord:
    actor = rt.actor("scheduler")
    reason = f"status replies to {process.reply_to!r} stopped: {failure}"
    current = process
    for _ in range(_CONFLICT_RETRIES):
        try:
            recorded = rt.store.annotate(
                current,
                actor=actor,
                event="status_replies_stopped",
                detail=reason,
                reply_error=reason,
            )
        except ConcurrencyConflict:
            try:
                current = rt.store.get_process(process.order_id)
            except OrderNotFound:
                return process
            if current.reply_error is not None:
                return current  # another instance recorded it (and alerted)
            continue
        _alert(rt, recorded, reason, actor)
        return recorded
    log.warning(
        "order %s: could not record the reply failure (busy); next update tries again",
        process.order_id,
    )
    return current


def _alert(rt: Runtime, process: ProcessRecord, reason: str, actor: str) -> None:
    try:
        rt.alert(
            OperatorAlert(
                order_id=process.order_id,
                severity="warning",
                reason="reply_queue_unavailable",
                detail=(
                    f"{reason}. The order carries on without status updates; tell the submitter "
                    "to create the queue or grant this app Send on it."
                ),
                source=actor,
            )
        )
    except Exception as exc:  # the failure is recorded on the order; the alert is best effort
        log.error("order %s: could not alert about its reply queue: %s", process.order_id, exc)


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
            return f"{entry[1]} (failed at {entry[0].isoformat(timespec='seconds')})"

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
