"""The order lifecycle as pure decisions: ``decide(order, event, context) -> Decision``.

A Decision is the new order record (or None: nothing to write) and the messages to send after
writing it. The shell (:mod:`service.apply`) loads, decides, writes once (ETag) and sends; nothing
here does I/O, reads a clock or draws a random number. The events, the context and the decision
are in :mod:`domain.events`; the record changes itself by the transitions of
:mod:`domain.order`. An operator's actions are decided apart (:mod:`domain.operator_actions`),
with the movements below (:func:`write`, :func:`claim`, :func:`compensate`, ...).

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
says whether the order ended settling, and :func:`write` refuses anything else. Two kinds of
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
``not_before`` (event :class:`~domain.events.RepliesRefused`), no proof of delivery covers it,
later updates wait behind it, and the first write after that time owes them again, so the queue
gets every update, in order, once it takes them. A finished order holding updates keeps its
active-index row: the Supervisor sends them again at their time, each time later (up to an
hour), and gives up after :data:`REPLY_HOLD_LIMIT`, saying so in the timeline.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Final, Literal

from domain import ids
from domain.events import (
    Context,
    Decision,
    Event,
    Replied,
    RepliesRefused,
    Resent,
    RetryDue,
    Swept,
)
from domain.messages import (
    EXPIRED,
    AgentRequest,
    AgentResponse,
    OperatorAlert,
    OrderSubmitted,
    SchedulerCommand,
    Severity,
    StatusUpdate,
    message_id_for,
)
from domain.order import (
    COMPENSATION_DELAYED,
    Order,
    Outgoing,
    StepRecord,
    StepState,
    TimelineEntry,
    Whose,
)
from domain.states import ProcessState, transition_allowed
from domain.workflows import Step, Workflow

UNREQUESTED_REASON: Final = "unrequested_answer"
"""The alert of an answer to a request the order never sent."""
REPLY_RETRY_FIRST: Final = timedelta(minutes=5)
"""The soonest held status updates are tried again; then as long again as they have been held,
up to :data:`REPLY_RETRY_MAX`."""
REPLY_RETRY_MAX: Final = timedelta(hours=1)
REPLY_HOLD_LIMIT: Final = timedelta(hours=24)
"""How long a finished order's held status updates are tried before they are given up."""

_P = ProcessState


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
    order = claim(order.reporting("received", ctx.now, detail=f"workflow {flow.ref}"), ctx)
    detail = f"workflow {flow.ref}, {len(flow.steps)} steps; dispatched {flow.first_step.name}"
    return write(order, order, ctx, "created", detail, from_state=None)


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
        held = order.held_until
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
    unasked = order.never_sent(step, r.operation, r.generation, r.attempt)
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
    draft = _answered_late(begin(order, delivered), r)
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
            return _retry_or_fail(order, draft.attempt_failed(whose), reason, ctx)
        return _late_answer(
            order, draft, r, f"{what} failed transiently, but no longer in flight", ctx
        )
    if r.operation == "do":
        return _on_forward_answer(order, draft, r, in_flight, ctx)
    return _on_undo_answer(order, draft, r, in_flight, ctx)


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
        done = draft.with_record(draft.step(r.step).succeeded(r.result, r.responded_at))
        if in_flight:
            return _advance(order, done, r.step, ctx)
        if step.state is StepState.RUNNING:
            detail = f"{r.step} took effect after it was given up on; recorded for compensation"
            return _late(order, done, ctx, "late_success", detail)
        return _late_answer(
            order, draft, r, f"{r.step} succeeded again (already {step.state})", ctx
        )
    declined = draft.step(r.step).declined(r.error_code, r.error_message, r.responded_at)
    refused = draft.with_record(declined)
    reason = f"{r.step} declined: {r.error_code}: {r.error_message}"
    if in_flight:
        return compensate(order, refused, "step_declined", reason, ctx)
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
    record = draft.step(r.step)
    at = r.responded_at
    done = record.undone(at) if r.outcome == "succeeded" else record.voided(at)
    resolved = draft.with_record(done)
    if in_flight:
        return _next_undo_or_finish(order, resolved, done, ctx)
    if step.state.may_have_effect:
        return _late(order, resolved, ctx, "late_undo", f"{r.step}: {done.state}")
    return _late_answer(
        order, draft, r, f"undo of {r.step} answered again (already {step.state})", ctx
    )


