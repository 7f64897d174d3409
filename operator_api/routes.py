"""The operator API's routes: each hands its parameters to a use case of :mod:`service.operations`
and answers with what it returns; :func:`operator_api.http.route` says how the OpenAPI document
describes it, its docstring is the description there."""

from __future__ import annotations

from typing import Annotated, Final

from fastapi import Query, Request, Response
from pydantic import BaseModel

from domain.states import ProcessState
from operator_api.http import Context, json_response, operator, route, router
from operator_api.params import OrderId, QueueRole, SequenceNumber
from service.operations import (
    alerts,
    bulk,
    dead_letter_log,
    dead_letters,
    health,
    models,
    orders,
    purge,
    supervisor,
)
from service.operations import queries as q

DONE: Final = (models.ActionView, "Done: the order is now terminal")
ACCEPTED: Final = {202: (models.ActionView, "Accepted: the order goes on asynchronously")}
ACTION_ERRORS: Final = (400, 404, 409, 413, 503)
FINISHED: Final = (ProcessState.ERROR.value, ProcessState.PROCESSED.value)
__all__ = ["router"]  # what the app includes; the routes register on it as they are defined


def answer(result: BaseModel, status: int = 200) -> Response:
    return json_response(status, result.model_dump(mode="json"))


def action(result: models.ActionView) -> Response:
    """202: the action goes on asynchronously (undos or steps dispatched); 200: complete."""
    return answer(result, 200 if result.state in FINISHED else 202)


def given(body: BaseModel) -> dict[str, object]:
    """An action's body by the use case's keywords (serialization names), less ``operator``."""
    return body.model_dump(exclude={"operator"}, by_alias=True)


@route("GET", "orders", "listOrders", "orders", "List orders in one state, filtered, sorted, paged",
       (models.OrderPage, "One page"), (400,))  # fmt: skip
async def operator_list_orders(query: Annotated[q.ListOrders, Query()], ctx: Context) -> Response:
    """In-flight states are read from the active-order index and Error from the Error index,
    with a point read per index row looked at. Processed is read from the orders table with a
    query on the process rows (at most 5 requests of up to 200 rows per call; the service scans
    the table to answer it). Filters: the current step, the age since created, a text in the id,
    last error or compensation reason. `sort=index` pages in the source's key order; any other
    sort reads every candidate (up to 500) per page and says `partial` when they did not all
    fit. A page may hold fewer than `limit` orders and still have a continuation."""
    return answer(await orders.list_orders(ctx, **dict(query)))


@route("GET", "orders/{order_id}", "showOrder", "orders", "One order with its steps and timeline",
       (models.OrderDetail, "The order"), (400, 404))  # fmt: skip
async def operator_show_order(
    order_id: OrderId, query: Annotated[q.ShowOrder, Query()], ctx: Context
) -> Response:
    return answer(await orders.show_order(ctx, order_id, **dict(query)))


@route("GET", "orders/{order_id}/watch", "watchOrder", "orders", "Wait for an order's next change",
       (models.WatchView, "A change, or none within `wait`"), (400, 404))  # fmt: skip
async def operator_watch_order(
    order_id: OrderId, query: Annotated[q.WatchOrder, Query()], ctx: Context
) -> Response:
    """Answers once the order has timeline entries after `after` (those entries, and the order
    now), at once if it is finished, or after `wait` seconds with `changed: false`. Call again
    with the last entry's `seq` to follow it until `terminal`."""
    return answer(await orders.watch_order(ctx, order_id, **dict(query)))


@route("POST", "orders/{order_id}/restart", "restartOrder", "orders",
       "Restart an Error order from a named step", DONE, ACTION_ERRORS, ACCEPTED)  # fmt: skip
async def operator_restart_order(
    order_id: OrderId, body: models.RestartRequest, req: Request, ctx: Context
) -> Response:
    """The step (one of the order's workflow version) and every later one are redone with the
    next generation, even a step whose result was kept; the steps before it resume as a
    resubmit does (those that did not succeed are redone). Refused (409) for an order not in
    Error or with undos left (resubmit it first), 400 for a step the workflow lacks. Recorded
    in the timeline (event restarted)."""
    who, step, reason = operator(req), body.step or "", body.reason or ""
    return action(await orders.restart(ctx, order_id, step=step, operator=who, reason=reason))


@route("POST", "bulk/resubmit", "bulkResubmit", "orders", "Resubmit the orders a filter selects",
       (models.BulkView, "What was done to each order"), (400, 413))  # fmt: skip
async def operator_bulk_resubmit(body: models.BulkRequest, req: Request, ctx: Context) -> Response:
    """Selects Error orders by state, current step, age and text (at least one filter), at
    most `limit`; a dry run only lists them. Give `order_ids` (what a dry run listed) to act
    only on those, each only if it still matches. Each is acted on as POST
    /orders/{order_id}/resubmit is, with its own outcome. `more`: more orders match, run it
    again."""
    return answer(await bulk.bulk(ctx, action="resubmit", operator=operator(req), **given(body)))


