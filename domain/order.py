"""The order as one record: the pattern's state, its steps, and the messages it still owes.

Everything the lifecycle (:mod:`domain.lifecycle`) decides on is in :class:`Order`, so one read
loads it and one ETag-conditional write changes it: the pattern's fields (OrderID, LockedBy,
CompleteBy, ProcessState, FailureCount), what each step is known to have done, the payload
agents need, and the **outbox** - the messages the last write implied, kept on the same record
until they are known to be delivered. Nothing here does I/O or imports an SDK.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Final

from domain import ids
from domain.messages import JsonObject, MessageBase
from domain.states import ProcessState

Destination = str
"""Where an outgoing message goes: an agent's queue (its name in :mod:`domain.agents`),
``commands``, ``alerts``, or ``reply`` - the submitter's queue (the order's ``reply_to``). The
shell maps these to queue names."""


class StepState(StrEnum):
    """What is known about one step's effect at its remote service.

    Pending: never requested in this generation - no effect. Running: requested, outcome
    unknown - it may have taken effect. Succeeded: it took effect. Failed: the service refused
    it - no effect, ever, for that key. Compensated: it took effect and was undone. Voided: its
    undo found nothing done, and the service refuses that forward key for ever after.
    """

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    COMPENSATED = "Compensated"
    VOIDED = "Voided"

    @property
    def may_have_effect(self) -> bool:
        """An effect that may be in place: compensation must undo (or void) this step."""
        return self in (StepState.RUNNING, StepState.SUCCEEDED)


@dataclass(frozen=True, slots=True)
class Requests:
    """Requests sent one after another for one step: ``operation`` as the order's requests
    ``first`` to ``last`` (:attr:`Order.attempt` values; each retry sends the next one)."""

    operation: ids.Operation
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class Failures:
    """The failed attempts of one direction (do or undo) of a step, by whose failure each was.

    ``at_service``: the request reached an agent, which called the service: the service failed,
    or did not answer in time. ``on_our_side``: it never left our side - an agent took it up
    only after its deadline, or its retry was never claimed (a host frozen, killed or behind).
    ``unanswered``: the attempts given up on at their deadline with no answer so far; an answer
    that comes later moves each to one of the other two (docs/remote-service-contract.md).
    """

    at_service: int = 0
    on_our_side: int = 0
    unanswered: tuple[int, ...] = ()

    @property
    def total(self) -> int:
        return self.at_service + self.on_our_side + len(self.unanswered)


NO_FAILURES: Final = Failures()


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step of the order. ``generation`` is that of the forward key last requested."""

    name: str
    index: int
    state: StepState = StepState.PENDING
    generation: int = 0
    attempt: int = 0
    """Requests sent for this step (forward and undo) since its generation began."""
    result: JsonObject | None = None
    error_code: str | None = None
    error_message: str | None = None
    completed_at: datetime | None = None
    compensated_at: datetime | None = None
    requests: tuple[Requests, ...] | None = ()
    """Which requests were sent for this step since its generation began, oldest first: what
    an answer is checked against (it must answer one of them). None: not known, for a step
    recorded before they were, until it starts afresh."""
    forward_failures: Failures = NO_FAILURES
    undo_failures: Failures = NO_FAILURES
    """Failed attempts of this generation, forward and undo, by whose failure each was."""

    def failures(self, operation: ids.Operation) -> Failures:
        return self.forward_failures if operation == "do" else self.undo_failures

    def forward_key(self, order_id: str) -> str:
        return ids.idempotency_key(order_id, self.name, "do", self.generation)

    def key(self, order_id: str, operation: ids.Operation) -> str:
        return ids.idempotency_key(order_id, self.name, operation, self.generation)

    def sent(self, operation: ids.Operation, attempt: int) -> bool:
        """Whether ``operation`` was sent for this step as the order's request ``attempt`` in
        this generation (False when not known: see :attr:`requests`)."""
        return any(
            run.operation == operation and run.first <= attempt <= run.last
            for run in self.requests or ()
        )

    def sending(self, operation: ids.Operation, attempt: int) -> tuple[Requests, ...] | None:
        """:attr:`requests` once ``operation`` is sent as the order's request ``attempt``."""
        if self.requests is None:
            return None
        if self.requests:
            last = self.requests[-1]
            if last.operation == operation and last.last == attempt - 1:
                return (*self.requests[:-1], replace(last, last=attempt))
        return (*self.requests, Requests(operation, attempt, attempt))


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message the order owes: sent after the write that recorded it, resent until known
    delivered. ``not_before``: deliver no earlier (a scheduled message)."""

    to: Destination
    message: MessageBase
    not_before: datetime | None = None


@dataclass(frozen=True, slots=True)
class Order:
    """The order's whole mutable state (the ``process`` row). ``etag`` guards every write."""

    order_id: str
    workflow: str
    state: ProcessState
    locked_by: str | None
    complete_by: datetime | None
    failure_count: int
    attempt: int
    """Agent requests sent for this order, all steps and generations: a request's identity."""
    generation: int
    current_step: str
    current_operation: ids.Operation
    reply_to: str | None
    payload: JsonObject
    """What every agent is told about the order (built once at intake)."""
    steps: tuple[StepRecord, ...]
    created_at: datetime
    updated_at: datetime
    next_attempt_at: datetime | None = None
    last_error: str | None = None
    compensation_cause: str | None = None
    compensation_reason: str | None = None
    compensation_started_at: datetime | None = None
    """When the order last began to compensate (its compensation budget counts from then)."""
    compensation_warned: bool = False
    """The warning that this compensation takes long was raised (once per compensation)."""
    status_seq: int = 0
    """StatusUpdates issued so far; the next one gets this sequence number."""
    outbox: tuple[Outgoing, ...] = ()
    timeline_seq: int = 0
    trace_parent: str | None = None
    """The W3C ``traceparent`` of the span that created the order (intake's), so that work on
    the order started elsewhere (the Supervisor's timer, an operator) continues its trace.
    Always valid (:func:`valid_trace_parent`) or None."""
    etag: str = ""
    write_id: str = ""

    def step(self, name: str) -> StepRecord:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"order {self.order_id} has no step {name!r}")

    def with_step(self, name: str, **changes: object) -> Order:
        steps = tuple(replace(s, **changes) if s.name == name else s for s in self.steps)
        return replace(self, steps=steps)

    @property
    def open_steps(self) -> tuple[StepRecord, ...]:
        """Steps whose record an answer to a request already sent may still change: a do
        whose outcome is unknown (Running), or an undo sent while the effect is still recorded
        in place (for a step whose requests are not known: once compensation began)."""
        return tuple(
            s
            for s in self.steps
            if s.state is StepState.RUNNING
            or (s.state is StepState.SUCCEEDED and self._undo_sent(s))
        )

    @property
    def settling(self) -> bool:
        """Ended (Processed or Error), and an answer may still change a step
        (:attr:`open_steps`). An ended order that is not settling is settled: nothing but an
        operator changes it (:mod:`domain.states`)."""
        return self.state.terminal and bool(self.open_steps)

    def _undo_sent(self, step: StepRecord) -> bool:
        if step.requests is None:
            return self.compensation_cause is not None
        return any(run.operation == "undo" for run in step.requests)


