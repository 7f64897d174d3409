"""What the operator listings take, as the operator API reads it from a URL's query: one model
per listing (the use case's keywords as fields, the URL's names as aliases), with each
parameter's description for the API's document, and the forms a value from a URL may take.

The models check only the form of a value (an integer, a number, true or false, present); what
a value may be (a state, a page size in range, an age) is the use case's to refuse, with its
own message: such bounds are in ``json_schema_extra``, stated for the document and not
enforced here. Request bodies are in :mod:`service.operations.models`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final

from pydantic import BaseModel, BeforeValidator, Field
from pydantic_core import PydanticCustomError

from domain.ids import ID_MAX_LENGTH
from service.listing import LISTABLE_STATES, MAX_LIMIT, SORTS
from service.operations.dead_letter_log import MAX_RECENT
from service.operations.errors import InvalidRequest

_INTEGER: Final = re.compile(r"-?[0-9]{1,18}", re.ASCII)
_NUMBER: Final = re.compile(r"[0-9]{1,4}(\.[0-9]{1,3})?", re.ASCII)
_BOOLEANS: Final = {"true": True, "1": True, "false": False, "0": False}
AGE: Final = "^[0-9]{1,9}[smhd]?$"
"""The form of an age the use cases read (90s, 15m, 2h, 7d), for the document."""


def _matching(pattern: re.Pattern[str], form: str) -> BeforeValidator:
    def check(value: object) -> object:
        if not isinstance(value, str):
            return value
        if not pattern.fullmatch(value.strip()):
            raise PydanticCustomError("invalid_request", f"must be {form}")
        return value.strip()

    return BeforeValidator(check)


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


def alert_sequence(value: object) -> object:
    text = str(value)
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        raise InvalidRequest(
            "invalid_sequence_number",
            f"{text[:40]!r} is not an alert sequence number (an integer >= 1)",
        )
    return text


def param(default: Any, description: str, *, alias: str | None = None, **schema: Any) -> Any:
    """A query parameter's default (``...``: none, it must be given), description and URL name
    (``alias``); ``schema``: what the document adds to its type (bounds, an enum, a pattern),
    stated for callers and not enforced here (see the module docstring)."""
    return Field(default, alias=alias, description=description, json_schema_extra=schema or None)


Integer = Annotated[int, _matching(_INTEGER, "an integer")]
Number = Annotated[float, _matching(_NUMBER, "a number")]
Boolean = Annotated[bool, BeforeValidator(_boolean)]
Present = Annotated[str, BeforeValidator(_present)]
"""A string that must be given, and not empty."""
Continuation = Annotated[str | None, param(None, "The `continuation` of the previous page")]

ORDER_ID_FORM: Final = f"^[A-Za-z0-9][A-Za-z0-9_-]{{0,{ID_MAX_LENGTH - 1}}}$"


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


class ShowOrder(BaseModel):
    timeline_after: Integer = param(
        -1, "Show timeline entries after this sequence number", minimum=-1
    )
    timeline_limit: Integer = param(200, "Timeline entries per page", minimum=1, maximum=1000)


class WatchOrder(BaseModel):
    after_seq: Integer = param(-1, "The last timeline entry seen", alias="after", minimum=-1)
    wait_s: Number = param(
        20.0, "Seconds to wait for a change", alias="wait", minimum=0, maximum=60
    )


class ListAlerts(BaseModel):
    limit: Integer = param(50, "Page size", minimum=1, maximum=MAX_LIMIT)
    continuation: Continuation = None
    open_only: Boolean = param(False, "Only alerts still open or retrying", alias="open")


class DeadLetterCounts(BaseModel):
    limit: Integer = param(100, "Page size", minimum=1, maximum=MAX_LIMIT)


class ListDeadLetters(BaseModel):
    limit: Integer = param(50, "Page size", minimum=1, maximum=MAX_LIMIT)
    continuation: Continuation = None


class DeadLetterLog(BaseModel):
    limit: Integer = param(20, "Actions to show", minimum=1, maximum=MAX_RECENT)


class PurgeRuns(BaseModel):
    limit: Integer = param(20, "Runs to show", minimum=1, maximum=MAX_LIMIT)


class ArchivedOrder(BaseModel):
    day: str | None = param(None, "Only the archive of this day (UTC, YYYY-MM-DD)", format="date")
