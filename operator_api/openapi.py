"""The OpenAPI 3.1 description of the operator HTTP API, built from the response models.

Schemas come from the pydantic models (JSON Schema 2020-12, which OpenAPI 3.1 uses as is), so
the description cannot drift from what the functions return.
"""

from __future__ import annotations

import functools
from typing import Any, Final

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from adapters.settings import QUEUE_SETTINGS
from domain.ids import ID_MAX_LENGTH
from service.listing import LISTABLE_STATES, MAX_LIMIT, SORTS
from service.operations import dead_letter_log, models

VERSION: Final = "1.0.0"
_REF: Final = "#/components/schemas/{model}"
_MODELS: Final[tuple[type[BaseModel], ...]] = (
    models.OrderPage,
    models.OrderDetail,
    models.ActionView,
    models.ActionRequest,
    models.AlertPage,
    models.AlertView,
    models.AckView,
    models.AckRequest,
    models.DeadLetterSummary,
    models.DeadLetterPage,
    models.SupervisorView,
    models.PurgeBody,
    models.PurgeView,
    models.PurgeRunsView,
    models.ArchivedOrderView,
    models.WatchView,
    models.RestartRequest,
    models.BulkRequest,
    models.BulkView,
    models.DeadLetterActionRequest,
    models.DeadLetterActionView,
    models.DeadLetterLogView,
    models.HealthView,
    models.ErrorBody,
)
_REQUESTS: Final = (
    models.ActionRequest,
    models.AckRequest,
    models.PurgeBody,
    models.RestartRequest,
    models.BulkRequest,
    models.DeadLetterActionRequest,
)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _errors(*statuses: int) -> dict[str, Any]:
    meaning = {
        400: "Invalid input: the message says what to fix",
        404: "Unknown order, alert or queue (or an order not in the archive)",
        409: "The action does not apply to the order or alert as it is now",
        413: "Request body too large",
        503: "Busy: the same request may succeed in a moment",
    }
    responses = {str(s): _json(models.ErrorBody, meaning[s]) for s in statuses}
    responses["401"] = {
        "description": "Missing or wrong function key (answered by the Functions host)"
    }
    responses["500"] = _json(models.ErrorBody, "A fault on the server side (logged)")
    return responses


def _query(name: str, schema: dict[str, Any], description: str, required: bool = False):
    return {
        "name": name,
        "in": "query",
        "required": required,
        "schema": schema,
        "description": description,
    }


def _path(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": schema,
        "description": description,
    }


_LIMIT = _query(
    "limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 50}, "Page size"
)
_CONTINUATION = _query(
    "continuation", {"type": "string"}, "The `continuation` of the previous page"
)
_ORDER_ID = _path(
    "order_id",
    {"type": "string", "pattern": f"^[A-Za-z0-9][A-Za-z0-9_-]{{0,{ID_MAX_LENGTH - 1}}}$"},
    "Order id",
)
_SEQUENCE = _path(
    "sequence_number",
    {"type": "integer", "minimum": 1},
    "The alert's sequence number in the alerts queue",
)


_AGE_PARAM = {"type": "string", "pattern": "^[0-9]{1,9}[smhd]?$"}
_QUEUE = _path("queue", {"enum": list(QUEUE_SETTINGS)}, "The queue's role")


def _body(model: type[BaseModel]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(model)}}}


def _action(
    summary: str, description: str, op_id: str, body: type[BaseModel] = models.ActionRequest
) -> dict[str, Any]:
    return {
        "post": {
            "operationId": op_id,
            "summary": summary,
            "description": description,
            "tags": ["orders"],
            "parameters": [_ORDER_ID],
            "requestBody": _body(body),
            "responses": {
                "200": _json(models.ActionView, "Done: the order is now terminal"),
                "202": _json(models.ActionView, "Accepted: the order goes on asynchronously"),
                **_errors(400, 404, 409, 413, 503),
            },
        }
    }