@route("POST", "bulk/cancel", "bulkCancel", "orders", "Cancel the orders a filter selects",
       (models.BulkView, "What was done to each order"), (400, 413))  # fmt: skip
async def operator_bulk_cancel(body: models.BulkRequest, req: Request, ctx: Context) -> Response:
    """Selects Pending or Processing orders by state, current step, age and text (at least one
    filter), at most `limit`; a dry run only lists them. Give `order_ids` (what a dry run
    listed) to act only on those, each only if it still matches. Each is acted on as POST
    /orders/{order_id}/cancel is, with its own outcome. `more`: more orders match, run it
    again."""
    return answer(await bulk.bulk(ctx, action="cancel", operator=operator(req), **given(body)))


@route("POST", "orders/{order_id}/resubmit", "resubmitOrder", "orders", "Resubmit an Error order",
       DONE, ACTION_ERRORS, ACCEPTED)  # fmt: skip
async def operator_resubmit_order(
    order_id: OrderId, body: models.ActionRequest, req: Request, ctx: Context
) -> Response:
    """Resumes at the first step that did not succeed, with the next generation (new
    idempotency keys; steps that were compensated are redone, succeeded ones are kept): outcome
    resubmitted. If undos are left (an incomplete compensation), it retries them instead, same
    generation so each undo keeps its key: outcome compensation_resumed."""
    return action(await orders.resubmit(ctx, order_id, operator=operator(req), **given(body)))


@route("POST", "orders/{order_id}/cancel", "cancelOrder", "orders",
       "Cancel a Pending or Processing order", DONE, ACTION_ERRORS, ACCEPTED)  # fmt: skip
async def operator_cancel_order(
    order_id: OrderId, body: models.ActionRequest, req: Request, ctx: Context
) -> Response:
    """Acts at once, whatever the order waits for: every step that may have taken effect
    (succeeded, or requested with the outcome unknown: the one in flight too) is undone, latest
    first, each undo naming the forward call it undoes (one landing later is refused by the
    service); then Error (cancelled) with one alert. Outcome compensating (202), or failed when
    nothing can have taken effect (200: Error now). An order already being undone, or finished,
    is refused (409)."""
    return action(await orders.cancel(ctx, order_id, operator=operator(req), **given(body)))


@route("GET", "alerts", "listAlerts", "alerts",
       "Alerts waiting in the alerts queue (peek: nothing is removed)",
       (models.AlertPage, "One page"), (400,))  # fmt: skip
async def operator_list_alerts(query: Annotated[q.ListAlerts, Query()], ctx: Context) -> Response:
    """Each alert says whether it is resolved, from the state and timeline of the order it
    names (a point read per order; nothing is written when an order recovers): resolved once
    the order is Processed, retrying while a resubmitted order is in flight. `open=true` lists
    only open and retrying ones."""
    return answer(await alerts.list_alerts(ctx, **dict(query)))


@route("GET", "alerts/{sequence_number}", "peekAlert", "alerts", "One alert",
       (models.AlertView, "The alert"), (400, 404))  # fmt: skip
async def operator_peek_alert(sequence_number: SequenceNumber, ctx: Context) -> Response:
    return answer(await alerts.peek_alert(ctx, sequence_number))


@route("POST", "alerts/{sequence_number}/ack", "acknowledgeAlert", "alerts",
       "Acknowledge an alert: remove it from the queue, record who did and why",
       (models.AckView, "Acknowledged"), (400, 404, 409, 413))  # fmt: skip
async def operator_ack_alert(
    sequence_number: SequenceNumber, body: models.AckRequest, req: Request, ctx: Context
) -> Response:
    ack = alerts.acknowledge_alert
    return answer(await ack(ctx, sequence_number, operator=operator(req), **given(body)))


@route("GET", "dead-letters", "deadLetterSummary", "dead letters",
       "Dead-letter counts of every queue of the app", (models.DeadLetterSummary, "Counts"),
       (400,))  # fmt: skip
async def operator_dead_letter_summary(
    query: Annotated[q.DeadLetterCounts, Query()], ctx: Context
) -> Response:
    return answer(await dead_letters.dead_letter_summary(ctx, **dict(query)))


@route("GET", "dead-letters/{queue}", "listDeadLetters", "dead letters",
       "Dead letters of one queue (peek)", (models.DeadLetterPage, "One page"),
       (400, 404))  # fmt: skip
async def operator_list_dead_letters(
    queue: QueueRole, query: Annotated[q.ListDeadLetters, Query()], ctx: Context
) -> Response:
    return answer(await dead_letters.list_dead_letters(ctx, queue, **dict(query)))


@route("POST", "dead-letters/{queue}/replay", "replayDeadLetters", "dead letters",
       "Send dead letters back to their queue, then remove them from the dead letters",
       (models.DeadLetterActionView, "What became of each"), (400, 404, 413))  # fmt: skip
