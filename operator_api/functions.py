"""The operator HTTP API: HTTP-triggered functions over the use cases of :mod:`service.operations`.

Every function has ``auth_level=FUNCTION``: the Functions host refuses a request without a valid
function or host key (``x-functions-key`` header or ``code`` query parameter) with 401 before
any code here runs (``GET /api/health`` too: it names tables and queues). Locally, Core Tools
and the project's local host do not check keys: run the API locally only on a trusted machine.
A function key says which *client* may call, not which person. Actions (resubmit, cancel,
restart, bulk actions, acknowledge, purge, dead-letter replay and purge) record the caller the
platform names: App Service Authentication sets ``X-MS-CLIENT-PRINCIPAL-NAME`` for the
signed-in user, and external requests cannot set it; the local host sets it to its
``DEVHOST_PRINCIPAL_NAME`` setting. Without it an action is refused with 401. An ``operator``
in the request body is ignored: a body says whatever its sender wants.

Responses are JSON. Errors are ``{"error": {"code": ..., "message": ...}}`` with 400 (bad
input), 404 (unknown order, alert or queue), 409 (the action does not apply to the order's
state), 413 (body too large), 503 (busy; try again) or 500 (a fault of ours; details are
logged, not returned). Lists are paged: pass a response's ``continuation`` back as the
``continuation`` query parameter; null means there is no more. The OpenAPI 3.1 description is
served at ``GET /api/openapi.json``: each function's route declaration (:func:`route`), its
docstring (summary, then description) and the model of its parameters
(:mod:`operator_api.params`) make both the function and its entry there.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

import azure.functions as func
from pydantic import BaseModel, ValidationError

from domain.states import ProcessState
from operator_api import openapi
from operator_api.openapi import Answer, Operation
from operator_api.params import (
    AGE,
    AlertPath,
    Boolean,
    Continuation,
    Integer,
    Number,
    OrderPath,
    Present,
    QueuePath,
    param,
    read,
)
from service import runtime
from service.listing import LISTABLE_STATES, MAX_LIMIT, SORTS
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
from service.operations.context import OperatorContext
from service.operations.errors import InvalidRequest, OperatorError, TooLarge, Unauthenticated

B = TypeVar("B", bound=BaseModel)
Handler = Callable[[func.HttpRequest], Awaitable[func.HttpResponse]]
bp = func.Blueprint()
log = logging.getLogger("operator_api.http")

AUTH: Final = func.AuthLevel.FUNCTION
MAX_BODY_BYTES: Final = 16 * 1024
PRINCIPAL_HEADER: Final = "X-MS-CLIENT-PRINCIPAL-NAME"
DONE: Final = (models.ActionView, "Done: the order is now terminal")
ACCEPTED: Final = {202: (models.ActionView, "Accepted: the order goes on asynchronously")}
ACTION_ERRORS: Final = (400, 404, 409, 413, 503)
INTERNAL: Final = {
    "error": {
        "code": "internal",
        "message": "the request failed on our side; it is logged with its stack trace",
    }
}

_ctx: OperatorContext | None = None


def route(
    method: str,
    path: str,
    operation_id: str,
    tag: str,
    answer: Answer,
    errors: tuple[int, ...] = (),
    *,
    params: type[BaseModel] | None = None,
    body: type[BaseModel] | None = None,
    also: dict[int, Answer] | None = None,
) -> Callable[[Handler], Any]:
    """Registers the function for ``method`` on ``/api/<path>`` and describes it in the OpenAPI
    document: ``answer`` is its 200 (model, meaning), ``also`` its other successes, ``errors``
    the statuses of its refusals; ``params`` reads its parameters, ``body`` its body. The
    function's docstring says what it does: its first line is the summary, the rest the
    description."""

    def register(function: Handler) -> Any:
        summary, _, description = inspect.cleandoc(function.__doc__ or "").partition("\n")
        description = " ".join(description.split()) or None
        responses = {200: answer} | (also or {})
        operation = Operation(
            operation_id, tag, summary, description, responses, errors, params, body
        )
        openapi.describe(method, path, operation)
        return bp.route(route=path, methods=[method], auth_level=AUTH)(function)

    return register


async def context() -> OperatorContext:
    """The OperatorContext of the process-wide Runtime (rebuilt if that Runtime is replaced).

    Its clients belong to the event loop the functions run on. The swap awaits nothing, so
    requests on the loop never build two; the context it replaces is closed after."""
    global _ctx
    rt = runtime.current()
    if _ctx is None or _ctx.rt is not rt:
        previous, _ctx = _ctx, OperatorContext(rt)
        if previous is not None:
            await previous.close()
    return _ctx


# ---------------------------------------------------------------------------------- orders


class ListOrders(BaseModel):
    state: Present = param(
        ..., "Order state (case-insensitive)", enum=[s.value for s in LISTABLE_STATES]
    )
    step: str | None = param(None, "Only orders now at this step")
    older_than: str | None = param(None, "Created longer ago: 90s, 15m, 2h, 7d", pattern=AGE)
    newer_than: str | None = param(None, "Created more recently than this", pattern=AGE)
    text: str | None = param(
        None, "Found in the id, last error or compensation reason (any case)", maxLength=200
    )
    sort: str = param("index", "Order of items", enum=list(SORTS))
    limit: Integer = param(50, "Page size", minimum=1, maximum=MAX_LIMIT)
    continuation: Continuation = None


@route("GET", "orders", "listOrders", "orders", (models.OrderPage, "One page"), (400,),
       params=ListOrders)  # fmt: skip
async def operator_list_orders(req: func.HttpRequest) -> func.HttpResponse:
    """List orders in one state, filtered, sorted, paged

    In-flight states are read from the active-order index and Error from the Error index, with a
    point read per index row looked at. Processed is read from the orders table with a query on
    the process rows (at most 5 requests of up to 200 rows per call; the service scans the table
    to answer it). Filters: the current step, the age since created, a text in the id, last
    error or compensation reason. `sort=index` pages in the source's key order; any other sort
    reads every candidate (up to 500) per page and says `partial` when they did not all fit. A
    page may hold fewer than `limit` orders and still have a continuation.
    """
    return await _respond(req, orders.list_orders, ListOrders)


class ShowOrder(OrderPath):
    timeline_after: Integer = param(
        -1, "Show timeline entries after this sequence number", minimum=-1
    )
    timeline_limit: Integer = param(200, "Timeline entries per page", minimum=1, maximum=1000)


@route("GET", "orders/{order_id}", "showOrder", "orders", (models.OrderDetail, "The order"),
       (400, 404), params=ShowOrder)  # fmt: skip
async def operator_show_order(req: func.HttpRequest) -> func.HttpResponse:
    """One order with its steps and timeline"""
    return await _respond(req, orders.show_order, ShowOrder)


class WatchOrder(OrderPath):
    after_seq: Integer = param(-1, "The last timeline entry seen", alias="after", minimum=-1)
    wait_s: Number = param(
        20.0, "Seconds to wait for a change", alias="wait", minimum=0, maximum=60
    )


@route("GET", "orders/{order_id}/watch", "watchOrder", "orders",
       (models.WatchView, "A change, or none within `wait`"), (400, 404),
       params=WatchOrder)  # fmt: skip
async def operator_watch_order(req: func.HttpRequest) -> func.HttpResponse:
    """Wait for an order's next change

    Answers once the order has timeline entries after `after` (those entries, and the order
    now), at once if it is finished, or after `wait` seconds with `changed: false`. Call again
    with the last entry's `seq` to follow it until `terminal`.
    """
    return await _respond(req, orders.watch_order, WatchOrder)


@route("POST", "orders/{order_id}/restart", "restartOrder", "orders", DONE, ACTION_ERRORS,
       params=OrderPath, body=models.RestartRequest, also=ACCEPTED)  # fmt: skip
async def operator_restart_order(req: func.HttpRequest) -> func.HttpResponse:
    """Restart an Error order from a named step

    The step (one of the order's workflow version) and every later one are redone with the next
    generation, even a step whose result was kept; the steps before it resume as a resubmit
    does (those that did not succeed are redone). Refused (409) for an order not in Error or
    with undos left (resubmit it first), 400 for a step the workflow lacks. Recorded in the
    timeline (event restarted).
    """

    async def restart(ctx: OperatorContext) -> BaseModel:
        body = _json_body(req, models.RestartRequest)
        return await orders.restart(
            ctx,
            **read(req, OrderPath),
            step=body.step or "",
            operator=_operator(req),
            reason=body.reason or "",
        )

    return await _respond(req, restart, status=_action_status)


@route("POST", "bulk/resubmit", "bulkResubmit", "orders",
       (models.BulkView, "What was done to each order"), (400, 413),
       body=models.BulkRequest)  # fmt: skip
async def operator_bulk_resubmit(req: func.HttpRequest) -> func.HttpResponse:
    """Resubmit the orders a filter selects

    Selects Error orders by state, current step, age and text (at least one filter), at most
    `limit`; a dry run only lists them. Give `order_ids` (what a dry run listed) to act only on
    those, each only if it still matches. Each is acted on as POST /orders/{order_id}/resubmit
    is, with its own outcome. `more`: more orders match, run it again.
    """
    return await _respond(req, bulk.bulk, body=models.BulkRequest, action="resubmit")


@route("POST", "bulk/cancel", "bulkCancel", "orders",
       (models.BulkView, "What was done to each order"), (400, 413),
       body=models.BulkRequest)  # fmt: skip
async def operator_bulk_cancel(req: func.HttpRequest) -> func.HttpResponse:
    """Cancel the orders a filter selects

    Selects Pending or Processing orders by state, current step, age and text (at least one
    filter), at most `limit`; a dry run only lists them. Give `order_ids` (what a dry run
    listed) to act only on those, each only if it still matches. Each is acted on as POST
    /orders/{order_id}/cancel is, with its own outcome. `more`: more orders match, run it again.
    """
    return await _respond(req, bulk.bulk, body=models.BulkRequest, action="cancel")


@route("POST", "orders/{order_id}/resubmit", "resubmitOrder", "orders", DONE, ACTION_ERRORS,
       params=OrderPath, body=models.ActionRequest, also=ACCEPTED)  # fmt: skip
async def operator_resubmit_order(req: func.HttpRequest) -> func.HttpResponse:
    """Resubmit an Error order

    Resumes at the first step that did not succeed, with the next generation (new idempotency
    keys; steps that were compensated are redone, succeeded ones are kept): outcome
    resubmitted. If undos are left (an incomplete compensation), it retries them instead, same
    generation so each undo keeps its key: outcome compensation_resumed.
    """
    return await _respond(
        req, orders.resubmit, OrderPath, body=models.ActionRequest, status=_action_status
    )


@route("POST", "orders/{order_id}/cancel", "cancelOrder", "orders", DONE, ACTION_ERRORS,
       params=OrderPath, body=models.ActionRequest, also=ACCEPTED)  # fmt: skip
async def operator_cancel_order(req: func.HttpRequest) -> func.HttpResponse:
    """Cancel a Pending or Processing order

    Acts at once, whatever the order waits for: every step that may have taken effect
    (succeeded, or requested with the outcome unknown: the one in flight too) is undone, latest
    first, each undo naming the forward call it undoes (one landing later is refused by the
    service); then Error (cancelled) with one alert. Outcome compensating (202), or failed when
    nothing can have taken effect (200: Error now). An order already being undone, or finished,
    is refused (409).
    """
    return await _respond(
        req, orders.cancel, OrderPath, body=models.ActionRequest, status=_action_status
    )


# ---------------------------------------------------------------------------------- alerts


class ListAlerts(BaseModel):
    limit: Integer = param(50, "Page size", minimum=1, maximum=MAX_LIMIT)
    continuation: Continuation = None
    open_only: Boolean = param(False, "Only alerts still open or retrying", alias="open")


@route("GET", "alerts", "listAlerts", "alerts", (models.AlertPage, "One page"), (400,),
       params=ListAlerts)  # fmt: skip
async def operator_list_alerts(req: func.HttpRequest) -> func.HttpResponse:
    """Alerts waiting in the alerts queue (peek: nothing is removed)

    Each alert says whether it is resolved, from the state and timeline of the order it names (a
    point read per order; nothing is written when an order recovers): resolved once the order is
    Processed, retrying while a resubmitted order is in flight. `open=true` lists only open and
    retrying ones.
    """
    return await _respond(req, alerts.list_alerts, ListAlerts)


@route("GET", "alerts/{sequence_number}", "peekAlert", "alerts", (models.AlertView, "The alert"),
       (400, 404), params=AlertPath)  # fmt: skip
async def operator_peek_alert(req: func.HttpRequest) -> func.HttpResponse:
    """One alert"""
    return await _respond(req, alerts.peek_alert, AlertPath)


@route("POST", "alerts/{sequence_number}/ack", "acknowledgeAlert", "alerts",
       (models.AckView, "Acknowledged"), (400, 404, 409, 413), params=AlertPath,
       body=models.AckRequest)  # fmt: skip
async def operator_ack_alert(req: func.HttpRequest) -> func.HttpResponse:
    """Acknowledge an alert: remove it from the queue, record who did and why"""
    return await _respond(req, alerts.acknowledge_alert, AlertPath, body=models.AckRequest)


# ---------------------------------------------------------------------------- dead letters


class DeadLetterCounts(BaseModel):
    limit: Integer = param(100, "Page size", minimum=1, maximum=MAX_LIMIT)


@route("GET", "dead-letters", "deadLetterSummary", "dead letters",
       (models.DeadLetterSummary, "Counts"), (400,), params=DeadLetterCounts)  # fmt: skip
async def operator_dead_letter_summary(req: func.HttpRequest) -> func.HttpResponse:
    """Dead-letter counts of every queue of the app"""
    return await _respond(req, dead_letters.dead_letter_summary, DeadLetterCounts)


class ListDeadLetters(QueuePath):
    limit: Integer = param(50, "Page size", minimum=1, maximum=MAX_LIMIT)
    continuation: Continuation = None


@route("GET", "dead-letters/{queue}", "listDeadLetters", "dead letters",
       (models.DeadLetterPage, "One page"), (400, 404), params=ListDeadLetters)  # fmt: skip
async def operator_list_dead_letters(req: func.HttpRequest) -> func.HttpResponse:
    """Dead letters of one queue (peek)"""
    return await _respond(req, dead_letters.list_dead_letters, ListDeadLetters)


@route("POST", "dead-letters/{queue}/replay", "replayDeadLetters", "dead letters",
       (models.DeadLetterActionView, "What became of each"), (400, 404, 413), params=QueuePath,
       body=models.DeadLetterActionRequest)  # fmt: skip
async def operator_replay_dead_letters(req: func.HttpRequest) -> func.HttpResponse:
    """Send dead letters back to their queue, then remove them from the dead letters

    Each is sent as first sent (same body, MessageId and properties: a signature still
    verifies), then completed in the dead-letter queue. Refused, and kept: a message on a queue
    of signed messages whose signature does not verify (its trigger would refuse it), and one
    first sent less than 10 minutes ago (duplicate detection would drop the copy). Recorded in
    the timeline of the order a trusted message names. Name the dead letters by sequence
    number, or `all`; `dry_run` says what would be done. Say why (`reason`, required unless
    `dry_run`): it is recorded in the timeline of each order a message names and in the
    dead-letter log.
    """
    return await _respond(
        req, dead_letters.replay_dead_letters, QueuePath, body=models.DeadLetterActionRequest
    )


@route("POST", "dead-letters/{queue}/purge", "purgeDeadLetters", "dead letters",
       (models.DeadLetterActionView, "What became of each"), (400, 404, 413), params=QueuePath,
       body=models.DeadLetterActionRequest)  # fmt: skip
async def operator_purge_dead_letters(req: func.HttpRequest) -> func.HttpResponse:
    """Remove dead letters for good

    Recorded in the timeline of the order a trusted message names. Name the dead letters by
    sequence number, or `all`; `dry_run` says what would be done. Say why (`reason`, required
    unless `dry_run`): it is recorded in the timeline of each order a message names and in the
    dead-letter log.
    """
    return await _respond(
        req, dead_letters.purge_dead_letters, QueuePath, body=models.DeadLetterActionRequest
    )


class DeadLetterLog(BaseModel):
    limit: Integer = param(20, "Actions to show", minimum=1, maximum=dead_letter_log.MAX_RECENT)


@route("GET", "dead-letter-log", "deadLetterLog", "dead letters",
       (models.DeadLetterLogView, "The actions"), (400,), params=DeadLetterLog)  # fmt: skip
async def operator_dead_letter_log(req: func.HttpRequest) -> func.HttpResponse:
    """Dead-letter replays and purges operators ran, newest first

    One entry per replay or purge that was not a dry run: when, who, the queue, the reason
    given, and each message's sequence number, MessageId, order (when one can be trusted) and
    outcome. Actions on messages that name no order are recorded only here.
    """
    return await _respond(req, dead_letter_log.dead_letter_log, DeadLetterLog)


# ------------------------------------------------------------------------------ supervisor


@route("GET", "supervisor", "showSupervisor", "supervisor",
       (models.SupervisorView, "The Supervisor's state"))  # fmt: skip
async def operator_supervisor(req: func.HttpRequest) -> func.HttpResponse:
    """The Supervisor's lag, sweeps, leases and recovery bound

    One read of the Supervisor's roster: per bucket of the active-order index, who holds its
    lease, when it was last swept and how overdue the most overdue order was then; and the bound
    on recovery latency computed from the settings.
    """
    return await _respond(req, supervisor.supervisor)


# ----------------------------------------------------------------------------------- purge


@route("POST", "purge", "purge", "retention", (models.PurgeView, "What the run did"), (400, 413),
       body=models.PurgeBody)  # fmt: skip
async def operator_purge(req: func.HttpRequest) -> func.HttpResponse:
    """Archive, then delete, finished orders past an age

    Processed orders, and Error orders once resolved (their terminal alert acknowledged after
    they last entered Error), last changed more than `older_than_days` ago (default: the
    RETENTION_DAYS setting). Each is appended to the day's archive blob, then its rows are
    deleted in Table transactions conditional on the ETag it was read with: one that changed
    meanwhile is skipped untouched (`skipped_changed`). Orders in flight, unresolved Errors and
    orders that may still owe their final messages are never purged. `dry_run` only counts.
    Non-dry runs are recorded (GET /purge). One call examines at most `limit` candidates and
    stops after 60 s; `more` says whether to call again.
    """
    return await _respond(req, purge.purge, body=models.PurgeBody)


class PurgeRuns(BaseModel):
    limit: Integer = param(20, "Runs to show", minimum=1, maximum=MAX_LIMIT)


@route("GET", "purge", "listPurgeRuns", "retention", (models.PurgeRunsView, "The runs"), (400,),
       params=PurgeRuns)  # fmt: skip
async def operator_purge_runs(req: func.HttpRequest) -> func.HttpResponse:
    """Recorded purge runs (the timer's and operators'), newest first"""
    return await _respond(req, purge.purge_runs, PurgeRuns)


class ArchivedOrder(OrderPath):
    day: str | None = param(None, "Only the archive of this day (UTC, YYYY-MM-DD)", format="date")


@route("GET", "archive/{order_id}", "showArchivedOrder", "retention",
       (models.ArchivedOrderView, "The archived order"), (400, 404, 409),
       params=ArchivedOrder)  # fmt: skip
async def operator_archived_order(req: func.HttpRequest) -> func.HttpResponse:
    """A purged order, read back from the archive

    Searches the archive's day blobs, newest first (or only `day`). An order archived more than
    once (a purge retried after a crash) is shown once: its latest copy.
    """
    return await _respond(req, purge.archived_order, ArchivedOrder)


# ---------------------------------------------------------------------------------- health


@route("GET", "health", "health", "meta", (models.HealthView, "Every check passed"),
       also={503: (models.HealthView, "A check failed")})  # fmt: skip
async def operator_health(req: func.HttpRequest) -> func.HttpResponse:
    """Whether the app can work

    Checked cheaply on each call: the settings loaded (the app would not have started
    otherwise), the orders table answers (one point read of a row that never exists), Service
    Bus answers (one peek of the alerts queue). 200 when all pass, 503 when one fails; each
    check says why.
    """

    def healthy(result: BaseModel) -> int:
        return 200 if isinstance(result, models.HealthView) and result.status == "ok" else 503

    return await _respond(req, health.health, status=healthy)


# --------------------------------------------------------------------------------- openapi


@route("GET", "openapi.json", "openapi", "meta", (None, "OpenAPI 3.1 document"))
async def operator_openapi(req: func.HttpRequest) -> func.HttpResponse:
    """This document"""
    return json_response(200, openapi.openapi_document())


# --------------------------------------------------------------------------------- helpers


async def _respond(
    req: func.HttpRequest,
    use_case: Callable[..., Awaitable[BaseModel]],
    params: type[BaseModel] | None = None,
    *,
    body: type[BaseModel] | None = None,
    status: Callable[[BaseModel], int] = lambda _: 200,
    **fixed: Any,
) -> func.HttpResponse:
    """The answer of ``use_case`` called with ``fixed``, the request's ``params`` and, for an
    action (a ``body``), the signed-in caller as ``operator`` and the body's fields by their
    (serialization) names."""
    try:
        ctx = await context()
        if body is None:
            result = await use_case(ctx, **fixed, **(read(req, params) if params else {}))
        else:
            given = _json_body(req, body).model_dump(exclude={"operator"}, by_alias=True)
            where = read(req, params) if params else {}
            result = await use_case(ctx, **fixed, **where, operator=_operator(req), **given)
    except OperatorError as refused:
        return json_response(refused.status, refused.to_json())
    except Exception:
        log.exception("operator API request failed")
        return json_response(500, INTERNAL)
    return json_response(status(result), result.model_dump(mode="json"))


def json_response(
    status: int, body: Any, extra: Mapping[str, str] | None = None
) -> func.HttpResponse:
    """``body`` as JSON, never cached, with the ``extra`` headers too."""
    return func.HttpResponse(
        json.dumps(body, ensure_ascii=False, separators=(",", ":")),
        status_code=status,
        mimetype="application/json",
        charset="utf-8",
        # The body may quote stored text from outside (alert details, order ids): a browser
        # must take it as JSON, never sniff it as a page.
        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", **(extra or {})},
    )


def _action_status(result: BaseModel) -> int:
    # 202: the action goes on asynchronously (undos or steps dispatched); 200: it is complete.
    state = getattr(result, "state", "")
    return 200 if state in (ProcessState.ERROR.value, ProcessState.PROCESSED.value) else 202


def _operator(req: func.HttpRequest) -> str:
    """Who acts: the caller the platform authenticated (never the body's ``operator``)."""
    principal = (req.headers.get(PRINCIPAL_HEADER) or "").strip()
    if not principal:
        raise Unauthenticated(
            "not_signed_in",
            "no signed-in caller: operator actions record who acted, taken from App Service "
            f"Authentication ({PRINCIPAL_HEADER}); enable it on the Function App (see "
            "docs/deploy.md), or locally set DEVHOST_PRINCIPAL_NAME for the local host",
        )
    return principal


def _json_body(req: func.HttpRequest, model: type[B]) -> B:
    raw = req.get_body() or b""
    if len(raw) > MAX_BODY_BYTES:
        raise TooLarge("body_too_large", f"the body is over {MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(raw) if raw.strip() else {}
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidRequest("invalid_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("invalid_json", "the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False)[:5]
        )
        raise InvalidRequest("invalid_request", f"the body is invalid: {problems}") from None