def _late(before: Order, after: Order, ctx: Context, event: str, detail: str) -> Decision:
    """Record an answer for a step no longer in flight (``event``). On an order that has ended
    it is the order settling: ``settling`` while an answer may still change a step,
    ``settled`` once none can (only an operator changes it after that)."""
    if before.state.in_flight:
        return write(before, after, ctx, event, detail)
    left = ", ".join(s.name for s in after.open_steps)
    if left:
        return write(before, after, ctx, "settling", f"{detail} (after the end; open: {left})")
    return write(before, after, ctx, "settled", f"{detail} (after the end; nothing is open now)")


def _on_retry(order: Order, command: SchedulerCommand, ctx: Context) -> Decision:
    waiting = order.locked_by is None and order.state in (_P.PENDING, _P.COMPENSATING)
    if not waiting or command.attempt != order.attempt:
        return _flush(order, "retry command no longer current")
    sent = message_id_for(command)
    delivered = any(message_id_for(o.message) == sent for o in order.outbox)
    draft = begin(order, delivered)
    return write(order, claim(draft, ctx), ctx, "claimed", f"retry: {command.reason}")


def _on_sweep(order: Order, ctx: Context) -> Decision:
    now = ctx.now - ctx.skew  # no earlier than any host's clock could say it is
    if order.state.terminal:
        if order.updated_at + ctx.flush_grace > now:
            return Decision(None, (), note="finished moments ago; its writer is sending")
        if order.held_until is not None:
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
    return _retry_or_fail(order, order.attempt_failed(whose), reason, ctx)


# ----------------------------------------------------------------------------- movements
# The lifecycle's own moves, which an operator's actions (domain.operator_actions) make too.


def claim(order: Order, ctx: Context) -> Order:
    """Take the current step for one attempt and put its AgentRequest in the outbox."""
    step = ctx.workflow.step_named(order.current_step)
    operation = order.current_operation
    if operation == "undo":
        order = _warn_if_long(order, ctx)
    complete_by = ctx.now + step.deadline_budget
    order = order.claimed(ctx.actor, complete_by)
    record = order.step(step.name)
    if operation == "do":
        tries = f"attempt {record.attempt}" if record.attempt > 1 else ""
        order = order.reporting("step_started", ctx.now, step=step.name, detail=tries)
    request = AgentRequest(
        order_id=order.order_id,
        step=step.name,
        operation=operation,
        action=step.action_for(operation),
        attempt=order.attempt,
        complete_by=complete_by,
        run_budget_s=step.complete_by_budget.total_seconds(),
        idempotency_key=record.key(order.order_id, operation),
        undoes=record.forward_key(order.order_id) if operation == "undo" else None,
        payload=order.payload,
        requested_at=ctx.now,
    )
    return order.owing(Outgoing(step.agent, request))


def compensate(before: Order, draft: Order, cause: str, reason: str, ctx: Context) -> Decision:
    """Start undoing what may have taken effect, latest first; or fail at once if nothing has."""
    order = draft.compensating(cause, reason, ctx.now)
    plan = undo_plan(order, ctx.workflow)
    if not plan:
        final = f"{reason}; nothing to undo"
        return _fail(before, order, cause, final, ctx)
    names = ", ".join(step.name for step in plan)
    order = order.undoing(plan[0].name).reporting(
        "compensating", ctx.now, step=plan[0].name, detail=f"{reason}; undoing {names}"
    )
    detail = f"{reason}; to undo: {names}"
    return write(before, claim(order, ctx), ctx, "compensation_started", detail)


def undo_plan(order: Order, flow: Workflow) -> list[Step]:
    """Steps that may have taken effect and can be undone, latest first."""
    return [
        flow.step_named(s.name)
        for s in sorted(order.steps, key=lambda s: -s.index)
        if s.state.may_have_effect and flow.step_named(s.name).compensable
    ]


