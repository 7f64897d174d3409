"""The order lifecycle as pure decisions: ``decide(order, event, context) -> Decision``.

A Decision is the new order record (or None: nothing to write) and the messages to send after
writing it. The shell (:mod:`service.apply`) loads, decides, writes once (ETag) and sends; nothing
here does I/O, reads a clock or draws a random number.

**Outbox.** The messages a decision implies are stored on the record it writes (``outbox``) and
sent after the write, in order, with deterministic MessageIds. They stay on the record until
something proves them delivered: a reply to the AgentRequest in the outbox, or the retry command
in the outbox coming back, proves that every message before it was sent, because the causal
message is always sent last. Any other event carries the undelivered messages into the next
write, which sends them again (duplicate detection drops copies). Stale ones are dropped on the
way: an AgentRequest for an attempt no longer in flight, a retry command for a claim already
made. A finished order's outbox stays on its record; the shell deletes the order's active-index
row after sending it, so a row left behind tells the Supervisor to send it again.

**Replies by step key.** A reply names the idempotency key it answers. A definitive answer
(succeeded, declined, undone, nothing to undo) for the step in flight is applied whichever
attempt carried it, even after the order was released for a retry. A definitive answer for a step
no longer in flight changes no state but is recorded on its step (an effect happened, or never
will), so compensation undoes exactly what happened. Transient failures and deferrals count only
for the attempt in flight.

**Only answers to requests it sent.** Each step records the requests sent for it in its
generation (operation and attempt, :attr:`domain.order.StepRecord.requests`). An answer is
applied or recorded only if it answers one of them: anything else - a do or an undo never
requested, an attempt that carried another request, a generation the step never reached -
changes nothing and raises a critical ``unrequested_answer`` alert (a bug upstream, or a
leaked signing key). An answer for an earlier generation of a step changes nothing either;
whether it was sent is no longer recorded, so it raises nothing.

**Ended, settling, settled.** Processed and Error end an order: nothing more is sent for it on
its own. An Error order may end with outcomes still open (:attr:`domain.order.Order.open_steps`):
a step whose do was never answered for sure, or whose undo was sent and the effect is still
recorded in place. Until each is answered the order is *settling*: an answer to a request it
sent is recorded, as a ``settling`` row, or ``settled`` for the one that leaves nothing open.
A settled order (every Processed order) changes only by an operator's hand; the ``error`` row
says whether the order ended settling, and :func:`_write` refuses anything else. Two kinds of
row change what is recorded about an ended order, not the order, and come whether it settles
or is settled: its held status updates (below) sent again or given up (``replies_*``), and a
late answer saying whose failure an attempt given up on unanswered was (``late_answer``).

**Undo only what was done.** Compensation undoes, latest first, each step that succeeded or whose
outcome is unknown (Running). An undo names the forward key; the service undoes it, or answers
"nothing to undo" and refuses that key for ever (docs/remote-service-contract.md).

**An open circuit is not a failure.** A ``deferred`` reply re-arms the step for ``retry_at``
without touching FailureCount.

**Whose failure it was.** Each failed attempt is recorded on its step: at the service, on our
side (its request never reached the service), or unanswered until an answer for it says which.
Failures on our side do not count toward the failure threshold: our own outage delays an
order, it does not fail it.

**Compensation persists.** An undo that fails transiently or times out is retried with the
workflow's growing delays until the compensation budget, counted from when compensation
started, is spent; only an undo the service refuses, or a spent budget, ends compensation with
effects left (a critical alert). A compensation still going on after ``compensation_warn_after``
raises one warning.

**Status updates are owed until they arrive.** One that the submitter's queue refuses (it does
not exist, is disabled, or the app may not send to it) is *held*: it stays in the outbox with a
``not_before`` (event :class:`RepliesRefused`), no proof of delivery covers it, later updates
wait behind it, and the first write after that time owes them again, so the queue gets every
update, in order, once it takes them. A finished order holding updates keeps its active-index
row: the Supervisor sends them again at their time, each time later (up to an hour), and gives
up after :data:`REPLY_HOLD_LIMIT`, saying so in the timeline.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Final, Literal

from domain import ids
from domain.messages import (
    EXPIRED,
    AgentRequest,
    AgentResponse,
    OperatorAlert,
    OrderSubmitted,
    SchedulerCommand,
    Severity,
    StatusEvent,
    StatusUpdate,
    message_id_for,
)
from domain.order import (
    COMPENSATION_DELAYED,
    NO_FAILURES,
    Failures,
    Order,
    Outgoing,
    StepRecord,
    StepState,
    TimelineEntry,
)
from domain.states import ProcessState, transition_allowed
from domain.workflows import Step, Workflow

UNREQUESTED_REASON: Final = "unrequested_answer"
"""The alert of an answer to a request the order never sent."""
DEFAULT_STALE_AFTER: Final = timedelta(minutes=2)
DEFAULT_FLUSH_GRACE: Final = timedelta(seconds=10)
DEFAULT_SKEW: Final = timedelta(seconds=10)
"""How far two hosts' clocks may disagree by default (``CLOCK_SKEW_TOLERANCE_SECONDS``)."""
DEFAULT_COMPENSATION_BUDGET: Final = timedelta(hours=6)
DEFAULT_COMPENSATION_WARN_AFTER: Final = timedelta(minutes=10)
REPLY_RETRY_FIRST: Final = timedelta(minutes=5)
"""The soonest held status updates are tried again; then as long again as they have been held,
up to :data:`REPLY_RETRY_MAX`."""
REPLY_RETRY_MAX: Final = timedelta(hours=1)
REPLY_HOLD_LIMIT: Final = timedelta(hours=24)
"""How long a finished order's held status updates are tried before they are given up."""

_P = ProcessState


