"""The imperative shell around the domain's decisions (:mod:`domain.lifecycle` on the pattern's
events, :mod:`domain.operator_actions` on an operator's): load, decide, write once, send.

Every trigger that moves an order goes through :func:`handle` (an operator's action through
:func:`handle_with`; :func:`carry_out` when it has the order in hand): one point read, one pure
decision, at most one ETag-conditional write, then the decision's messages in order. A lost
race (412) re-reads and decides again. A send that fails raises, so the triggering message is
redelivered and the outbox, still on the record, is sent again; duplicate detection drops what
did go out.

**No read for an answer.** Each AgentRequest leaves with a snapshot of the order as stored
when it was sent (:mod:`service.resume`, attached in :func:`send`), and its agent echoes it in
the reply. :func:`handle` decides on that snapshot first and writes on condition
of its ETag, so the write lands only if the order is still exactly what the decision saw; a
412 (it moved on) falls back to the read. A decision that writes nothing proves nothing about
the snapshot, and one that must first write an index row (the order's active row moved earlier,
its Error row) would leave that row wrong if the snapshot was stale: both are made on a read.

Status updates go to the submitter's own reply queue. That queue is outside the app's control: a
queue that refuses them (missing, disabled, no permission: :func:`service.apply.refuses`)
never holds up the order, and loses it no update. The refused update and those after it are
held on the order (:class:`domain.events.RepliesRefused`, one more write) before anything
else goes, and sent again once due; the queue is logged, alerted once per queue for
:data:`FAILURE_MEMORY`, and not tried for that long (what arrives for it meanwhile is held the
same way). Any other failure is a failure like any send's (the outbox sends it again).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from azure.servicebus.exceptions import (
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
)

from adapters import metrics, telemetry
from adapters.store.rows import ConcurrencyConflict
from domain.events import DEFAULT_FLUSH_GRACE, Context, Decision, Event, Replied, RepliesRefused
from domain.lifecycle import decide, due_at
from domain.messages import (
    AgentRequest,
    OperatorAlert,
    OrderSubmitted,
    StatusUpdate,
    message_id_for,
)
from domain.order import Order, Outgoing
from domain.states import ProcessState
from domain.workflows import UnknownWorkflow, workflow_ref
from service import resume
from service.refusing_queues import FAILURE_MEMORY

if TYPE_CHECKING:
    from service.runtime import Runtime

log = logging.getLogger("apply")


MAX_CONFLICT_RETRIES: Final = 5
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

Decider = Callable[[Order, Context], Awaitable[Decision]]
"""Decides on an order as just loaded, in the context built for it: the lifecycle on one of
the pattern's events (:func:`handle`), or an operator's action (:mod:`service.control`)."""


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


async def park(rt: Runtime, order: Order, missing: UnknownWorkflow, source: str) -> Parked:
    """Alert that ``order`` waits for its workflow version to be deployed again; the alert's
    text is fixed, so repeats within the duplicate-detection window are one alert."""
    detail = (
        f"order {order.order_id} runs workflow {order.workflow!r}, which this deployment does "
        f"not carry ({missing}). It is parked, unchanged: deploy a package that carries that "
        "version again (see docs/versioning.md), and it goes on where it stopped."
    )
    await rt.alert(
        OperatorAlert(
            order_id=order.order_id,
            severity="error",
            reason="workflow_version_missing",
            detail=detail,
            source=source,
        )
    )
    return Parked(detail)


async def handle(
    rt: Runtime, order_id: str, event: Event, *, actor: str, span: str | None = None
) -> tuple[Order, Decision]:
    """Load the order, decide on ``event`` (:func:`domain.lifecycle.decide`), carry the
    decision out; again on a lost race (:func:`handle_with`).

    A reply that carries the order's snapshot is first decided on it, without a read
    (:func:`_on_snapshot`).
    """
    if isinstance(event, Replied):
        known = resume.restore(event.response.resume, order_id)
        done = None if known is None else await _on_snapshot(rt, known, event, actor)
        if done is not None:
            return done

    async def deciding(order: Order, ctx: Context) -> Decision:
        return decide(order, event, ctx)

    return await handle_with(rt, order_id, deciding, actor=actor, span=span, event=event)


async def handle_with(
    rt: Runtime,
    order_id: str,
    deciding: Decider,
    *,
    actor: str,
    span: str | None = None,
    event: Event | None = None,
) -> tuple[Order, Decision]:
    """Load the order, decide with ``deciding``, carry the decision out; again on a lost race.

    Raises :class:`adapters.store.rows.OrderNotFound`, whatever ``deciding`` raises (an
    operator action's :class:`domain.operator_actions.Refused`), :class:`Parked` (after
    alerting) for an order of a workflow version not deployed, or :class:`Busy` after
    :data:`MAX_CONFLICT_RETRIES` lost races. ``event``: what was decided on, for the metrics
    (:func:`carry_out`).

    ``span``: decide and carry out in a span of that name in the order's trace
    (:func:`adapters.telemetry.continuing`), for work that did not arrive in it (operator actions).
    """
    for _ in range(MAX_CONFLICT_RETRIES):
        order = await rt.store.load(order_id)
        with in_order_trace(span, order, actor):
            try:
                ctx = context(rt, order.workflow, actor)
            except UnknownWorkflow as missing:
                raise await park(rt, order, missing, actor) from None
            decision = await deciding(order, ctx)
            try:
                return await carry_out(rt, order, decision, event), decision
            except ConcurrencyConflict:
                log.info("order %s changed while deciding; reading it again", order_id)
    raise Busy(f"order {order_id} kept changing; gave up after {MAX_CONFLICT_RETRIES} tries")


def in_order_trace(span: str | None, order: Order, actor: str) -> AbstractContextManager[object]:
    """A span named ``span`` in ``order``'s trace, or nothing when ``span`` is None."""
    if span is None:
        return nullcontext()
    return telemetry.continuing(span, order.order_id, order.trace_parent, {"order.actor": actor})