def _advance(before: Order, order: Order, done_step: str, ctx: Context) -> Decision:
    following = ctx.workflow.next_step(done_step)
    # One update says the step completed; the order's state in it is still Processing.
    order = order.reporting("step_completed", ctx.now, step=done_step)
    if following is None:
        order = order.processed().reporting("processed", ctx.now)
        return write(before, order, ctx, "processed", f"{done_step} succeeded", step=done_step)
    order = order.moving_to(following.name)
    detail = f"{done_step} succeeded; next {following.name}"
    return write(before, claim(order, ctx), ctx, "step_succeeded", detail, step=done_step)


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
        return compensate(before, draft, "failure_threshold", detail, ctx)
    due = _retry_due(failures, ctx)
    released = _release(draft, due, reason, ctx, failure_count=failures)
    if ours:
        count = f"{counted} of {threshold} failures count, {ours} never left our side"
        detail = f"{reason}; retry {failures} due {due.isoformat()}; {count}"
    else:
        detail = f"{reason}; retry {failures} of {threshold - 1} due {due.isoformat()}"
    return write(before, released, ctx, "released", detail)


def _retry_undo(before: Order, draft: Order, reason: str, ctx: Context) -> Decision:
    """Retry a failed undo with growing backoff until the compensation budget is spent.

    An undo that failed transiently or timed out says nothing about whether the service will
    undo: the cause may be our own hosts, frozen or restarting. Giving up would leave the
    effect in place for a person, so compensation ends with effects left only when the service
    refuses the undo (:func:`_on_undo_answer`) or when this budget, counted from when
    compensation started, runs out.
    """
    draft = draft.undo_failed(ctx.now)
    failures, started = draft.failure_count, draft.compensation_started_at
    assert started is not None
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
    return write(before, released, ctx, "released", detail)


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
    return order.warned_of(Outgoing("alerts", alert))


def _defer(before: Order, draft: Order, retry_at: datetime, reason: str, ctx: Context) -> Decision:
    due = max(retry_at, ctx.now)
    released = _release(draft, due, reason, ctx, failure_count=draft.failure_count)
    detail = f"{reason}; retry due {due.isoformat()} (not counted as a failure)"
    return write(before, released, ctx, "deferred", detail)


def _release(
    order: Order, due: datetime, reason: str, ctx: Context, *, failure_count: int
) -> Order:
    command = SchedulerCommand(
        order_id=order.order_id,
        command="retry",
        attempt=order.attempt,
        failure_count=failure_count,
        reason=reason,
        requested_by=ctx.actor,
        requested_at=ctx.now,
    )
    released = order.released(due, reason, failure_count)
    return released.owing(Outgoing("commands", command, not_before=due))


def _next_undo_or_finish(before: Order, order: Order, done: StepRecord, ctx: Context) -> Decision:
    """``done``'s undo was answered (Compensated, or Voided: nothing to undo): undo the next
    step that may have taken effect, or end in Error once none is left."""
    what = "undone" if done.state is StepState.COMPENSATED else "nothing to undo"
    order = order.reporting("step_compensated", ctx.now, step=done.name, detail=what)
    plan = undo_plan(order, ctx.workflow)
    if plan:
        detail = f"{done.name}: {what}; next undo {plan[0].name}"
        undoing = claim(order.undoing(plan[0].name), ctx)
        return write(before, undoing, ctx, "step_compensated", detail, step=done.name)
    cause = order.compensation_cause or "step_declined"
    reason = order.compensation_reason or "compensated"
    undid = [s.name for s in order.steps if s.state is StepState.COMPENSATED]
    voided = [s.name for s in order.steps if s.state is StepState.VOIDED]
    summary = f"undid {', '.join(undid) or 'nothing'}"
    if voided:
        summary += f"; never took effect: {', '.join(voided)}"
    final = f"{reason}; compensated: {summary}"
    return _fail(before, order, cause, final, ctx, step=done.name)


def _give_up(before: Order, order: Order, reason: str, ctx: Context) -> Decision:
    """An undo cannot be completed: Error, and a critical alert naming what is left in place."""
    left = undo_plan(order, ctx.workflow)
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
    seq = before.timeline_seq + 1
    alert = _alert(ctx, order.order_id, severity, cause, f"{final}. {advice}", timeline_seq=seq)
    order = order.in_error(final).owing(Outgoing("alerts", alert))
    order = order.reporting("failed", ctx.now, detail=final)
    left = ", ".join(s.name for s in order.open_steps)
    settling = f"; settling: an answer may still change {left}" if left else ""
    return write(before, order, ctx, "error", final + settling, step=step)


# ------------------------------------------------------------------------ whose failure