def _paths() -> dict[str, Any]:
    return {
        "/supervisor": {
            "get": {
                "operationId": "showSupervisor",
                "summary": "The Supervisor's lag, sweeps, leases and recovery bound",
                "description": "One read of the Supervisor's roster: per bucket of the "
                "active-order index, who holds its lease, when it was last swept and how "
                "overdue the most overdue order was then; and the bound on recovery latency "
                "computed from the settings.",
                "tags": ["supervisor"],
                "responses": {"200": _json(models.SupervisorView, "The Supervisor's state")},
            }
        },
        "/orders": {
            "get": {
                "operationId": "listOrders",
                "summary": "List orders in one state, filtered, sorted, paged",
                "description": "In-flight states are read from the active-order index and Error "
                "from the Error index, with a point read per index row looked at. Processed "
                "is read from the orders table with a query on the process rows (at most 5 "
                "requests of up to 200 rows per call; the service scans the table to answer "
                "it). Filters: the current step, the age since created, a text in the id, "
                "last error or compensation reason. `sort=index` pages in the source's key "
                "order; any other sort reads every candidate (up to 500) per page and says "
                "`partial` when they did not all fit. A page may hold fewer than `limit` "
                "orders and still have a continuation.",
                "tags": ["orders"],
                "parameters": [
                    _query(
                        "state",
                        {"enum": [s.value for s in LISTABLE_STATES]},
                        "Order state (case-insensitive)",
                        required=True,
                    ),
                    _query("step", {"type": "string"}, "Only orders now at this step"),
                    _query("older_than", _AGE_PARAM, "Created longer ago: 90s, 15m, 2h, 7d"),
                    _query("newer_than", _AGE_PARAM, "Created more recently than this"),
                    _query(
                        "text",
                        {"type": "string", "maxLength": 200},
                        "Found in the id, last error or compensation reason (any case)",
                    ),
                    _query("sort", {"enum": list(SORTS), "default": "index"}, "Order of items"),
                    _LIMIT,
                    _CONTINUATION,
                ],
                "responses": {"200": _json(models.OrderPage, "One page"), **_errors(400)},
            }
        },
        "/orders/{order_id}/watch": {
            "get": {
                "operationId": "watchOrder",
                "summary": "Wait for an order's next change",
                "description": "Answers once the order has timeline entries after `after` "
                "(those entries, and the order now), at once if it is finished, or after "
                "`wait` seconds with `changed: false`. Call again with the last entry's "
                "`seq` to follow it until `terminal`.",
                "tags": ["orders"],
                "parameters": [
                    _ORDER_ID,
                    _query(
                        "after",
                        {"type": "integer", "minimum": -1, "default": -1},
                        "The last timeline entry seen",
                    ),
                    _query(
                        "wait",
                        {"type": "number", "minimum": 0, "maximum": 60, "default": 20},
                        "Seconds to wait for a change",
                    ),
                ],
                "responses": {
                    "200": _json(models.WatchView, "A change, or none within `wait`"),
                    **_errors(400, 404),
                },
            }
        },
        "/orders/{order_id}": {
            "get": {
                "operationId": "showOrder",
                "summary": "One order with its steps and timeline",
                "tags": ["orders"],
                "parameters": [
                    _ORDER_ID,
                    _query(
                        "timeline_after",
                        {"type": "integer", "minimum": -1, "default": -1},
                        "Show timeline entries after this sequence number",
                    ),
                    _query(
                        "timeline_limit",
                        {"type": "integer", "minimum": 1, "maximum": 1000, "default": 200},
                        "Timeline entries per page",
                    ),
                ],
                "responses": {"200": _json(models.OrderDetail, "The order"), **_errors(400, 404)},
            }
        },
        "/orders/{order_id}/resubmit": _action(
            "Resubmit an Error order",
            "Resumes at the first step that did not succeed, with the next generation (new "
            "idempotency keys; steps that were compensated are redone, succeeded ones are "
            "kept): outcome resubmitted. If undos are left (an incomplete compensation), it "
            "retries them instead, same generation so each undo keeps its key: outcome "
            "compensation_resumed.",
            "resubmitOrder",
        ),
        "/orders/{order_id}/restart": _action(
            "Restart an Error order from a named step",
            "The step (one of the order's workflow version) and every later one are redone "
            "with the next generation, even a step whose result was kept; the steps before it "
            "resume as a resubmit does (those that did not succeed are redone). Refused (409) "
            "for an order not in Error or with undos left (resubmit it first), 400 for a step "
            "the workflow lacks. Recorded in the timeline (event restarted).",
            "restartOrder",
            models.RestartRequest,
        ),
        "/bulk/resubmit": _bulk("resubmit", "Error"),
        "/bulk/cancel": _bulk("cancel", "Pending or Processing"),
        "/orders/{order_id}/cancel": _action(
            "Cancel a Pending or Processing order",
            "Acts at once, whatever the order waits for: every step that may have taken effect "
            "(succeeded, or requested with the outcome unknown: the one in flight too) is "
            "undone, latest first, each undo naming the forward call it undoes (one landing "
            "later is refused by the service); then Error (cancelled) with one alert. Outcome "
            "compensating (202), or failed when nothing can have taken effect (200: Error "
            "now). An order already being undone, or finished, is refused (409).",
            "cancelOrder",
        ),
        "/alerts": {
            "get": {
                "operationId": "listAlerts",
                "summary": "Alerts waiting in the alerts queue (peek: nothing is removed)",
                "description": "Each alert says whether it is resolved, from the state and "
                "timeline of the order it names (a point read per order; nothing is written "
                "when an order recovers): resolved once the order is Processed, retrying while "
                "a resubmitted order is in flight. `open=true` lists only open and retrying "
                "ones.",
                "tags": ["alerts"],
                "parameters": [
                    _LIMIT,
                    _CONTINUATION,
                    _query(
                        "open",
                        {"type": "boolean", "default": False},
                        "Only alerts still open or retrying",
                    ),
                ],
                "responses": {"200": _json(models.AlertPage, "One page"), **_errors(400)},
            }
        },
        "/alerts/{sequence_number}": {
            "get": {
                "operationId": "peekAlert",
                "summary": "One alert",
                "tags": ["alerts"],
                "parameters": [_SEQUENCE],
                "responses": {"200": _json(models.AlertView, "The alert"), **_errors(400, 404)},
            }
        },
        "/alerts/{sequence_number}/ack": {
            "post": {
                "operationId": "acknowledgeAlert",
                "summary": "Acknowledge an alert: remove it from the queue, record who did and why",
                "tags": ["alerts"],
                "parameters": [_SEQUENCE],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref(models.AckRequest)}},
                },
                "responses": {
                    "200": _json(models.AckView, "Acknowledged"),
                    **_errors(400, 404, 409, 413),
                },
            }
        },
        "/dead-letters": {
            "get": {
                "operationId": "deadLetterSummary",
                "summary": "Dead-letter counts of every queue of the app",
                "tags": ["dead letters"],
                "parameters": [_LIMIT],
                "responses": {
                    "200": _json(models.DeadLetterSummary, "Counts"),
                    **_errors(400),
                },
            }
        },
        "/dead-letters/{queue}": {
            "get": {
                "operationId": "listDeadLetters",
                "summary": "Dead letters of one queue (peek)",
                "tags": ["dead letters"],
                "parameters": [_QUEUE, _LIMIT, _CONTINUATION],
                "responses": {
                    "200": _json(models.DeadLetterPage, "One page"),
                    **_errors(400, 404),
                },
            }
        },
        "/dead-letters/{queue}/replay": _dead_letter_action(
            "replay",
            "Send dead letters back to their queue, then remove them from the dead letters",
            "Each is sent as first sent (same body, MessageId and properties: a signature "
            "still verifies), then completed in the dead-letter queue. Refused, and kept: a "
            "message on a queue of signed messages whose signature does not verify (its "
            "trigger would refuse it), and one first sent less than 10 minutes ago (duplicate "
            "detection would drop the copy). Recorded in the timeline of the order a trusted "
            "message names.",
        ),
        "/dead-letters/{queue}/purge": _dead_letter_action(
            "purge",
            "Remove dead letters for good",
            "Recorded in the timeline of the order a trusted message names.",
        ),
        "/dead-letter-log": {
            "get": {
                "operationId": "deadLetterLog",
                "summary": "Dead-letter replays and purges operators ran, newest first",
                "description": "One entry per replay or purge that was not a dry run: when, "
                "who, the queue, the reason given, and each message's sequence number, "
                "MessageId, order (when one can be trusted) and outcome. Actions on messages "
                "that name no order are recorded only here.",
                "tags": ["dead letters"],
                "parameters": [
                    _query(
                        "limit",
                        {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": dead_letter_log.MAX_RECENT,
                            "default": 20,
                        },
                        "Actions to show",
                    )
                ],
                "responses": {
                    "200": _json(models.DeadLetterLogView, "The actions"),
                    **_errors(400),
                },
            }
        },
        "/health": {
            "get": {
                "operationId": "health",
                "summary": "Whether the app can work",
                "description": "Checked cheaply on each call: the settings loaded (the app "
                "would not have started otherwise), the orders table answers (one point read "
                "of a row that never exists), Service Bus answers (one peek of the alerts "
                "queue). 200 when all pass, 503 when one fails; each check says why.",
                "tags": ["meta"],
                "responses": {
                    "200": _json(models.HealthView, "Every check passed"),
                    "503": _json(models.HealthView, "A check failed"),
                },
            }
        },
        "/purge": {
            "post": {
                "operationId": "purge",
                "summary": "Archive, then delete, finished orders past an age",
                "description": "Processed orders, and Error orders once resolved (their "
                "terminal alert acknowledged after they last entered Error), last changed "
                "more than `older_than_days` ago (default: the RETENTION_DAYS setting). Each "
                "is appended to the day's archive blob, then its rows are deleted in Table "
                "transactions conditional on the ETag it was read with: one that changed "
                "meanwhile is skipped untouched (`skipped_changed`). Orders in flight, "
                "unresolved Errors and orders that may still owe their final messages are "
                "never purged. `dry_run` only counts. Non-dry runs are recorded (GET /purge). "
                "One call examines at most `limit` candidates and stops after 60 s; `more` "
                "says whether to call again.",
                "tags": ["retention"],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref(models.PurgeBody)}},
                },
                "responses": {
                    "200": _json(models.PurgeView, "What the run did"),
                    **_errors(400, 413),
                },
            },
            "get": {
                "operationId": "listPurgeRuns",
                "summary": "Recorded purge runs (the timer's and operators'), newest first",
                "tags": ["retention"],
                "parameters": [
                    _query(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 20},
                        "Runs to show",
                    )
                ],
                "responses": {"200": _json(models.PurgeRunsView, "The runs"), **_errors(400)},
            },
        },
        "/archive/{order_id}": {
            "get": {
                "operationId": "showArchivedOrder",
                "summary": "A purged order, read back from the archive",
                "description": "Searches the archive's day blobs, newest first (or only "
                "`day`). An order archived more than once (a purge retried after a crash) is "
                "shown once: its latest copy.",
                "tags": ["retention"],
                "parameters": [
                    _ORDER_ID,
                    _query(
                        "day",
                        {"type": "string", "format": "date"},
                        "Only the archive of this day (UTC, YYYY-MM-DD)",
                    ),
                ],
                "responses": {
                    "200": _json(models.ArchivedOrderView, "The archived order"),
                    **_errors(400, 404, 409),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "tags": ["meta"],
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1 document",
                        "content": {"application/json": {}},
                    }
                },
            }
        },
    }