async def operator_replay_dead_letters(
    queue: QueueRole, body: models.DeadLetterActionRequest, req: Request, ctx: Context
) -> Response:
    """Each is sent as first sent (same body, MessageId and properties: a signature still
    verifies), then completed in the dead-letter queue. Refused, and kept: a message on a queue
    of signed messages whose signature does not verify (its trigger would refuse it), and one
    first sent less than 10 minutes ago (duplicate detection would drop the copy). Recorded in
    the timeline of the order a trusted message names. Name the dead letters by sequence
    number, or `all`; `dry_run` says what would be done. Say why (`reason`, required unless
    `dry_run`): it is recorded in the timeline of each order a message names and in the
    dead-letter log."""
    replay = dead_letters.replay_dead_letters
    return answer(await replay(ctx, queue, operator=operator(req), **given(body)))


@route("POST", "dead-letters/{queue}/purge", "purgeDeadLetters", "dead letters",
       "Remove dead letters for good", (models.DeadLetterActionView, "What became of each"),
       (400, 404, 413))  # fmt: skip
async def operator_purge_dead_letters(
    queue: QueueRole, body: models.DeadLetterActionRequest, req: Request, ctx: Context
) -> Response:
    """Recorded in the timeline of the order a trusted message names. Name the dead letters by
    sequence number, or `all`; `dry_run` says what would be done. Say why (`reason`, required
    unless `dry_run`): it is recorded in the timeline of each order a message names and in the
    dead-letter log."""
    drop = dead_letters.purge_dead_letters
    return answer(await drop(ctx, queue, operator=operator(req), **given(body)))


@route("GET", "dead-letter-log", "deadLetterLog", "dead letters",
       "Dead-letter replays and purges operators ran, newest first",
       (models.DeadLetterLogView, "The actions"), (400,))  # fmt: skip
async def operator_dead_letter_log(
    query: Annotated[q.DeadLetterLog, Query()], ctx: Context
) -> Response:
    """One entry per replay or purge that was not a dry run: when, who, the queue, the reason
    given, and each message's sequence number, MessageId, order (when one can be trusted) and
    outcome. Actions on messages that name no order are recorded only here."""
    return answer(await dead_letter_log.dead_letter_log(ctx, **dict(query)))


@route("GET", "supervisor", "showSupervisor", "supervisor",
       "The Supervisor's lag, sweeps, leases and recovery bound",
       (models.SupervisorView, "The Supervisor's state"))  # fmt: skip
async def operator_supervisor(ctx: Context) -> Response:
    """One read of the Supervisor's roster: per bucket of the active-order index, who holds its
    lease, when it was last swept and how overdue the most overdue order was then; and the
    bound on recovery latency computed from the settings."""
    return answer(await supervisor.supervisor(ctx))


@route("POST", "purge", "purge", "retention", "Archive, then delete, finished orders past an age",
       (models.PurgeView, "What the run did"), (400, 413))  # fmt: skip
async def operator_purge(body: models.PurgeBody, req: Request, ctx: Context) -> Response:
    """Processed orders, and Error orders once resolved (their terminal alert acknowledged after
    they last entered Error), last changed more than `older_than_days` ago (default: the
    RETENTION_DAYS setting). Each is appended to the day's archive blob, then its rows are
    deleted in Table transactions conditional on the ETag it was read with: one that changed
    meanwhile is skipped untouched (`skipped_changed`). Orders in flight, unresolved Errors and
    orders that may still owe their final messages are never purged. `dry_run` only counts.
    Non-dry runs are recorded (GET /purge). One call examines at most `limit` candidates and
    stops after 60 s; `more` says whether to call again."""
    return answer(await purge.purge(ctx, operator=operator(req), **given(body)))


@route("GET", "purge", "listPurgeRuns", "retention",
       "Recorded purge runs (the timer's and operators'), newest first",
       (models.PurgeRunsView, "The runs"), (400,))  # fmt: skip
async def operator_purge_runs(query: Annotated[q.PurgeRuns, Query()], ctx: Context) -> Response:
    return answer(await purge.purge_runs(ctx, **dict(query)))


@route("GET", "archive/{order_id}", "showArchivedOrder", "retention",
       "A purged order, read back from the archive",
       (models.ArchivedOrderView, "The archived order"), (400, 404, 409))  # fmt: skip
async def operator_archived_order(
    order_id: OrderId, query: Annotated[q.ArchivedOrder, Query()], ctx: Context
) -> Response:
    """Searches the archive's day blobs, newest first (or only `day`). An order archived more
    than once (a purge retried after a crash) is shown once: its latest copy."""
    return answer(await purge.archived_order(ctx, order_id, **dict(query)))


@route("GET", "health", "health", "meta", "Whether the app can work",
       (models.HealthView, "Every check passed"),
       also={503: (models.HealthView, "A check failed")})  # fmt: skip
async def operator_health(ctx: Context) -> Response:
    """Checked cheaply on each call: the settings loaded (the app would not have started
    otherwise), the orders table answers (one point read of a row that never exists), Service
    Bus answers (one peek of the alerts queue). 200 when all pass, 503 when one fails; each
    check says why."""
    result = await health.health(ctx)
    return answer(result, 200 if result.status == "ok" else 503)


@route("GET", "openapi.json", "openapi", "meta", "This document", (None, "OpenAPI 3.1 document"))
async def operator_openapi(req: Request) -> Response:
    return json_response(200, req.app.openapi())