async def _on_snapshot(
    rt: Runtime, known: Order, event: Replied, actor: str
) -> tuple[Order, Decision] | None:
    """Decide on ``known`` and write on condition of its ETag; None when that settles nothing
    and the order must be read: the write lost (the order is no longer ``known``), there is no
    write to prove ``known`` current, or the write needs rows written before it on the
    strength of a state that may be stale (:func:`_writes_beside`)."""
    try:
        ctx = context(rt, known.workflow, actor)
    except UnknownWorkflow:
        return None  # the order may have moved to a version that is deployed
    decision = decide(known, event, ctx)
    if decision.order is None or _writes_beside(rt, known, decision.order):
        return None
    try:
        return await carry_out(rt, known, decision, event), decision
    except ConcurrencyConflict:
        log.info("order %s changed since its snapshot was sent; reading it", known.order_id)
        return None


async def carry_out(
    rt: Runtime, before: Order, decision: Decision, event: Event | None = None
) -> Order:
    """Write the decision's order (if any), send its messages, and once a finished order owes
    nothing (no status update held either), remove its active-index row. ``event``: what was
    decided on, for the metrics the committed write records (:func:`adapters.metrics.observe`)."""
    after = await write(rt, before, decision, event)
    sent_all = await send(rt, after, decision.send)
    if decision.finished and sent_all:
        await rt.store.index.discard(after.order_id, after.generation)
    if decision.note:
        log.debug("order %s: %s", after.order_id, decision.note)
    return after


async def write(
    rt: Runtime, before: Order, decision: Decision, event: Event | None = None
) -> Order:
    """Write the decision's order (if any) over ``before``: the first half of :func:`carry_out`,
    all of it for a writer that may not send (:mod:`service.handover`)."""
    if decision.order is None:
        return before
    assert decision.entry is not None
    after = await rt.store.save(
        before, decision.order, decision.entry, due=_index_due(rt, before, decision.order)
    )
    if metrics.enabled():  # only once the write won; nothing to build when metrics are off
        flow = rt.workflow(before.workflow)
        metrics.record_transition(before, after, decision.entry, event, flow)
    return after


async def send(rt: Runtime, order: Order, outgoing: tuple[Outgoing, ...]) -> bool:
    """Send ``outgoing`` (owed by ``order``, as stored: with its ETag), in order; True when
    every message went. Each AgentRequest leaves with the snapshot of ``order``
    (:mod:`service.resume`). A held status update is not sent; one the submitter's queue refuses
    stops the sending: the order holds it (:func:`_hold`), and what it still owes goes after."""
    now = rt.clock()
    snapshot: str | None = None
    sent_all = True
    for index, item in enumerate(outgoing):
        if item.to == "reply":
            if order.reply_to is None:
                continue
            if item.not_before is not None:  # held until then (domain.lifecycle)
                sent_all = False
                continue
            assert isinstance(item.message, StatusUpdate)
            refusal = await _send_status(rt, order.reply_to, item.message)
            if refusal is not None:
                await _hold(rt, order, item.message, refusal, outgoing[:index])
                return False
            continue
        message = item.message
        if isinstance(message, AgentRequest) and order.etag:
            if snapshot is None:
                snapshot = resume.snapshot(order)
            message = message.model_copy(update={"resume": snapshot})
        due = item.not_before if item.not_before is not None and item.not_before > now else None
        await rt.bus.send(rt.settings.queue(item.to), message, scheduled_at=due)
    return sent_all


