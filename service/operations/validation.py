"""Reading what an operator gives every action: who they are, why, which order or message, how
many. Each refusal is an :class:`~service.operations.errors.InvalidRequest` saying what is wrong.
"""

from __future__ import annotations

from typing import Any, Final

from domain import ids
from service.operations.errors import InvalidRequest

MAX_REASON_CHARS: Final = 1024
MAX_SEQUENCE: Final = 2**63 - 1


def operator_actor(operator: str) -> str:
    """``operator:<name>``, the actor recorded for an operator's action."""
    if not isinstance(operator, str) or not operator.strip():
        raise InvalidRequest("invalid_operator", "say who you are: operator is required")
    try:
        name = ids.validate_instance_id(operator.strip(), "operator")
    except ids.InvalidId as exc:
        raise InvalidRequest("invalid_operator", str(exc)) from None
    return name if name.startswith("operator:") else f"operator:{name}"


def order_id(value: Any) -> str:
    try:
        return ids.validate_order_id(value)
    except ids.InvalidId as exc:
        raise InvalidRequest("invalid_order_id", str(exc)) from None


def reason(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest("invalid_reason", "say why: reason is required")
    if len(value) > MAX_REASON_CHARS:
        raise InvalidRequest("invalid_reason", f"reason is over {MAX_REASON_CHARS} characters")
    return value.strip()


def dry_run(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest("invalid_request", "dry_run must be true or false")
    return value


def check_limit(value: Any, maximum: int, *, name: str = "limit") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidRequest("invalid_limit", f"{name} must be an integer from 1 to {maximum}")


def sequence(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SEQUENCE:
        raise InvalidRequest(
            "invalid_sequence_number", "an alert is named by its sequence number, an integer >= 1"
        )
    return value


def sequence_cursor(value: str | None) -> int:
    """The sequence number a peek starts from, read from a listing's continuation."""
    if value is None:
        return 1
    if not isinstance(value, str) or not value.isascii() or not value.isdigit() or len(value) > 19:
        raise InvalidRequest(
            "invalid_continuation", "continuation is not one returned by this listing"
        )
    return sequence(int(value))
