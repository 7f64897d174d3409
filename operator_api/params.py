"""The operator API's query and path parameters: one pydantic model per route says each
parameter's name, type, default and description; :func:`read` validates a request's
parameters with it and :func:`operator_api.openapi.parameters` describes them from it.

A field's name is the use case's keyword (``after_seq``), its alias the URL's (``after``); a
field named in the route's path (``{order_id}``) is a path parameter. The HTTP layer checks
only the form of a value (an integer, a number, true or false, present); what a value may be
(a state, a page size in range, an age) is the use case's to refuse, with its own message:
such bounds are in ``json_schema_extra``, stated for the document and not enforced here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Final, TypeVar

import azure.functions as func
from pydantic import BaseModel, BeforeValidator, Field, ValidationError
from pydantic_core import PydanticCustomError

from adapters.settings import QUEUE_SETTINGS
from domain.ids import ID_MAX_LENGTH
from service.operations.errors import InvalidRequest

P = TypeVar("P", bound=BaseModel)

_INTEGER: Final = re.compile(r"-?[0-9]{1,18}", re.ASCII)
_NUMBER: Final = re.compile(r"[0-9]{1,4}(\.[0-9]{1,3})?", re.ASCII)
_BOOLEANS: Final = {"true": True, "1": True, "false": False, "0": False}
AGE: Final = "^[0-9]{1,9}[smhd]?$"
"""The form of an age the use cases read (90s, 15m, 2h, 7d), for the document."""


def read(req: func.HttpRequest, model: type[P]) -> dict[str, Any]:
    """The route's parameters, by the use case's keywords, or :class:`InvalidRequest` naming
    the first one that is wrong."""
    try:
        return dict(model.model_validate({**req.params, **req.route_params}))
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        problem = "is required" if error["type"] == "missing" else error["msg"]
        raise InvalidRequest(
            "invalid_request", f"query parameter {error['loc'][0]!r} {problem}"
        ) from None


def _matching(pattern: re.Pattern[str], form: str) -> Callable[[object], object]:
    def check(value: object) -> object:
        if not isinstance(value, str):
            return value
        if not pattern.fullmatch(value.strip()):
            raise PydanticCustomError("invalid_request", f"must be {form}")
        return value.strip()

    return check


def _boolean(value: object) -> object:
    if isinstance(value, str):
        if value.strip().lower() not in _BOOLEANS:
            raise PydanticCustomError("invalid_request", "must be true or false")
        return _BOOLEANS[value.strip().lower()]
    return value


def _present(value: object) -> object:
    if value == "":
        raise PydanticCustomError("missing", "is required")
    return value


def _sequence_number(value: object) -> object:
    text = str(value)
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        raise InvalidRequest(
            "invalid_sequence_number",
            f"{text[:40]!r} is not an alert sequence number (an integer >= 1)",
        )
    return text


def param(default: Any, description: str, *, alias: str | None = None, **schema: Any) -> Any:
    """A parameter's default (``...``: none, it must be given), description and URL name
    (``alias``); ``schema``: what the document adds to its type (bounds, an enum, a pattern),
    stated for callers and not enforced here (see the module docstring)."""
    return Field(default, alias=alias, description=description, json_schema_extra=schema or None)


Integer = Annotated[int, BeforeValidator(_matching(_INTEGER, "an integer"))]
Number = Annotated[float, BeforeValidator(_matching(_NUMBER, "a number"))]
Boolean = Annotated[bool, BeforeValidator(_boolean)]
Present = Annotated[str, BeforeValidator(_present)]
"""A string that must be given, and not empty."""
Continuation = Annotated[str | None, param(None, "The `continuation` of the previous page")]


class OrderPath(BaseModel):
    order_id: str = param(
        ..., "Order id", pattern=f"^[A-Za-z0-9][A-Za-z0-9_-]{{0,{ID_MAX_LENGTH - 1}}}$"
    )


class AlertPath(BaseModel):
    sequence_number: Annotated[int, BeforeValidator(_sequence_number)] = param(
        ..., "The alert's sequence number in the alerts queue", minimum=1
    )


class QueuePath(BaseModel):
    queue: str = param(..., "The queue's role", enum=list(QUEUE_SETTINGS))