def _bulk(action: str, states: str) -> dict[str, Any]:
    return {
        "post": {
            "operationId": f"bulk{action.title()}",
            "summary": f"{action.title()} the orders a filter selects",
            "description": f"Selects {states} orders by state, current step, age and text (at "
            "least one filter), at most `limit`; a dry run only lists them. Give `order_ids` "
            "(what a dry run listed) to act only on those, each only if it still matches. "
            f"Each is acted on as POST /orders/{{order_id}}/{action} is, with its own "
            "outcome. `more`: more orders match, run it again.",
            "tags": ["orders"],
            "requestBody": _body(models.BulkRequest),
            "responses": {
                "200": _json(models.BulkView, "What was done to each order"),
                **_errors(400, 413),
            },
        }
    }


def _dead_letter_action(action: str, summary: str, description: str) -> dict[str, Any]:
    return {
        "post": {
            "operationId": f"{action}DeadLetters",
            "summary": summary,
            "description": description + " Name the dead letters by sequence number, or "
            "`all`; `dry_run` says what would be done. Say why (`reason`, required unless "
            "`dry_run`): it is recorded in the timeline of each order a message names and in "
            "the dead-letter log.",
            "tags": ["dead letters"],
            "parameters": [_QUEUE],
            "requestBody": _body(models.DeadLetterActionRequest),
            "responses": {
                "200": _json(models.DeadLetterActionView, "What became of each"),
                **_errors(400, 404, 413),
            },
        }
    }


@functools.cache
def openapi_document() -> dict[str, Any]:
    _, schemas = models_json_schema(
        [(m, "validation" if m in _REQUESTS else "serialization") for m in _MODELS],
        ref_template=_REF,
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Order processing operator API",
            "version": VERSION,
            "description": "Watch and repair orders of the Scheduler Agent Supervisor app: list "
            "orders by state and filter, inspect and watch one, resubmit, restart or cancel it "
            "or many, read and acknowledge alerts, read, replay and purge dead letters, purge "
            "finished orders and read them back from the archive, check the app's health. "
            "Every call needs a function key.",
        },
        "servers": [{"url": "/api"}],
        "security": [{"functionKeyHeader": []}, {"functionKeyQuery": []}],
        "paths": _paths(),
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {
                "functionKeyHeader": {"type": "apiKey", "in": "header", "name": "x-functions-key"},
                "functionKeyQuery": {"type": "apiKey", "in": "query", "name": "code"},
            },
        },
    }
