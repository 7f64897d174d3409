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
served at ``GET /api/openapi.json``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import azure.functions as func
from pydantic import BaseModel, ValidationError

from domain.states import ProcessState
from operator_api.openapi import openapi_document
from service import runtime
from service.operations import (
    alerts,
    bulk,
    dead_letter_log,
    dead_letters,
    health,
    orders,
    purge,
    supervisor,
)
from service.operations.bulk import BulkAction
from service.operations.context import OperatorContext
from service.operations.errors import InvalidRequest, OperatorError, TooLarge, Unauthenticated
from service.operations.models import (
    AckRequest,
    ActionRequest,
    BulkRequest,
    DeadLetterActionRequest,
    HealthView,
    PurgeBody,
    RestartRequest,
)

B = TypeVar("B", bound=BaseModel)
bp = func.Blueprint()
log = logging.getLogger("operator_api.http")

AUTH: Final = func.AuthLevel.FUNCTION
MAX_BODY_BYTES: Final = 16 * 1024
PRINCIPAL_HEADER: Final = "X-MS-CLIENT-PRINCIPAL-NAME"
_INTEGER: Final = re.compile(r"-?[0-9]{1,18}", re.ASCII)
_NUMBER: Final = re.compile(r"[0-9]{1,4}(\.[0-9]{1,3})?", re.ASCII)
_BOOLEANS: Final = {"true": True, "1": True, "false": False, "0": False}

_ctx: tuple[runtime.Runtime, OperatorContext] | None = None


async def context() -> OperatorContext:
    """The OperatorContext of the process-wide Runtime (rebuilt if that Runtime is replaced).

    Its clients belong to the event loop the functions run on. The swap awaits nothing, so
    requests on the loop never build two; the context it replaces is closed after."""
    global _ctx
    rt = runtime.current()
    if _ctx is None or _ctx[0] is not rt:
        previous = _ctx
        _ctx = (rt, OperatorContext(rt))
        if previous is not None:
            await previous[1].close()
    return _ctx[1]


# ---------------------------------------------------------------------------------- orders


