"""The OpenAPI 3.1 description of the operator HTTP API, built from what the functions use.

Each function registers its :class:`Operation` as it declares its route
(:func:`operator_api.functions.route`): its parameters are described from the model that reads
them (:mod:`operator_api.params`), its request body and responses from the models it reads and
returns (JSON Schema 2020-12, which OpenAPI 3.1 uses as is), so the description cannot drift
from what the functions do.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from service.operations.models import ErrorBody

VERSION: Final = "1.0.0"
_REF: Final = "#/components/schemas/{model}"
_ERRORS: Final = {
    400: "Invalid input: the message says what to fix",
    404: "Unknown order, alert or queue (or an order not in the archive)",
    409: "The action does not apply to the order or alert as it is now",
    413: "Request body too large",
    503: "Busy: the same request may succeed in a moment",
}


Answer = tuple[type[BaseModel] | None, str]
"""A success: the model of its body (None: JSON of no declared shape) and what it means."""


@dataclass(frozen=True)
class Operation:
    """How the document describes one route: ``responses`` its successes by status, ``errors``
    the statuses of the :class:`ErrorBody` refusals it may answer with (the 401 of the Functions
    host and the 500 of a fault are added to them; a route that lists none describes none),
    ``params`` the model of its parameters, ``body`` that of its request body."""

    operation_id: str
    tag: str
    summary: str
    description: str | None
    responses: dict[int, Answer]
    errors: tuple[int, ...]
    params: type[BaseModel] | None
    body: type[BaseModel] | None


_PATHS: dict[str, dict[str, Operation]] = {}


def describe(method: str, route: str, operation: Operation) -> None:
    _PATHS.setdefault(f"/{route}", {})[method.lower()] = operation


@functools.cache
def openapi_document() -> dict[str, Any]:
    operations = [op for item in _PATHS.values() for op in item.values()]
    bodies = {op.body for op in operations if op.body is not None}
    answers = {m for op in operations for m, _ in op.responses.values() if m is not None}
    _, schemas = models_json_schema(
        [(m, "validation") for m in bodies] + [(m, "serialization") for m in answers | {ErrorBody}],
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
        "paths": {
            path: {method: _operation(path, op) for method, op in item.items()}
            for path, item in _PATHS.items()
        },
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {
                "functionKeyHeader": {"type": "apiKey", "in": "header", "name": "x-functions-key"},
                "functionKeyQuery": {"type": "apiKey", "in": "query", "name": "code"},
            },
        },
    }


def _operation(path: str, op: Operation) -> dict[str, Any]:
    described: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary}
    if op.description is not None:
        described["description"] = op.description
    described["tags"] = [op.tag]
    if op.params is not None:
        described["parameters"] = parameters(op.params, path)
    if op.body is not None:
        described["requestBody"] = {"required": True, "content": _content(op.body)}
    described["responses"] = {
        str(status): {"description": meaning, "content": _content(model)}
        for status, (model, meaning) in op.responses.items()
    } | _errors(op.errors)
    return described


def parameters(model: type[BaseModel], path: str) -> list[dict[str, Any]]:
    """The parameters ``model`` reads, each in the path if ``path`` names it, else in the query."""
    schema = model.model_json_schema(by_alias=True)
    required = set(schema.get("required", ()))
    return [
        {
            "name": name,
            "in": "path" if f"{{{name}}}" in path else "query",
            "required": f"{{{name}}}" in path or name in required,
            "schema": _plain(field),
            "description": field["description"],
        }
        for name, field in schema["properties"].items()
    ]


def _plain(field: dict[str, Any]) -> dict[str, Any]:
    """A field's schema without what belongs to the parameter (title, description) and with
    an optional value's null left out (a query parameter is absent, never null)."""
    schema = {k: v for k, v in field.items() if k not in ("title", "description", "anyOf")}
    for option in field.get("anyOf", ()):
        if option != {"type": "null"}:
            schema |= option
    if schema.get("default", "") is None:
        del schema["default"]
    return schema


def _content(model: type[BaseModel] | None) -> dict[str, Any]:
    schema = {} if model is None else {"schema": {"$ref": _REF.format(model=model.__name__)}}
    return {"application/json": schema}


def _errors(statuses: tuple[int, ...]) -> dict[str, Any]:
    if not statuses:
        return {}
    refusals = {
        str(s): {"description": _ERRORS[s], "content": _content(ErrorBody)} for s in statuses
    }
    return refusals | {
        "401": {"description": "Missing or wrong function key (answered by the Functions host)"},
        "500": {
            "description": "A fault on the server side (logged)",
            "content": _content(ErrorBody),
        },
    }