TRACE_PARENT_CHARS: Final = 55
_TRACE_PARENT: Final = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}", re.ASCII)


def valid_trace_parent(value: object) -> str | None:
    """``value`` if it is a W3C ``traceparent`` this app may store and continue, else None.

    Strict, as for anything that comes from outside (message properties, a stored row): version
    ``00`` only, lowercase hex, exactly 55 characters, neither id all zeros (the W3C invalid
    ids). A malformed one is dropped, never repaired.
    """
    if not isinstance(value, str) or len(value) != TRACE_PARENT_CHARS:
        return None
    match = _TRACE_PARENT.fullmatch(value)
    if match is None or int(match.group(1), 16) == 0 or int(match.group(2), 16) == 0:
        return None
    return value


def trace_id_of(trace_parent: str | None) -> str | None:
    """The 32-hex-digit trace id of a valid ``traceparent`` (Application Insights' operation
    id), else None."""
    valid = valid_trace_parent(trace_parent)
    return None if valid is None else valid[3:35]


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One row of an order's append-only history."""

    seq: int
    at: datetime
    actor: str
    event: str
    from_state: ProcessState | None
    to_state: ProcessState
    step: str | None
    attempt: int
    detail: str


TERMINAL_ALERT_REASONS: Final = frozenset(
    {"step_declined", "failure_threshold", "cancelled", "compensation_incomplete"}
)
"""Reasons of the one alert each Error order raises (the chaos checks count these)."""
COMPENSATION_DELAYED: Final = "compensation_delayed"
"""The reason of the warning an order raises once per compensation that has lasted longer than
COMPENSATION_WARN_AFTER_SECONDS: not terminal, the order keeps undoing."""