@dataclass(frozen=True, slots=True)
class Context:
    """What a decision may know besides the order and the event.

    ``actor``: who acts (LockedBy of a claim, the timeline's actor). ``jitter``: a number in
    [0, 1) the shell drew, spreading retry delays. ``stale_after``: how long a released order
    may wait past its retry time before the Supervisor releases it again (a failure); after
    half of it, the Supervisor resends what the order owes (no failure). ``flush_grace``: how
    long a finished order's writer has to send its outbox before the Supervisor does it.
    ``compensation_budget``: how long, from when compensation starts, a failed undo is
    retried; ``compensation_warn_after``: when a compensation still going on raises a warning.
    ``skew``: how far two hosts' clocks may disagree. A time another host stamped (a
    CompleteBy, a retry time, an update) is acted on only once ``now`` is past it by more than
    this, so a Supervisor whose clock runs ahead never recovers an order early.
    """

    workflow: Workflow
    now: datetime
    actor: str
    jitter: float = 0.5
    stale_after: timedelta = DEFAULT_STALE_AFTER
    flush_grace: timedelta = DEFAULT_FLUSH_GRACE
    compensation_budget: timedelta = DEFAULT_COMPENSATION_BUDGET
    compensation_warn_after: timedelta = DEFAULT_COMPENSATION_WARN_AFTER
    skew: timedelta = timedelta(0)


@dataclass(frozen=True, slots=True)
class Decision:
    """``order``: the record to write (None: write nothing). ``send``: the messages to send,
    in order, after the write. ``finished``: once sent, the order owes nothing any more (the
    shell removes its active-index row). ``entry``: the timeline row the write adds."""

    order: Order | None
    send: tuple[Outgoing, ...]
    entry: TimelineEntry | None = None
    finished: bool = False
    note: str = ""


# -------------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Replied:
    """``caused_by``: which message brought the reply (:meth:`core.aio.inbound.Delivery.cause`);
    it names the alerts deciding on it raises (None: they are named by their text)."""

    response: AgentResponse
    caused_by: str | None = None


@dataclass(frozen=True, slots=True)
class RetryDue:
    command: SchedulerCommand


@dataclass(frozen=True, slots=True)
class Resent:
    """The submission of an existing order came again (a redelivery after a crash)."""


@dataclass(frozen=True, slots=True)
class Swept:
    """The Supervisor looked at the order."""


@dataclass(frozen=True, slots=True)
class Cancel:
    actor: str
    reason: str


@dataclass(frozen=True, slots=True)
class Resubmit:
    """``outbox_delivered``: the shell knows the Error order's outbox was sent (its active-index
    row is gone), so the alert is not sent twice."""

    actor: str
    reason: str
    outbox_delivered: bool


@dataclass(frozen=True, slots=True)
class Restart:
    """Redo an Error order from ``step`` on: that step and every later one afresh (new keys),
    even one whose result was kept; the steps before it resume as a resubmit does."""

    actor: str
    reason: str
    step: str
    outbox_delivered: bool


@dataclass(frozen=True, slots=True)
class RepliesRefused:
    """The submitter's queue refused status update ``sequence``: it does not exist, is disabled,
    or the app may not send to it (``failure`` says which). ``sent``: the MessageIds of what
    the same send had sent before it, in the order's outbox order. A queue that might take it
    on a second try (a timeout, a busy broker) is not a refusal: that send fails, is made again."""

    sequence: int
    failure: str
    sent: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Migrate:
    """Move an order in flight to another version of its workflow (docs/versioning.md)."""

    to: Workflow
    actor: str
    reason: str


Event = Replied | RetryDue | Resent | Swept | Cancel | Resubmit | Restart | Migrate | RepliesRefused