def _answered_late(order: Order, r: AgentResponse) -> Order:
    """An answer to an attempt given up on unanswered says whose failure that was: it never
    left our side if its agent took it up after its deadline (``expired``); any other answer
    means the agent called the service, or (``deferred``) held back because the service kept
    failing: the service's failure either way."""
    expired = r.outcome == "failed" and r.error_code == EXPIRED
    record = order.step(r.step)
    answered = record.answered_late(
        r.operation, r.attempt, "on_our_side" if expired else "at_service"
    )
    return order if answered is record else order.with_record(answered)


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
    return write(order, draft, ctx, "late_answer", detail)


# ------------------------------------------------------------------------------- outbox


def begin(order: Order, delivered: bool) -> Order:
    """The draft a decision starts from: the outbox emptied if delivered, else carried over.
    Held status updates stay either way: the proof of delivery does not cover them.

    A finished order's outbox is left alone: its active-index row says whether it was sent.
    """
    if order.state.terminal or not delivered:
        return order
    return replace(order, outbox=tuple(o for o in order.outbox if o.held))


def _owed_again(before: Order, outbox: tuple[Outgoing, ...], now: datetime) -> tuple[Outgoing, ...]:
    """``outbox`` (written over ``before``) with the held status updates whose time has come
    owed like any message: the next send tries them, and the proof of that send covers them.

    Not while a message that brings the next event is carried over from ``before``: it may
    have been sent while they were held, and its answer would pass for proof that they went.
    """
    due = [o for o in outbox if o.held and o.not_before and o.not_before <= now]
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
    decision = write(order, replace(order, outbox=held), ctx, "replies_held", detail)
    assert decision.order is not None
    return replace(decision, send=decision.order.outbox)


def _retry_replies(order: Order, ctx: Context) -> Decision:
    """A finished order's held status updates: sent again once due, given up after
    :data:`REPLY_HOLD_LIMIT`; either way its active-index row goes once that is done."""
    held = [u for o in order.outbox if o.held and (u := _update_from(o, 0))]
    due = order.held_until
    assert held and due is not None
    if due > ctx.now:
        return Decision(None, (), note=f"status updates held until {due.isoformat()}")
    first, last = held[0].sequence, held[-1].sequence
    if ctx.now - held[0].updated_at >= REPLY_HOLD_LIMIT:
        detail = (
            f"status updates {first} to {last} never reached {order.reply_to} in "
            f"{REPLY_HOLD_LIMIT.total_seconds() / 3600:.0f} h; given up"
        )
        dropped = replace(order, outbox=tuple(o for o in order.outbox if not o.held))
        return replace(write(order, dropped, ctx, "replies_dropped", detail), finished=True)
    outbox = _owed_again(order, order.outbox, ctx.now)
    detail = f"status updates {first} to {last} sent to {order.reply_to} again"
    decision = write(order, replace(order, outbox=outbox), ctx, "replies_resent", detail)
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


def write(
    before: Order,
    after: Order,
    ctx: Context,
    event: str,
    detail: str,
    *,
    step: str | None = None,
    from_state: ProcessState | Literal["before"] | None = "before",
) -> Decision:
    """The decision to write ``after`` over ``before``, adding timeline row ``event``: a
    transition :mod:`domain.states` allows (or one that only records, on an ended order), with
    the outbox cleaned of what is owed no longer and ordered so that the message that brings
    the next event goes last."""
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
    steps = tuple(s.without_failures() for s in order.steps)
    return replace(order, outbox=outbox, steps=steps)


def _flush(order: Order, note: str) -> Decision:
    """Nothing to change; an order in flight sends what it still owes (it may never have)."""
    send = order.outbox if order.state.in_flight else ()
    return Decision(None, send, note=note)


def _reject(ctx: Context, reply: AgentResponse, caused_by: str | None, detail: str) -> Decision:
    alert = _alert(ctx, reply.order_id, "error", "bad_message", detail, caused_by=caused_by)
    return Decision(None, (Outgoing("alerts", alert),), note=detail)


def _alert(
    ctx: Context,
    order_id: str,
    severity: Severity,
    reason: str,
    detail: str,
    *,
    caused_by: str | None = None,
    timeline_seq: int | None = None,
) -> OperatorAlert:
    """An alert the decision raises, by ``ctx.actor`` at ``ctx.now``. Its ``caused_by`` or
    ``timeline_seq`` make it one alert (messages.message_id_for)."""
    return OperatorAlert(
        order_id=order_id,
        severity=severity,
        reason=reason,
        detail=detail,
        source=ctx.actor,
        raised_at=ctx.now,
        caused_by=caused_by,
        timeline_seq=timeline_seq,
    )