@bp.route(route="orders", methods=["GET"], auth_level=AUTH)
async def operator_list_orders(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(
        lambda ctx: orders.list_orders(
            ctx,
            _required_param(req, "state"),
            step=req.params.get("step"),
            older_than=req.params.get("older_than"),
            newer_than=req.params.get("newer_than"),
            text=req.params.get("text"),
            sort=req.params.get("sort"),
            limit=_int_param(req, "limit", 50),
            continuation=req.params.get("continuation"),
        )
    )


@bp.route(route="orders/{order_id}", methods=["GET"], auth_level=AUTH)
async def operator_show_order(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(
        lambda ctx: orders.show_order(
            ctx,
            req.route_params.get("order_id", ""),
            timeline_after=_int_param(req, "timeline_after", -1),
            timeline_limit=_int_param(req, "timeline_limit", 200),
        )
    )


@bp.route(route="orders/{order_id}/watch", methods=["GET"], auth_level=AUTH)
async def operator_watch_order(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(
        lambda ctx: orders.watch_order(
            ctx,
            req.route_params.get("order_id", ""),
            after_seq=_int_param(req, "after", -1),
            wait_s=_number_param(req, "wait", 20.0),
        )
    )


@bp.route(route="orders/{order_id}/restart", methods=["POST"], auth_level=AUTH)
async def operator_restart_order(req: func.HttpRequest) -> func.HttpResponse:
    async def restart(ctx: OperatorContext) -> BaseModel:
        body = _json_body(req, RestartRequest)
        return await orders.restart(
            ctx,
            req.route_params.get("order_id", ""),
            step=body.step or "",
            operator=_operator(req),
            reason=body.reason or "",
        )

    return await _respond(restart, status=_action_status)


@bp.route(route="bulk/resubmit", methods=["POST"], auth_level=AUTH)
async def operator_bulk_resubmit(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(lambda ctx: _bulk(req, ctx, "resubmit"))


@bp.route(route="bulk/cancel", methods=["POST"], auth_level=AUTH)
async def operator_bulk_cancel(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(lambda ctx: _bulk(req, ctx, "cancel"))


@bp.route(route="orders/{order_id}/resubmit", methods=["POST"], auth_level=AUTH)
async def operator_resubmit_order(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(lambda ctx: _action(req, ctx, orders.resubmit), status=_action_status)


@bp.route(route="orders/{order_id}/cancel", methods=["POST"], auth_level=AUTH)
async def operator_cancel_order(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(lambda ctx: _action(req, ctx, orders.cancel), status=_action_status)


# ---------------------------------------------------------------------------------- alerts


@bp.route(route="alerts", methods=["GET"], auth_level=AUTH)
async def operator_list_alerts(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(
        lambda ctx: alerts.list_alerts(
            ctx,
            limit=_int_param(req, "limit", 50),
            continuation=req.params.get("continuation"),
            open_only=_bool_param(req, "open", False),
        )
    )


@bp.route(route="alerts/{sequence_number}", methods=["GET"], auth_level=AUTH)
async def operator_peek_alert(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(lambda ctx: alerts.peek_alert(ctx, _sequence_param(req)))


@bp.route(route="alerts/{sequence_number}/ack", methods=["POST"], auth_level=AUTH)
async def operator_ack_alert(req: func.HttpRequest) -> func.HttpResponse:
    async def ack(ctx: OperatorContext) -> BaseModel:
        body = _json_body(req, AckRequest)
        return await alerts.acknowledge_alert(
            ctx, _sequence_param(req), operator=_operator(req), reason=body.reason or ""
        )

    return await _respond(ack)


# ---------------------------------------------------------------------------- dead letters


@bp.route(route="dead-letters", methods=["GET"], auth_level=AUTH)
async def operator_dead_letter_summary(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(
        lambda ctx: dead_letters.dead_letter_summary(ctx, limit=_int_param(req, "limit", 100))
    )


@bp.route(route="dead-letters/{queue}", methods=["GET"], auth_level=AUTH)
async def operator_list_dead_letters(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(
        lambda ctx: dead_letters.list_dead_letters(
            ctx,
            req.route_params.get("queue", ""),
            limit=_int_param(req, "limit", 50),
            continuation=req.params.get("continuation"),
        )
    )


@bp.route(route="dead-letters/{queue}/replay", methods=["POST"], auth_level=AUTH)
async def operator_replay_dead_letters(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(lambda ctx: _dead_letters(req, ctx, dead_letters.replay_dead_letters))


@bp.route(route="dead-letters/{queue}/purge", methods=["POST"], auth_level=AUTH)
async def operator_purge_dead_letters(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(lambda ctx: _dead_letters(req, ctx, dead_letters.purge_dead_letters))


@bp.route(route="dead-letter-log", methods=["GET"], auth_level=AUTH)
async def operator_dead_letter_log(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(
        lambda ctx: dead_letter_log.dead_letter_log(ctx, limit=_int_param(req, "limit", 20))
    )


# ------------------------------------------------------------------------------ supervisor


@bp.route(route="supervisor", methods=["GET"], auth_level=AUTH)
async def operator_supervisor(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(supervisor.supervisor)


# ----------------------------------------------------------------------------------- purge


@bp.route(route="purge", methods=["POST"], auth_level=AUTH)
async def operator_purge(req: func.HttpRequest) -> func.HttpResponse:
    async def run(ctx: OperatorContext) -> BaseModel:
        body = _json_body(req, PurgeBody)
        return await purge.purge(
            ctx,
            operator=_operator(req),
            state=body.state,
            older_than_days=body.older_than_days,
            dry_run=body.dry_run,
            limit=body.limit,
        )

    return await _respond(run)


@bp.route(route="purge", methods=["GET"], auth_level=AUTH)
async def operator_purge_runs(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(lambda ctx: purge.purge_runs(ctx, limit=_int_param(req, "limit", 20)))


@bp.route(route="archive/{order_id}", methods=["GET"], auth_level=AUTH)
async def operator_archived_order(req: func.HttpRequest) -> func.HttpResponse:
    return await _respond(
        lambda ctx: purge.archived_order(
            ctx, req.route_params.get("order_id", ""), day=req.params.get("day")
        )
    )


# ---------------------------------------------------------------------------------- health


@bp.route(route="health", methods=["GET"], auth_level=AUTH)
async def operator_health(req: func.HttpRequest) -> func.HttpResponse:
    def healthy(result: BaseModel) -> int:
        return 200 if isinstance(result, HealthView) and result.status == "ok" else 503

    return await _respond(health.health, status=healthy)


# --------------------------------------------------------------------------------- openapi


@bp.route(route="openapi.json", methods=["GET"], auth_level=AUTH)
async def operator_openapi(req: func.HttpRequest) -> func.HttpResponse:
    return _json(200, openapi_document())


# --------------------------------------------------------------------------------- helpers


async def _respond(
    call: Callable[[OperatorContext], Awaitable[BaseModel]],
    *,
    status: Callable[[BaseModel], int] = lambda _: 200,
) -> func.HttpResponse:
    try:
        result = await call(await context())
    except OperatorError as refused:
        return _json(refused.status, refused.to_json())
    except Exception:
        log.exception("operator API request failed")
        return _json(
            500,
            {
                "error": {
                    "code": "internal",
                    "message": "the request failed on our side; it is logged with its stack trace",
                }
            },
        )
    return _json(status(result), result.model_dump(mode="json"))


def _json(status: int, body: Any) -> func.HttpResponse:
    return func.HttpResponse(
        json.dumps(body, ensure_ascii=False, separators=(",", ":")),
        status_code=status,
        mimetype="application/json",
        charset="utf-8",
        # The body may quote stored text from outside (alert details, order ids): a browser
        # must take it as JSON, never sniff it as a page.
        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
    )


async def _action(
    req: func.HttpRequest, ctx: OperatorContext, act: Callable[..., Awaitable[BaseModel]]
) -> BaseModel:
    body = _json_body(req, ActionRequest)
    return await act(
        ctx,
        req.route_params.get("order_id", ""),
        operator=_operator(req),
        reason=body.reason,
    )


async def _bulk(req: func.HttpRequest, ctx: OperatorContext, action: BulkAction) -> BaseModel:
    body = _json_body(req, BulkRequest)
    return await bulk.bulk(
        ctx,
        action,
        operator=_operator(req),
        reason=body.reason,
        state=body.state,
        step=body.step,
        older_than=body.older_than,
        newer_than=body.newer_than,
        text=body.text,
        dry_run=body.dry_run,
        order_ids=body.order_ids,
        limit=body.limit,
    )


async def _dead_letters(
    req: func.HttpRequest, ctx: OperatorContext, act: Callable[..., Awaitable[BaseModel]]
) -> BaseModel:
    body = _json_body(req, DeadLetterActionRequest)
    return await act(
        ctx,
        req.route_params.get("queue", ""),
        operator=_operator(req),
        sequence_numbers=body.sequence_numbers,
        everything=body.all,
        dry_run=body.dry_run,
        limit=body.limit,
        reason=body.reason,
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


def _required_param(req: func.HttpRequest, name: str) -> str:
    value = req.params.get(name)
    if not value:
        raise InvalidRequest("invalid_request", f"query parameter {name!r} is required")
    return value


def _int_param(req: func.HttpRequest, name: str, default: int) -> int:
    value = req.params.get(name)
    if value is None:
        return default
    if not _INTEGER.fullmatch(value.strip()):
        raise InvalidRequest("invalid_request", f"query parameter {name!r} must be an integer")
    return int(value)


def _number_param(req: func.HttpRequest, name: str, default: float) -> float:
    value = req.params.get(name)
    if value is None:
        return default
    if not _NUMBER.fullmatch(value.strip()):
        raise InvalidRequest("invalid_request", f"query parameter {name!r} must be a number")
    return float(value)


def _bool_param(req: func.HttpRequest, name: str, default: bool) -> bool:
    value = req.params.get(name)
    if value is None:
        return default
    if value.strip().lower() not in _BOOLEANS:
        raise InvalidRequest("invalid_request", f"query parameter {name!r} must be true or false")
    return _BOOLEANS[value.strip().lower()]


def _sequence_param(req: func.HttpRequest) -> int:
    text = req.route_params.get("sequence_number", "")
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        raise InvalidRequest(
            "invalid_sequence_number",
            f"{text[:40]!r} is not an alert sequence number (an integer >= 1)",
        )
    return int(text)