class Refused(Exception):
    """An operator action that does not apply to the order as it is; ``code`` says why."""

    def __init__(
        self, code: Literal["not_found", "conflict", "busy", "invalid"], message: str
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ---------------------------------------------------------------------------- submission


def agent_payload(order: OrderSubmitted) -> dict:
    """What every remote service is told about the order (it needs no more)."""
    return {
        "order_id": order.order_id,
        "customer_id": order.customer_id,
        "currency": order.currency,
        "amount": order.total_cents,
        "items": [{"sku": item.sku, "qty": item.quantity} for item in order.items],
    }


def submit(submitted: OrderSubmitted, ctx: Context) -> Decision:
    """A new order, already claimed for its first step: created and dispatched in one write."""
    flow = ctx.workflow
    order = Order(
        order_id=ids.validate_order_id(submitted.order_id),
        workflow=flow.ref,
        state=_P.PENDING,
        locked_by=None,
        complete_by=None,
        failure_count=0,
        attempt=0,
        generation=1,
        current_step=flow.first_step.name,
        current_operation="do",
        reply_to=submitted.reply_to,
        payload=agent_payload(submitted),
        steps=tuple(StepRecord(step.name, index) for index, step in enumerate(flow.steps)),
        created_at=ctx.now,
        updated_at=ctx.now,
        timeline_seq=-1,
    )
    order = _claim(_status(order, ctx, "received", detail=f"workflow {flow.ref}"), ctx)
    detail = f"workflow {flow.ref}, {len(flow.steps)} steps; dispatched {flow.first_step.name}"
    return _write(order, order, ctx, "created", detail, from_state=None)


# ------------------------------------------------------------------------------- due time


def due_at(
    order: Order, stale_after: timedelta, flush_grace: timedelta, skew: timedelta = timedelta(0)
) -> datetime:
    """When the Supervisor must next look at ``order`` (:func:`_on_sweep` acts then).

    In flight and claimed: its CompleteBy. Released: half its stale time past its retry time
    (from then on each look resends what it owes, until it is stale). Finished: its flush grace
    (resend a final outbox a crash left unsent). Each plus ``skew``: the time was stamped by
    another host's clock. The active index keeps, per order, a time never later than this (see
    adapters.store.active_index).
    """
    if order.state.terminal:
        flushed = order.updated_at + flush_grace + skew
        held = _held_until(order)
        return flushed if held is None else max(flushed, held)
    if order.locked_by is not None and order.complete_by is not None:
        return order.complete_by + skew
    return (order.next_attempt_at or order.updated_at) + stale_after / 2 + skew


# -------------------------------------------------------------------------------- decide


def decide(order: Order, event: Event, ctx: Context) -> Decision:
    match event:
        case Replied(response, caused_by):
            return _on_reply(order, response, caused_by, ctx)
        case RetryDue(command):
            return _on_retry(order, command, ctx)
        case Resent():
            return _flush(order, "submission seen again")
        case Swept():
            return _on_sweep(order, ctx)
        case Cancel(actor, reason):
            return _on_cancel(order, actor, reason, ctx)
        case Resubmit(actor, reason, delivered):
            return _on_resubmit(order, actor, reason, delivered, ctx)
        case Restart(actor, reason, step, delivered):
            return _on_restart(order, actor, reason, step, delivered, ctx)
        case Migrate(to, actor, reason):
            return _on_migrate(order, to, actor, reason, ctx)
        case RepliesRefused(sequence, failure, sent):
            return _on_replies_refused(order, sequence, failure, sent, ctx)
    raise TypeError(f"not an event: {event!r}")


def _on_reply(order: Order, r: AgentResponse, caused_by: str | None, ctx: Context) -> Decision:
    if r.step not in ctx.workflow.step_names:
        return _reject(
            ctx,
            r,
            caused_by,
            f"reply names step {r.step!r}, which workflow {ctx.workflow.name} does not have "
            f"({', '.join(ctx.workflow.step_names)}); not applied",
        )
    step = order.step(r.step)
    unasked = _unasked(order, step, r)
    if unasked is not None:
        return _refuse_answer(order, r, caused_by, unasked, ctx)
    if r.generation != step.generation or step.state is StepState.PENDING:
        return _flush(order, f"reply for {r.idempotency_key}, which is not this step's key")
    delivered = any(
        isinstance(o.message, AgentRequest)
        and o.message.idempotency_key == r.idempotency_key
        and o.message.attempt == r.attempt
        for o in order.outbox
    )
    draft = _answered_late(_begin(order, delivered), r)
    moving = (_P.PENDING, _P.PROCESSING) if r.operation == "do" else (_P.COMPENSATING,)
    at_step = (order.current_step, order.current_operation) == (r.step, r.operation)
    in_flight = order.state in moving and at_step
    current = in_flight and order.locked_by is not None and r.attempt == order.attempt
    what = f"{r.operation} {r.step} attempt {r.attempt}"
    if r.outcome == "deferred":
        if current and r.retry_at is not None:
            return _defer(order, draft, r.retry_at, f"{what}: circuit open", ctx)
        return _late_answer(order, draft, r, f"{what} deferred, but no longer in flight", ctx)
    if r.outcome == "failed" and r.transient:
        if current:
            reason = f"{what} failed: {r.error_code}: {r.error_message}"
            whose: Whose = "on_our_side" if r.error_code == EXPIRED else "at_service"
            return _retry_or_fail(order, _failed(draft, whose), reason, ctx)
        return _late_answer(
            order, draft, r, f"{what} failed transiently, but no longer in flight", ctx
        )
    if r.operation == "do":
        return _on_forward_answer(order, draft, r, in_flight, ctx)
    return _on_undo_answer(order, draft, r, in_flight, ctx)


def _unasked(order: Order, step: StepRecord, r: AgentResponse) -> str | None:
    """Why the order's record proves it never sent the request ``r`` answers; None when it sent
    it, or when ``r`` is for an earlier generation of the step (not known any more)."""
    generation = order.generation if step.state is StepState.PENDING else step.generation
    if r.generation < generation:
        return None
    if r.generation > generation:
        return f"{r.step}'s requests are of generation {generation}"
    if step.requests is None:  # recorded before requests were: what the record still proves
        if r.attempt > order.attempt:
            return f"the order has sent {order.attempt} requests in all"
        if r.operation == "undo" and order.compensation_cause is None:
            return "the order has not undone anything"
        return None
    if step.sent(r.operation, r.attempt):
        return None
    runs = [
        f"{run.operation} at attempt {run.first}"
        + (f" to {run.last}" if run.last > run.first else "")
        for run in step.requests
    ]
    return f"{r.step} was sent: {', '.join(runs) or 'nothing'} (generation {generation})"


def _refuse_answer(
    order: Order, r: AgentResponse, caused_by: str | None, why: str, ctx: Context
) -> Decision:
    """Change nothing, and alert. The alert is named by the message that brought the answer
    (``caused_by``), so the answer delivered again is the same alert and another message is
    another; its text names the answer alone (``why`` goes to the log)."""
    answered = r.outcome
    if r.error_code is not None:
        answered += f" ({'transient ' if r.transient else ''}{r.error_code})"
    detail = (
        f"order {order.order_id} never sent the request this answer is for: {r.operation} "
        f"{r.step} attempt {r.attempt}, key {r.idempotency_key}, answered {answered}. The order "
        "was not changed; what the service did under that key stands. A signed answer to a "
        "request never sent is a bug upstream or a leaked signing key: find who sent message "
        f"{message_id_for(r)} to the response queue."
    )
    alert = _alert(ctx, order.order_id, "critical", UNREQUESTED_REASON, detail, caused_by=caused_by)
    return Decision(None, (Outgoing("alerts", alert),), note=f"{detail} ({why})")


def _on_forward_answer(
    order: Order, draft: Order, r: AgentResponse, in_flight: bool, ctx: Context
) -> Decision:
    step = order.step(r.step)
    if r.outcome == "succeeded":
        done = draft.with_step(
            r.step,
            state=StepState.SUCCEEDED,
            result=r.result,
            error_code=None,
            error_message=None,
            completed_at=r.responded_at,
        )
        if in_flight:
            return _advance(order, done, r.step, ctx)
        if step.state is StepState.RUNNING:
            detail = f"{r.step} took effect after it was given up on; recorded for compensation"
            return _late(order, done, ctx, "late_success", detail)
        return _late_answer(
            order, draft, r, f"{r.step} succeeded again (already {step.state})", ctx
        )
    refused = draft.with_step(
        r.step,
        state=StepState.FAILED,
        error_code=r.error_code,
        error_message=r.error_message,
        completed_at=r.responded_at,
    )
    reason = f"{r.step} declined: {r.error_code}: {r.error_message}"
    if in_flight:
        return _compensate(order, refused, "step_declined", reason, ctx)
    if step.state is StepState.RUNNING:
        return _late(order, refused, ctx, "late_decline", f"{reason} (no effect; nothing to undo)")
    return _late_answer(order, draft, r, f"{r.step} declined, but it is {step.state}", ctx)


def _on_undo_answer(
    order: Order, draft: Order, r: AgentResponse, in_flight: bool, ctx: Context
) -> Decision:
    step = order.step(r.step)
    if r.outcome == "failed":  # permanent: the service will not undo it
        reason = f"undo of {r.step} refused: {r.error_code}: {r.error_message}"
        if in_flight:
            return _give_up(order, draft, reason, ctx)
        return _late_answer(order, draft, r, f"{reason}, but that undo is no longer in flight", ctx)
    undone = StepState.COMPENSATED if r.outcome == "succeeded" else StepState.VOIDED
    resolved = draft.with_step(r.step, state=undone, compensated_at=r.responded_at)
    if in_flight:
        return _next_undo_or_finish(order, resolved, r.step, undone, ctx)
    if step.state.may_have_effect:
        return _late(order, resolved, ctx, "late_undo", f"{r.step}: {undone}")
    return _late_answer(
        order, draft, r, f"undo of {r.step} answered again (already {step.state})", ctx
    )


def _late(before: Order, after: Order, ctx: Context, event: str, detail: str) -> Decision:
    """Record an answer for a step no longer in flight (``event``). On an order that has ended
    it is the order settling: ``settling`` while an answer may still change a step,
    ``settled`` once none can (only an operator changes it after that)."""
    if before.state.in_flight:
        return _write(before, after, ctx, event, detail)
    left = ", ".join(s.name for s in after.open_steps)
    if left:
        return _write(before, after, ctx, "settling", f"{detail} (after the end; open: {left})")
    return _write(before, after, ctx, "settled", f"{detail} (after the end; nothing is open now)")


def _on_retry(order: Order, command: SchedulerCommand, ctx: Context) -> Decision:
    waiting = order.locked_by is None and order.state in (_P.PENDING, _P.COMPENSATING)
    if not waiting or command.attempt != order.attempt:
        return _flush(order, "retry command no longer current")
    sent = message_id_for(command)
    delivered = any(message_id_for(o.message) == sent for o in order.outbox)
    draft = _begin(order, delivered)
    return _write(order, _claim(draft, ctx), ctx, "claimed", f"retry: {command.reason}")


def _on_sweep(order: Order, ctx: Context) -> Decision:
    now = ctx.now - ctx.skew  # no earlier than any host's clock could say it is
    if order.state.terminal:
        if order.updated_at + ctx.flush_grace > now:
            return Decision(None, (), note="finished moments ago; its writer is sending")
        if _held_until(order) is not None:
            return _retry_replies(order, ctx)
        return Decision(None, order.outbox, finished=True, note="finished; outbox (re)sent")
    if order.locked_by is not None:
        if order.complete_by is None or order.complete_by > now:
            return Decision(None, (), note="in flight, within its deadline")
        reason = (
            f"{order.current_operation} {order.current_step} attempt {order.attempt} by "
            f"{order.locked_by} passed CompleteBy {order.complete_by.isoformat()}"
        )
        whose: Whose = "unanswered"  # until an answer for it comes, if one does
    else:
        since = order.next_attempt_at or order.updated_at
        if since + ctx.stale_after / 2 > now:
            return Decision(None, (), note="waiting for its retry")
        if since + ctx.stale_after > now:
            # Its retry is overdue: the command may never have left (a crash after the write
            # that released it). Send what it owes again; duplicate detection drops a copy.
            return _flush(order, "retry overdue; its messages sent again")
        reason = (
            f"{order.state} since {since.isoformat()} with no progress for "
            f"{ctx.stale_after.total_seconds():.0f}s"
        )
        whose = "on_our_side"  # its retry was never claimed: no request left for it
    return _retry_or_fail(order, _failed(_begin(order, delivered=False), whose), reason, ctx)


def _on_cancel(order: Order, actor: str, reason: str, ctx: Context) -> Decision:
    if order.state.terminal:
        raise Refused(
            "conflict",
            f"order {order.order_id} is {order.state}; only orders in flight can be cancelled",
        )
    if order.state is _P.COMPENSATING:
        raise Refused(
            "conflict",
            f"order {order.order_id} is already being undone ({order.compensation_reason})",
        )
    draft = replace(_begin(order, delivered=False), locked_by=None)
    return _compensate(order, draft, "cancelled", f"cancelled by {actor}: {reason}", ctx)


def _on_migrate(order: Order, to: Workflow, actor: str, reason: str, ctx: Context) -> Decision:
    if order.state not in (_P.PENDING, _P.PROCESSING) or order.current_operation != "do":
        raise Refused(
            "conflict",
            f"order {order.order_id}: {order.state} (undoing or finished); only orders moving "
            "forward can be migrated",
        )
    old = ctx.workflow
    problem = old.migration_problem(to, order.current_step)
    if problem is not None:
        raise Refused("conflict", f"order {order.order_id} cannot be migrated: {problem}")
    shared = old.index_of(order.current_step) + 1
    steps = order.steps[:shared] + tuple(
        StepRecord(step.name, index) for index, step in enumerate(to.steps) if index >= shared
    )
    migrated = replace(order, workflow=to.ref, steps=steps)
    detail = f"{old.ref} -> {to.ref} by {actor}: {reason}"
    return _write(order, migrated, ctx, "migrated", detail)


def _on_resubmit(order: Order, actor: str, reason: str, delivered: bool, ctx: Context) -> Decision:
    draft = _errored(order, delivered, "resubmitted")
    left = _undo_plan(draft, ctx.workflow)
    if left:
        resumed = replace(
            draft,
            state=_P.COMPENSATING,
            current_step=left[0].name,
            current_operation="undo",
            failure_count=0,
            compensation_started_at=ctx.now,
            compensation_warned=False,
        )
        detail = f"{reason}; compensation resumed: undo {', '.join(s.name for s in left)}"
        resumed = _status(resumed, ctx, "resubmitted", step=left[0].name, detail=detail)
        return _write(order, _claim(resumed, ctx), ctx, "compensation_resumed", detail)
    if all(s.state is StepState.SUCCEEDED for s in draft.steps):
        raise Refused("conflict", f"order {order.order_id} has no step left to do")
    return _redo(order, draft, len(draft.steps), "resubmitted", reason, ctx)


def _on_restart(
    order: Order, actor: str, reason: str, step: str, delivered: bool, ctx: Context
) -> Decision:
    flow = ctx.workflow
    if step not in flow.step_names:
        raise Refused(
            "invalid",
            f"workflow {flow.ref} has no step {step[:64]!r}; restart from one of: "
            f"{', '.join(flow.step_names)}",
        )
    draft = _errored(order, delivered, "restarted")
    left = _undo_plan(draft, flow)
    if left:
        raise Refused(
            "conflict",
            f"order {order.order_id} still has undos left ({', '.join(s.name for s in left)}): "
            "resubmit it to finish its compensation, then restart it",
        )
    start = flow.index_of(step)
    why = f"{reason}; restart from {step}: redo {', '.join(flow.step_names[start:])}"
    return _redo(order, draft, start, "restarted", why, ctx)


def _errored(order: Order, delivered: bool, done: str) -> Order:
    """The draft an operator's action on an Error order starts from (its outbox dropped if
    ``delivered``); Refused for an order not in Error."""
    if order.state is not _P.ERROR:
        raise Refused(
            "conflict", f"order {order.order_id} is {order.state}; only Error orders can be {done}"
        )
    return replace(order, outbox=() if delivered else order.outbox)


def _redo(order: Order, draft: Order, start: int, event: str, why: str, ctx: Context) -> Decision:
    """Put an Error order back in flight with the next generation, from its first step not
    Succeeded: every step from index ``start`` on, and every one not Succeeded, starts afresh."""
    steps = tuple(
        s if s.state is StepState.SUCCEEDED and s.index < start else StepRecord(s.name, s.index)
        for s in draft.steps
    )
    first = next(s for s in steps if s.state is not StepState.SUCCEEDED)
    kept = [s.name for s in steps if s.state is StepState.SUCCEEDED]
    detail = f"{why}; resumes at {first.name}" + (f"; kept: {', '.join(kept)}" if kept else "")
    again = replace(
        draft,
        state=_P.PENDING,
        generation=order.generation + 1,
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
    again = _status(again, ctx, "resubmitted", step=first.name, detail=detail)
    return _write(order, _claim(again, ctx), ctx, event, detail)


# ----------------------------------------------------------------------------- movements


def _advance(before: Order, order: Order, done_step: str, ctx: Context) -> Decision:
    following = ctx.workflow.next_step(done_step)
    order = replace(order, failure_count=0, last_error=None)
    if following is None:
        # One update says the order finished: the step's own still reports it Processing.
        order = _status(order, ctx, "step_completed", step=done_step)
        order = _unlocked(order, _P.PROCESSED, next_attempt_at=None)
        order = _status(order, ctx, "processed")
        return _write(before, order, ctx, "processed", f"{done_step} succeeded", step=done_step)
    order = replace(order, current_step=following.name, current_operation="do")
    order = _status(order, ctx, "step_completed", step=done_step)
    detail = f"{done_step} succeeded; next {following.name}"
    return _write(before, _claim(order, ctx), ctx, "step_succeeded", detail, step=done_step)


def _claim(order: Order, ctx: Context) -> Order:
    """Take the current step for one attempt and put its AgentRequest in the outbox."""
    step = ctx.workflow.step_named(order.current_step)
    operation = order.current_operation
    record = order.step(step.name)
    generation = order.generation if record.state is StepState.PENDING else record.generation
    if operation == "do":
        state, step_state = _P.PROCESSING, StepState.RUNNING
    else:
        state, step_state = _P.COMPENSATING, record.state
        order = _warn_if_long(order, ctx)
    attempt = order.attempt + 1
    complete_by = ctx.now + step.deadline_budget
    order = order.with_step(
        step.name,
        state=step_state,
        generation=generation,
        attempt=record.attempt + 1,
        requests=record.sending(operation, attempt),
    )
    order = replace(
        order,
        state=state,
        locked_by=ctx.actor,
        complete_by=complete_by,
        attempt=attempt,
        next_attempt_at=None,
    )
    record = order.step(step.name)
    if operation == "do":
        tries = f"attempt {record.attempt}" if record.attempt > 1 else ""
        order = _status(order, ctx, "step_started", step=step.name, detail=tries)
    request = AgentRequest(
        order_id=order.order_id,
        step=step.name,
        operation=operation,
        action=step.action_for(operation),
        attempt=attempt,
        complete_by=complete_by,
        run_budget_s=step.complete_by_budget.total_seconds(),
        idempotency_key=record.key(order.order_id, operation),
        undoes=record.forward_key(order.order_id) if operation == "undo" else None,
        payload=order.payload,
        requested_at=ctx.now,
    )
    return _owe(order, Outgoing(step.agent, request))


def _retry_or_fail(before: Order, draft: Order, reason: str, ctx: Context) -> Decision:
    """Release for a delayed retry (FailureCount + 1); at the threshold, compensate. An undo
    has no threshold: :func:`_retry_undo`.

    Failures known to have never left our side (a retry never claimed, a request its agent
    took up only after its deadline) do not count toward the threshold: they say nothing about
    the service, and our own outage delays an order, it does not fail it. They still count for
    the retry delay, which grows with FailureCount (docs/deploy.md, "Whose failure it was").
    """
    if draft.current_operation == "undo":
        return _retry_undo(before, draft, reason, ctx)
    threshold = ctx.workflow.failure_threshold
    failures = draft.failure_count + 1
    ours = draft.step(draft.current_step).forward_failures.on_our_side
    counted = failures - ours
    if counted >= threshold:
        detail = (
            f"{reason}; failure threshold of {threshold} reached after {counted} failed attempts"
        )
        if ours:
            detail += f" (and {ours} that never left our side)"
        draft = replace(draft, failure_count=failures)
        return _compensate(before, draft, "failure_threshold", detail, ctx)
    due = _retry_due(failures, ctx)
    released = _release(draft, due, reason, ctx, failure_count=failures)
    if ours:
        count = f"{counted} of {threshold} failures count, {ours} never left our side"
        detail = f"{reason}; retry {failures} due {due.isoformat()}; {count}"
    else:
        detail = f"{reason}; retry {failures} of {threshold - 1} due {due.isoformat()}"
    return _write(before, released, ctx, "released", detail)


def _retry_undo(before: Order, draft: Order, reason: str, ctx: Context) -> Decision:
    """Retry a failed undo with growing backoff until the compensation budget is spent.

    An undo that failed transiently or timed out says nothing about whether the service will
    undo: the cause may be our own hosts, frozen or restarting. Giving up would leave the
    effect in place for a person, so compensation ends with effects left only when the service
    refuses the undo (:func:`_on_undo_answer`) or when this budget, counted from when
    compensation started, runs out.
    """
    failures = draft.failure_count + 1
    # An order that began to compensate before budgets existed counts from its first failure.
    started = draft.compensation_started_at or ctx.now
    draft = replace(draft, failure_count=failures, compensation_started_at=started)
    until = started + ctx.compensation_budget
    if ctx.now >= until:
        budget = ctx.compensation_budget.total_seconds()
        detail = (
            f"{reason}; compensation budget of {budget:.0f}s spent (compensating since "
            f"{started.isoformat()}) after {failures} failed attempts at this undo"
        )
        return _give_up(before, draft, detail, ctx)
    due = _retry_due(failures, ctx)
    released = _release(draft, due, reason, ctx, failure_count=failures)
    detail = f"{reason}; undo retry {failures} due {due.isoformat()}, until {until.isoformat()}"
    return _write(before, released, ctx, "released", detail)


def _retry_due(failures: int, ctx: Context) -> datetime:
    """When retry number ``failures`` is due: the workflow's growing delay, jittered."""
    return ctx.now + ctx.workflow.retry.delay(failures, ctx.jitter)


def _warn_if_long(order: Order, ctx: Context) -> Order:
    """Once per compensation that has gone on longer than ``compensation_warn_after``: a warning
    (not a terminal alert: the order keeps undoing) saying what fails and until when it tries."""
    started = order.compensation_started_at
    if order.compensation_warned or started is None:
        return order
    if ctx.now - started < ctx.compensation_warn_after:
        return order
    step = order.step(order.current_step)
    failed = step.undo_failures
    minutes = (ctx.now - started).total_seconds() / 60
    detail = (
        f"order {order.order_id} has been compensating for {minutes:.0f} min, since "
        f"{started.isoformat()} ({order.compensation_reason or 'no reason recorded'}). The undo "
        f"of {step.name} failed {failed.total} times: {failed.at_service} at the service, "
        f"{failed.on_our_side} on our side, {len(failed.unanswered)} unanswered. It is retried "
        f"until {(started + ctx.compensation_budget).isoformat()}; if it has not succeeded by "
        "then, the order ends in Error with a critical alert naming what is left in place."
    )
    seq = order.timeline_seq + 1
    alert = _alert(ctx, order.order_id, "warning", COMPENSATION_DELAYED, detail, timeline_seq=seq)
    return replace(_owe(order, Outgoing("alerts", alert)), compensation_warned=True)


def _defer(before: Order, draft: Order, retry_at: datetime, reason: str, ctx: Context) -> Decision:
    due = max(retry_at, ctx.now)
    released = _release(draft, due, reason, ctx, failure_count=draft.failure_count)
    detail = f"{reason}; retry due {due.isoformat()} (not counted as a failure)"
    return _write(before, released, ctx, "deferred", detail)


def _release(
    order: Order, due: datetime, reason: str, ctx: Context, *, failure_count: int
) -> Order:
    state = _P.COMPENSATING if order.current_operation == "undo" else _P.PENDING
    order = _unlocked(
        order, state, failure_count=failure_count, next_attempt_at=due, last_error=reason
    )
    command = SchedulerCommand(
        order_id=order.order_id,
        command="retry",
        attempt=order.attempt,
        failure_count=failure_count,
        reason=reason,
        requested_by=ctx.actor,
        requested_at=ctx.now,
    )
    return _owe(order, Outgoing("commands", command, not_before=due))


def _unlocked(order: Order, state: ProcessState, **changes: object) -> Order:
    """``order`` in ``state`` with no attempt in flight: nobody holds it, no CompleteBy."""
    return replace(order, state=state, locked_by=None, complete_by=None, **changes)


def _compensate(before: Order, draft: Order, cause: str, reason: str, ctx: Context) -> Decision:
    """Start undoing what may have taken effect, latest first; or fail at once if nothing has."""
    order = replace(
        draft,
        compensation_cause=cause,
        compensation_reason=reason,
        last_error=reason,
        failure_count=0,
        compensation_started_at=ctx.now,
        compensation_warned=False,
    )
    plan = _undo_plan(order, ctx.workflow)
    if not plan:
        final = f"{reason}; nothing to undo"
        return _fail(before, order, cause, final, ctx)
    names = ", ".join(step.name for step in plan)
    order = replace(
        order, state=_P.COMPENSATING, current_step=plan[0].name, current_operation="undo"
    )
    order = _status(
        order, ctx, "compensating", step=plan[0].name, detail=f"{reason}; undoing {names}"
    )
    detail = f"{reason}; to undo: {names}"
    return _write(before, _claim(order, ctx), ctx, "compensation_started", detail)


def _next_undo_or_finish(
    before: Order, order: Order, step: str, undone: StepState, ctx: Context
) -> Decision:
    what = "undone" if undone is StepState.COMPENSATED else "nothing to undo"
    order = _status(order, ctx, "step_compensated", step=step, detail=what)
    plan = _undo_plan(order, ctx.workflow)
    if plan:
        order = replace(order, current_step=plan[0].name, failure_count=0)
        detail = f"{step}: {what}; next undo {plan[0].name}"
        return _write(before, _claim(order, ctx), ctx, "step_compensated", detail, step=step)
    cause = order.compensation_cause or "step_declined"
    reason = order.compensation_reason or "compensated"
    undid = [s.name for s in order.steps if s.state is StepState.COMPENSATED]
    voided = [s.name for s in order.steps if s.state is StepState.VOIDED]
    summary = f"undid {', '.join(undid) or 'nothing'}"
    if voided:
        summary += f"; never took effect: {', '.join(voided)}"
    final = f"{reason}; compensated: {summary}"
    return _fail(before, order, cause, final, ctx, step=step)


def _give_up(before: Order, order: Order, reason: str, ctx: Context) -> Decision:
    """An undo cannot be completed: Error, and a critical alert naming what is left in place."""
    left = _undo_plan(order, ctx.workflow)
    names = ", ".join(f"{s.name} ({s.undo_operation} at {s.agent})" for s in left) or "none"
    final = (
        f"compensation incomplete: {reason}; steps left to undo: {names}; "
        f"compensating because: {order.compensation_reason or 'unknown'}"
    )
    advice = (
        "These effects may still be in place at the remote services: undo them by hand, or "
        "resubmit the order once the service recovers to retry the undo."
    )
    return _fail(
        before, order, "compensation_incomplete", final, ctx, severity="critical", advice=advice
    )


def _fail(
    before: Order,
    order: Order,
    cause: str,
    final: str,
    ctx: Context,
    *,
    severity: Severity | None = None,
    advice: str | None = None,
    step: str | None = None,
) -> Decision:
    if severity is None:
        severity = "warning" if cause == "cancelled" else "error"
    if advice is None:
        advice = (
            "The order is in Error (cancelled)."
            if cause == "cancelled"
            else "The order is in Error; resubmit it once the cause is fixed."
        )
    order = _unlocked(order, _P.ERROR, next_attempt_at=None, last_error=final)
    seq = before.timeline_seq + 1
    alert = _alert(ctx, order.order_id, severity, cause, f"{final}. {advice}", timeline_seq=seq)
    order = _status(_owe(order, Outgoing("alerts", alert)), ctx, "failed", detail=final)
    left = ", ".join(s.name for s in order.open_steps)
    settling = f"; settling: an answer may still change {left}" if left else ""
    return _write(before, order, ctx, "error", final + settling, step=step)


def _undo_plan(order: Order, flow: Workflow) -> list[Step]:
    """Steps that may have taken effect and can be undone, latest first."""
    return [
        flow.step_named(s.name)
        for s in sorted(order.steps, key=lambda s: -s.index)
        if s.state.may_have_effect and flow.step_named(s.name).compensable
    ]


# ------------------------------------------------------------------------ whose failure


Whose = Literal["at_service", "on_our_side", "unanswered"]


def _failed(order: Order, whose: Whose) -> Order:
    """Record that the attempt in flight failed, and whose failure it was (``unanswered``: not
    known yet; :func:`_answered_late` settles it if an answer comes)."""
    operation = order.current_operation
    failures = order.step(order.current_step).failures(operation)
    if whose == "unanswered":
        failures = replace(failures, unanswered=(*failures.unanswered, order.attempt))
    elif whose == "at_service":
        failures = replace(failures, at_service=failures.at_service + 1)
    else:
        failures = replace(failures, on_our_side=failures.on_our_side + 1)
    return _with_failures(order, order.current_step, operation, failures)


def _answered_late(order: Order, r: AgentResponse) -> Order:
    """An answer to an attempt given up on unanswered says whose failure that was: it never
    left our side if its agent took it up after its deadline (``expired``); any other answer
    means the agent called the service, or (``deferred``) held back because the service kept
    failing: the service's failure either way."""
    failures = order.step(r.step).failures(r.operation)
    if r.attempt not in failures.unanswered:
        return order
    unanswered = tuple(attempt for attempt in failures.unanswered if attempt != r.attempt)
    if r.outcome == "failed" and r.error_code == EXPIRED:
        failures = replace(failures, unanswered=unanswered, on_our_side=failures.on_our_side + 1)
    else:
        failures = replace(failures, unanswered=unanswered, at_service=failures.at_service + 1)
    return _with_failures(order, r.step, r.operation, failures)


def _with_failures(order: Order, step: str, operation: str, failures: Failures) -> Order:
    if operation == "do":
        return order.with_step(step, forward_failures=failures)
    return order.with_step(step, undo_failures=failures)


def _late_answer(order: Order, draft: Order, r: AgentResponse, note: str, ctx: Context) -> Decision:
    """An answer that changes nothing, unless it says whose failure an attempt given up on
    unanswered was (:func:`_answered_late`): then that is written down, also on an ended order
    (it changes no outcome, so it is no part of the order settling)."""
    if draft.steps == order.steps:
        return _flush(order, note)
    if r.outcome == "failed" and r.error_code == EXPIRED:
        whose = "it never left our side: its agent took it up after its deadline"
    elif r.outcome == "deferred":
        whose = "its agent did not call the service, whose circuit was open"
    else:
        whose = "it reached the service"
    detail = f"{note}; attempt {r.attempt} was given up on unanswered, and {whose}"
    return _write(order, draft, ctx, "late_answer", detail)


# ------------------------------------------------------------------------------- outbox


def _begin(order: Order, delivered: bool) -> Order:
    """The draft a decision starts from: the outbox emptied if delivered, else carried over.
    Held status updates stay either way: the proof of delivery does not cover them.

    A finished order's outbox is left alone: its active-index row says whether it was sent.
    """
    if order.state.terminal or not delivered:
        return order
    return replace(order, outbox=tuple(o for o in order.outbox if _held(o)))


def _owe(order: Order, outgoing: Outgoing) -> Order:
    return replace(order, outbox=(*order.outbox, outgoing))


def _status(
    order: Order, ctx: Context, event: StatusEvent, *, step: str | None = None, detail: str = ""
) -> Order:
    if order.reply_to is None:
        return order
    update = StatusUpdate(
        order_id=order.order_id,
        sequence=order.status_seq,
        state=order.state.value,
        event=event,
        step=step,
        detail=detail,
        updated_at=ctx.now,
    )
    # Behind updates that are held, it waits as long as they do: they arrive in order.
    owed = Outgoing("reply", update, not_before=_held_until(order))
    return replace(_owe(order, owed), status_seq=order.status_seq + 1)


def _held(outgoing: Outgoing) -> bool:
    """A status update the submitter's queue refused, held until its ``not_before``."""
    return outgoing.to == "reply" and outgoing.not_before is not None


def _held_until(order: Order) -> datetime | None:
    """When ``order``'s held status updates are due to be tried again (None: none held)."""
    return max((o.not_before for o in order.outbox if _held(o) and o.not_before), default=None)


def _owed_again(before: Order, outbox: tuple[Outgoing, ...], now: datetime) -> tuple[Outgoing, ...]:
    """``outbox`` (written over ``before``) with the held status updates whose time has come
    owed like any message: the next send tries them, and the proof of that send covers them.

    Not while a message that brings the next event is carried over from ``before``: it may
    have been sent while they were held, and its answer would pass for proof that they went.
    """
    due = [o for o in outbox if _held(o) and o.not_before and o.not_before <= now]
    if not due:
        return outbox
    earlier = {message_id_for(o.message) for o in before.outbox if _causal(o)}
    if any(_causal(o) and message_id_for(o.message) in earlier for o in outbox):
        return outbox
    return tuple(replace(o, not_before=None) if o in due else o for o in outbox)


def _update_from(outgoing: Outgoing, sequence: int) -> StatusUpdate | None:
    """The status update ``outgoing`` carries, if it is number ``sequence`` or a later one."""
    message = outgoing.message
    if (
        outgoing.to == "reply"
        and isinstance(message, StatusUpdate)
        and message.sequence >= sequence
    ):
        return message
    return None


def _on_replies_refused(
    order: Order, sequence: int, failure: str, sent: frozenset[str], ctx: Context
) -> Decision:
    """Hold status update ``sequence`` and every later one the order owes, until a retry time
    that grows with how long they have been held. What went out before it is owed no longer,
    but for the messages that bring the next event (their answer is the proof of delivery);
    those and anything else not sent yet go now."""
    refused = [u for o in order.outbox if (u := _update_from(o, sequence))]
    if not refused:
        return _flush(order, f"status update {sequence} is owed no longer")
    waited = ctx.now - refused[0].updated_at
    retry_at = ctx.now + min(max(waited, REPLY_RETRY_FIRST), REPLY_RETRY_MAX)
    held = tuple(
        replace(o, not_before=retry_at) if _update_from(o, sequence) else o
        for o in order.outbox
        if _causal(o) or _update_from(o, sequence) or message_id_for(o.message) not in sent
    )
    detail = (
        f"status updates {sequence} to {refused[-1].sequence} not sent: {order.reply_to} "
        f"refused them ({failure}); held, tried again at {retry_at.isoformat()}"
    )
    decision = _write(order, replace(order, outbox=held), ctx, "replies_held", detail)
    assert decision.order is not None
    return replace(decision, send=decision.order.outbox)


def _retry_replies(order: Order, ctx: Context) -> Decision:
    """A finished order's held status updates: sent again once due, given up after
    :data:`REPLY_HOLD_LIMIT`; either way its active-index row goes once that is done."""
    held = [u for o in order.outbox if _held(o) and (u := _update_from(o, 0))]
    due = _held_until(order)
    assert held and due is not None
    if due > ctx.now:
        return Decision(None, (), note=f"status updates held until {due.isoformat()}")
    first, last = held[0].sequence, held[-1].sequence
    if ctx.now - held[0].updated_at >= REPLY_HOLD_LIMIT:
        detail = (
            f"status updates {first} to {last} never reached {order.reply_to} in "
            f"{REPLY_HOLD_LIMIT.total_seconds() / 3600:.0f} h; given up"
        )
        dropped = replace(order, outbox=tuple(o for o in order.outbox if not _held(o)))
        return replace(_write(order, dropped, ctx, "replies_dropped", detail), finished=True)
    outbox = _owed_again(order, order.outbox, ctx.now)
    detail = f"status updates {first} to {last} sent to {order.reply_to} again"
    decision = _write(order, replace(order, outbox=outbox), ctx, "replies_resent", detail)
    return replace(decision, send=outbox, finished=True)


def _still_owed(outgoing: Outgoing, order: Order) -> bool:
    message = outgoing.message
    if isinstance(message, AgentRequest):
        return order.locked_by is not None and message.attempt == order.attempt
    if isinstance(message, SchedulerCommand):
        waiting = order.locked_by is None and order.state in (_P.PENDING, _P.COMPENSATING)
        return waiting and message.attempt == order.attempt
    return True


def _causal(outgoing: Outgoing) -> bool:
    return isinstance(outgoing.message, AgentRequest | SchedulerCommand)


def _write(
    before: Order,
    after: Order,
    ctx: Context,
    event: str,
    detail: str,
    *,
    step: str | None = None,
    from_state: ProcessState | Literal["before"] | None = "before",
) -> Decision:
    ended = before.state.terminal and after.state.terminal
    if not (ended and _records_only(before, after)):
        if from_state == "before" and not transition_allowed(before.state, after.state):
            raise AssertionError(f"{event}: {before.state} -> {after.state} is not a transition")
        if ended and not before.settling:
            raise AssertionError(f"{event}: order {before.order_id} is settled; only operators act")
    outbox = after.outbox
    if not ended:
        seen: set[str] = set()
        kept: list[Outgoing] = []
        for outgoing in outbox:
            message_id = message_id_for(outgoing.message)
            if message_id in seen or not _still_owed(outgoing, after):
                continue
            seen.add(message_id)
            kept.append(outgoing)
        # The message that brings the next event goes last: its answer proves all were sent.
        outbox = _owed_again(before, tuple(sorted(kept, key=_causal)), ctx.now)
    after = replace(after, outbox=outbox, updated_at=ctx.now, timeline_seq=before.timeline_seq + 1)
    entry = TimelineEntry(
        seq=after.timeline_seq,
        at=ctx.now,
        actor=ctx.actor,
        event=event,
        from_state=before.state if from_state == "before" else from_state,
        to_state=after.state,
        step=step or after.current_step,
        attempt=after.attempt,
        detail=detail,
    )
    send = () if ended else outbox
    return Decision(after, send, entry, finished=after.state.terminal and not ended)


def _records_only(before: Order, after: Order) -> bool:
    """Whether ``after`` differs from ``before`` only in what is recorded about the order, not
    in the order: what it still owes (held status updates sent again or given up) and whose
    failure its attempts were (a late answer to one given up on unanswered). On an ended order
    such a write is neither a transition nor a change a settled order refuses."""
    return _bare(after, before.outbox) == _bare(before, before.outbox)


def _bare(order: Order, outbox: tuple[Outgoing, ...]) -> Order:
    steps = tuple(
        replace(s, forward_failures=NO_FAILURES, undo_failures=NO_FAILURES) for s in order.steps
    )
    return replace(order, outbox=outbox, steps=steps)


def _flush(order: Order, note: str) -> Decision:
    """Nothing to change; an order in flight sends what it still owes (it may never have)."""
    send = order.outbox if order.state.in_flight else ()
    return Decision(None, send, note=note)


def _reject(ctx: Context, reply: AgentResponse, caused_by: str | None, detail: str) -> Decision:
    alert = _alert(ctx, reply.order_id, "error", "bad_message", detail, caused_by=caused_by)
    return Decision(None, (Outgoing("alerts", alert),), note=detail)


def _alert(
    ctx: Context, order_id: str, severity: Severity, reason: str, detail: str, **naming: object
) -> OperatorAlert:
    """An alert the decision raises, by ``ctx.actor`` at ``ctx.now``. ``naming``: its
    ``caused_by`` or ``timeline_seq``, which make it one alert (messages.message_id_for)."""
    return OperatorAlert(
        order_id=order_id,
        severity=severity,
        reason=reason,
        detail=detail,
        source=ctx.actor,
        raised_at=ctx.now,
        **naming,
    )
