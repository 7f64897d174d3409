"""Reading the order filters operators give (state, step, age, text, sort) into a
:class:`service.listing.OrderFilter`, refusing what is wrong with a message that says how to
write it. One reading for the HTTP API (query parameters, bodies) and the CLI (options).

Ages are how long ago an order was created: ``90`` or ``90s``, ``15m``, ``2h``, ``7d``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from domain import ids
from domain.states import ProcessState
from domain.workflows import Workflow
from service.listing import MAX_TEXT, SORTS, OrderFilter
from service.operations.errors import InvalidRequest

MAX_AGE: Final = timedelta(days=3650)
_AGE: Final = re.compile(r"([0-9]{1,9})\s*([smhd]?)", re.ASCII)
_UNITS: Final = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True, slots=True)
class Criteria:
    """A filter as given (for showing it back) and as read (for applying it)."""

    shown: dict[str, str]
    where: OrderFilter


def state_of(value: Any) -> ProcessState:
    names = {s.value.lower(): s for s in ProcessState}
    state = names.get(value.strip().lower()) if isinstance(value, str) else None
    if state is None:
        raise InvalidRequest(
            "invalid_state",
            f"state {str(value)[:40]!r} is not one of: {', '.join(s.value for s in ProcessState)}",
        )
    return state


def sort_of(value: Any) -> str:
    if value is None:
        return "index"
    if value not in SORTS:
        raise InvalidRequest(
            "invalid_sort", f"sort {str(value)[:20]!r} is not one of: {', '.join(SORTS)}"
        )
    return str(value)


def age_of(value: Any, name: str) -> timedelta | None:
    """``value`` as an age (None when not given)."""
    if value is None or value == "":
        return None
    match = _AGE.fullmatch(value.strip().lower()) if isinstance(value, str) else None
    age = timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)]) if match else None
    if age is None or not timedelta(0) < age <= MAX_AGE:
        raise InvalidRequest(
            "invalid_age",
            f"{name} {str(value)[:20]!r} is not an age like 90s, 15m, 2h or 7d (at most 3650d)",
        )
    return age


def criteria(
    *,
    now: datetime,
    workflows: Mapping[str, Workflow],
    step: Any = None,
    older_than: Any = None,
    newer_than: Any = None,
    text: Any = None,
) -> Criteria:
    older = age_of(older_than, "older_than")
    newer = age_of(newer_than, "newer_than")
    if older is not None and newer is not None and older >= newer:
        raise InvalidRequest(
            "invalid_age",
            f"older_than {older_than} and newer_than {newer_than} select nothing: an order "
            "older than the first is older than the second too; make newer_than the longer",
        )
    given = {"step": step, "older_than": older_than, "newer_than": newer_than, "text": text}
    shown = {name: str(value) for name, value in given.items() if value not in (None, "")}
    where = OrderFilter(
        step=step_of(step, workflows.values()),
        created_before=now - older if older else None,
        created_after=now - newer if newer else None,
        text=text_of(text),
    )
    return Criteria(shown, where)


def step_of(value: Any, workflows: Iterable[Workflow]) -> str | None:
    if value is None or value == "":
        return None
    known = sorted({name for flow in workflows for name in flow.step_names})
    if not isinstance(value, str) or value not in known:
        raise InvalidRequest(
            "unknown_step", f"no workflow has a step {str(value)[:64]!r}; steps: {', '.join(known)}"
        )
    return value


def text_of(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise InvalidRequest("invalid_text", f"text must be a string of at most {MAX_TEXT} chars")
    return value


def step_name(value: Any) -> str:
    """A step name to restart from (checked against the order's workflow by the lifecycle)."""
    try:
        return ids.validate_name(value, "step")
    except (ids.InvalidId, TypeError):
        shown = "" if value is None else str(value)[:64]
        raise InvalidRequest(
            "invalid_step", f"step {shown!r} is not a step name, e.g. charge_payment"
        ) from None