async def _hold(
    rt: Runtime, order: Order, update: StatusUpdate, refusal: str, before: tuple[Outgoing, ...]
) -> None:
    """Record on the order that ``update`` (and those after it) wait for the submitter's queue,
    then send what it still owes: decided on the order as it is now, which may have moved on."""
    sent = frozenset(
        message_id_for(item.message)
        for item in before
        if item.to != "reply" or item.not_before is None  # a held update was not sent
    )
    refused = RepliesRefused(update.sequence, refusal, sent)
    await handle(rt, order.order_id, refused, actor=rt.actor("status"))


async def _send_status(rt: Runtime, queue: str, message: StatusUpdate) -> str | None:
    """Send one status update; None once sent, or why ``queue`` refuses it (it was not tried
    when it refused within :data:`FAILURE_MEMORY`). Any other failure raises."""
    now = rt.clock()
    remembered = rt.refusing_queues.get(queue, now)
    if remembered is not None:
        return remembered
    try:
        await rt.status_bus().send(queue, message)
    except UNREACHABLE_QUEUE as exc:
        if not refuses(exc):
            raise
        failure = f"{type(exc).__name__}: {exc}"
        rt.refusing_queues.put(queue, failure, now)
        log.warning("status reply to %s failed: %s", queue, failure)
        await rt.bus.send(
            rt.settings.queue("alerts"),
            OperatorAlert(
                order_id=message.order_id,
                severity="warning",
                reason="reply_queue_unavailable",
                detail=(
                    f"status replies to {queue!r} are refused ({failure}). Orders carry on; "
                    "each holds its updates and sends them again, in order, once the queue "
                    f"takes them (tried again after {FAILURE_MEMORY.total_seconds():.0f} s "
                    "at the soonest, for up to a day). Tell the submitter to create the queue "
                    "or grant this app Send on it."
                ),
                source=rt.actor("scheduler"),
                raised_at=now,
            ),
        )
        return failure
    return None


def new_order_ref(rt: Runtime, submitted: OrderSubmitted) -> str:
    """The workflow version a new order runs: the one it asks for, else the current one."""
    name = submitted.workflow
    return workflow_ref(name, submitted.workflow_version or rt.settings.current_version(name))


def context(rt: Runtime, workflow: str, actor: str) -> Context:
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


def due(rt: Runtime, order: Order) -> datetime:
    """When the Supervisor must next look at ``order`` (see domain.lifecycle.due_at)."""
    return due_at(
        order, rt.settings.pending_stale_after, DEFAULT_FLUSH_GRACE, rt.settings.clock_skew
    )


def earliest_due(rt: Runtime, now: datetime) -> datetime:
    """The soonest an order written at ``now`` or later can be due (:func:`due`).

    An index row whose order is not there yet (a create or resubmit may be on its way) is kept
    no later than this, so the order that follows is never found late.
    """
    budgets = [s.deadline_budget for flow in rt.workflows.values() for s in flow.steps]
    return now + min(DEFAULT_FLUSH_GRACE, rt.settings.pending_stale_after / 2, *budgets)


def _writes_beside(rt: Runtime, before: Order, after: Order) -> bool:
    """Whether writing ``after`` over ``before`` first writes an index row: the order's
    active-index row moved earlier, or its Error-index row on entering Error. Neither is undone
    cleanly when the order write then loses: the moved row may end up later than the order,
    and the Error row written over one the winner wrote is deleted with ours."""
    if _index_due(rt, before, after) is not None:
        return True
    return after.state is ProcessState.ERROR and before.state is not ProcessState.ERROR


def _index_due(rt: Runtime, before: Order, after: Order) -> datetime | None:
    """The due time to write to the order's index row before writing ``after``, if any.

    The row must never be later than the order's due time (adapters.store.active_index): an
    order back in flight gets its row, and one whose due time moves earlier moves its row first.
    A due time that moves later leaves the row early; the Supervisor moves it up when it finds it.
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
