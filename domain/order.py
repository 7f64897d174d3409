"""The order as one record: the pattern's state, its steps, and the messages it still owes.

Everything the lifecycle (:mod:`domain.lifecycle`) decides on is in :class:`Order`, so one read
loads it and one ETag-conditional write changes it: the pattern's fields (OrderID, LockedBy,
CompleteBy, ProcessState, FailureCount), what each step is known to have done, the payload
agents need, and the **outbox** - the messages the last write implied, kept on the same record
until they are known to be delivered. Nothing here does I/O or imports an SDK.

The record changes itself, by named transitions that each keep their own invariants: a step is
:meth:`StepRecord.sent`, :meth:`~StepRecord.succeeded`, :meth:`~StepRecord.declined`,
:meth:`~StepRecord.undone`, :meth:`~StepRecord.voided`, :meth:`~StepRecord.failed` (and whose
failure that was, :meth:`~StepRecord.answered_late`) or starts :meth:`~StepRecord.afresh`
(:data:`STEP_TRANSITIONS`); the order is :meth:`Order.claimed`, :meth:`~Order.released`,
:meth:`~Order.processed`, :meth:`~Order.compensating`, :meth:`~Order.in_error`, ... What the
lifecycle decides is which transition, when.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Final, Literal

from domain import ids
from domain.messages import JsonObject, MessageBase, StatusEvent, StatusUpdate
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


_S = StepState
# Which StepState may follow which, by the transitions of StepRecord below, when every remote
# service keeps its contract (docs/remote-service-contract.md). A self-transition is a request
# sent again: a do retried (Running), an undo sent (Running or Succeeded: the state waits for
# its answer). An undo sent while the outcome was unknown may see the decline come first: it
# is retried (Failed -> Failed) until answered "nothing to undo" (Failed -> Voided). -> Pending:
# the step starts afresh in a new generation (an operator's resubmit or restart).
# tests/unit/test_lifecycle_transitions.py checks that the stateful exploration makes every one
# of these and no other.
STEP_TRANSITIONS: Final = MappingProxyType(
    {
        _S.PENDING: frozenset({_S.RUNNING}),
        _S.RUNNING: frozenset(
            {_S.RUNNING, _S.SUCCEEDED, _S.FAILED, _S.COMPENSATED, _S.VOIDED, _S.PENDING}
        ),
        _S.SUCCEEDED: frozenset({_S.SUCCEEDED, _S.COMPENSATED, _S.PENDING}),
        _S.FAILED: frozenset({_S.FAILED, _S.VOIDED, _S.PENDING}),
        _S.COMPENSATED: frozenset({_S.PENDING}),
        _S.VOIDED: frozenset({_S.PENDING}),
    }
)

Whose = Literal["at_service", "on_our_side", "unanswered"]
"""Whose failure a failed attempt was (:class:`Failures`)."""


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

    def forward_key(self, order_id: str) -> str:
        return ids.idempotency_key(order_id, self.name, "do", self.generation)

    def key(self, order_id: str, operation: ids.Operation) -> str:
        return ids.idempotency_key(order_id, self.name, operation, self.generation)

    # ------------------------------------------------------------------------ transitions

    def sent(self, operation: ids.Operation, attempt: int, generation: int) -> StepRecord:
        """The step once ``operation`` is sent for it as the order's request ``attempt``, under
        a key of ``generation``: a do may take effect from now on (Running); an undo leaves the
        state as it is until it is answered."""
        return replace(
            self,
            state=StepState.RUNNING if operation == "do" else self.state,
            generation=generation,
            attempt=self.attempt + 1,
            requests=self._sending(operation, attempt),
        )

    def succeeded(self, result: JsonObject | None, at: datetime) -> StepRecord:
        """Its service says the do took effect (``at``: when it answered)."""
        return replace(
            self,
            state=StepState.SUCCEEDED,
            result=result,
            error_code=None,
            error_message=None,
            completed_at=at,
        )

    def declined(self, code: str | None, message: str | None, at: datetime) -> StepRecord:
        """Its service refused the do: no effect, ever, for this key."""
        return replace(
            self,
            state=StepState.FAILED,
            error_code=code,
            error_message=message,
            completed_at=at,
        )

    def undone(self, at: datetime) -> StepRecord:
        """Its service undid the effect."""
        return replace(self, state=StepState.COMPENSATED, compensated_at=at)

    def voided(self, at: datetime) -> StepRecord:
        """Its service found nothing to undo, and refuses the forward key for ever after."""
        return replace(self, state=StepState.VOIDED, compensated_at=at)

    def afresh(self) -> StepRecord:
        """The step as if never requested, for a new generation: a do under a new key."""
        return StepRecord(self.name, self.index)

    # ------------------------------------------------------------------- whose failure

    def failures(self, operation: ids.Operation) -> Failures:
        return self.forward_failures if operation == "do" else self.undo_failures

    def failed(self, operation: ids.Operation, attempt: int, whose: Whose) -> StepRecord:
        """The order's request ``attempt`` (``operation`` of this step) failed, and whose
        failure it was (``unanswered``: not known yet; :meth:`answered_late` settles it if an
        answer comes)."""
        failures = self.failures(operation)
        if whose == "unanswered":
            failures = replace(failures, unanswered=(*failures.unanswered, attempt))
        elif whose == "at_service":
            failures = replace(failures, at_service=failures.at_service + 1)
        else:
            failures = replace(failures, on_our_side=failures.on_our_side + 1)
        return self._with_failures(operation, failures)

    def answered_late(
        self, operation: ids.Operation, attempt: int, whose: Literal["at_service", "on_our_side"]
    ) -> StepRecord:
        """An answer came for request ``attempt``: if it was given up on unanswered, the
        answer says whose failure that was. Else the step is unchanged."""
        failures = self.failures(operation)
        if attempt not in failures.unanswered:
            return self
        unanswered = tuple(other for other in failures.unanswered if other != attempt)
        failures = replace(failures, unanswered=unanswered)
        return self._with_failures(operation, failures).failed(operation, attempt, whose)

    def without_failures(self) -> StepRecord:
        """The step's outcome without the record of whose failure each attempt was."""
        return replace(self, forward_failures=NO_FAILURES, undo_failures=NO_FAILURES)

    def _with_failures(self, operation: ids.Operation, failures: Failures) -> StepRecord:
        if operation == "do":
            return replace(self, forward_failures=failures)
        return replace(self, undo_failures=failures)

    # --------------------------------------------------------------- requests sent

    def asked(self, operation: ids.Operation, attempt: int | None = None) -> bool | None:
        """Whether ``operation`` was sent for this step in this generation (as the order's
        request ``attempt``, if given); None when not known (see :attr:`requests`)."""
        if self.requests is None:
            return None
        return any(
            run.operation == operation and (attempt is None or run.first <= attempt <= run.last)
            for run in self.requests
        )

    def _sending(self, operation: ids.Operation, attempt: int) -> tuple[Requests, ...] | None:
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

    @property
    def held(self) -> bool:
        """A status update the submitter's queue refused, held until its ``not_before``."""
        return self.to == "reply" and self.not_before is not None


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

    @property
    def held_until(self) -> datetime | None:
        """When the status updates the order holds are due to be tried again (None: none)."""
        return max((o.not_before for o in self.outbox if o.held and o.not_before), default=None)

    # ------------------------------------------------------------------ requests sent

    def never_sent(
        self, step: StepRecord, operation: ids.Operation, generation: int, attempt: int
    ) -> str | None:
        """Why the record proves the order never sent request ``attempt`` (``operation`` of
        ``step`` under a key of ``generation``); None when it sent it, or when ``generation``
        is earlier than the step's (whether it was sent is not known any more)."""
        known = self._generation_of(step)
        if generation < known:
            return None
        if generation > known:
            return f"{step.name}'s requests are of generation {known}"
        sent = step.asked(operation, attempt)
        if sent is None:  # recorded before requests were: what the record still proves
            if attempt > self.attempt:
                return f"the order has sent {self.attempt} requests in all"
            if operation == "undo" and self.compensation_cause is None:
                return "the order has not undone anything"
            return None
        if sent:
            return None
        runs = [
            f"{run.operation} at attempt {run.first}"
            + (f" to {run.last}" if run.last > run.first else "")
            for run in step.requests or ()
        ]
        return f"{step.name} was sent: {', '.join(runs) or 'nothing'} (generation {known})"

    def _undo_sent(self, step: StepRecord) -> bool:
        sent = step.asked("undo")
        return self.compensation_cause is not None if sent is None else sent

    def _generation_of(self, step: StepRecord) -> int:
        """The generation of the key ``step``'s requests carry: the order's for a step not
        requested yet, else the one it was first requested in."""
        return self.generation if step.state is StepState.PENDING else step.generation

    # -------------------------------------------------------------------- transitions

    def with_record(self, record: StepRecord) -> Order:
        """The order with ``record`` in place of its step of the same name."""
        steps = tuple(record if s.name == record.name else s for s in self.steps)
        return replace(self, steps=steps)

    def claimed(self, actor: str, complete_by: datetime) -> Order:
        """The current step taken for one attempt: the order's next request is sent for it,
        and ``actor`` holds the order until ``complete_by``. Processing forward, Compensating
        back."""
        record = self.step(self.current_step)
        attempt = self.attempt + 1
        sent = record.sent(self.current_operation, attempt, self._generation_of(record))
        forward = self.current_operation == "do"
        return replace(
            self.with_record(sent),
            state=ProcessState.PROCESSING if forward else ProcessState.COMPENSATING,
            locked_by=actor,
            complete_by=complete_by,
            attempt=attempt,
            next_attempt_at=None,
        )

    def attempt_failed(self, whose: Whose) -> Order:
        """The attempt in flight failed; ``whose`` failure it was is recorded on its step."""
        record = self.step(self.current_step)
        return self.with_record(record.failed(self.current_operation, self.attempt, whose))

    # An order with no attempt in flight is unlocked: nobody holds it, it has no CompleteBy
    # (released, processed, in_error).

    def released(self, due: datetime, reason: str, failure_count: int) -> Order:
        """No attempt in flight; the current step is tried again at ``due``. Pending forward,
        Compensating back."""
        backward = self.current_operation == "undo"
        return replace(
            self,
            state=ProcessState.COMPENSATING if backward else ProcessState.PENDING,
            locked_by=None,
            complete_by=None,
            failure_count=failure_count,
            next_attempt_at=due,
            last_error=reason,
        )

    def moving_to(self, step: str) -> Order:
        """The step before succeeded: ``step`` is next, with no failure counted yet."""
        return replace(
            self, current_step=step, current_operation="do", failure_count=0, last_error=None
        )

    def processed(self) -> Order:
        """Its last step succeeded: every step took effect."""
        return replace(
            self,
            state=ProcessState.PROCESSED,
            locked_by=None,
            complete_by=None,
            next_attempt_at=None,
            failure_count=0,
            last_error=None,
        )

    def compensating(self, cause: str, reason: str, now: datetime) -> Order:
        """Compensation begins (``now``): what took effect is to be undone, latest first."""
        return replace(
            self,
            compensation_cause=cause,
            compensation_reason=reason,
            last_error=reason,
            failure_count=0,
            compensation_started_at=now,
            compensation_warned=False,
        )

    def undoing(self, step: str) -> Order:
        """``step`` is the next to undo, with no failure of its undo counted yet."""
        return replace(
            self,
            state=ProcessState.COMPENSATING,
            current_step=step,
            current_operation="undo",
            failure_count=0,
        )

    def undo_failed(self, now: datetime) -> Order:
        """The undo in flight failed once more. An order that began to compensate before
        compensation budgets existed counts its budget from this first failure (``now``)."""
        started = self.compensation_started_at or now
        return replace(self, failure_count=self.failure_count + 1, compensation_started_at=started)

    def compensation_resumed(self, step: str, now: datetime) -> Order:
        """An operator resumes an incomplete compensation at ``step``: a new budget from
        ``now``, and a new warning if it takes long."""
        return replace(self.undoing(step), compensation_started_at=now, compensation_warned=False)

    def in_error(self, reason: str) -> Order:
        """Ended in Error, for ``reason``."""
        return replace(
            self,
            state=ProcessState.ERROR,
            locked_by=None,
            complete_by=None,
            next_attempt_at=None,
            last_error=reason,
        )

    def redone(self, start: int) -> Order:
        """An Error order back in flight with the next generation, at its first step not
        Succeeded: every step from index ``start`` on, and every one not Succeeded, starts
        afresh (new keys); the Succeeded ones before ``start`` are kept."""
        steps = tuple(
            s if s.state is StepState.SUCCEEDED and s.index < start else s.afresh()
            for s in self.steps
        )
        first = next(s for s in steps if s.state is not StepState.SUCCEEDED)
        return replace(
            self,
            state=ProcessState.PENDING,
            generation=self.generation + 1,
            steps=steps,
            current_step=first.name,
            current_operation="do",
            failure_count=0,
            last_error=None,
            compensation_cause=None,
            compensation_reason=None,
            compensation_started_at=None,
            compensation_warned=False,
        )

    def migrated(self, workflow: str, steps: tuple[str, ...], kept: int) -> Order:
        """On version ``workflow`` (its ``steps`` by name), keeping the record of the first
        ``kept`` steps, which that version shares; the rest are new, not requested."""
        new = tuple(StepRecord(name, index) for index, name in enumerate(steps) if index >= kept)
        return replace(self, workflow=workflow, steps=self.steps[:kept] + new)

    # ------------------------------------------------------------------------- outbox

    def owing(self, outgoing: Outgoing) -> Order:
        return replace(self, outbox=(*self.outbox, outgoing))

    def reporting(
        self, event: StatusEvent, now: datetime, *, step: str | None = None, detail: str = ""
    ) -> Order:
        """Owe the submitter a status update (if it named a reply queue), numbered in
        sequence. Behind updates that are held, it waits as long as they do: they arrive in
        order."""
        if self.reply_to is None:
            return self
        update = StatusUpdate(
            order_id=self.order_id,
            sequence=self.status_seq,
            state=self.state.value,
            event=event,
            step=step,
            detail=detail,
            updated_at=now,
        )
        owed = Outgoing("reply", update, not_before=self.held_until)
        return replace(self.owing(owed), status_seq=self.status_seq + 1)

    def warned_of(self, warning: Outgoing) -> Order:
        """Owe the one warning per compensation that it takes long."""
        return replace(self.owing(warning), compensation_warned=True)


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
