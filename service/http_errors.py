"""Reading a remote service's HTTP answer: transient statuses, error details, Retry-After."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

# 408 and 429 are the only 4xx statuses that say "try again later"; every 5xx may pass.
_TRANSIENT_4XX = frozenset({408, 429})
_MAX_MESSAGE = 500


def is_transient_status(status: int) -> bool:
    return status >= 500 or status in _TRANSIENT_4XX


def error_details(status: int, body: bytes) -> tuple[str, str]:
    """``(code, message)`` from ``{"error": {"code", "message"}}`` or, failing that, the text."""
    fallback_code = f"http_{status}"
    text = body.decode("utf-8", errors="replace").strip()
    try:
        parsed = json.loads(text) if text else None
    except ValueError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        code, message = error.get("code"), error.get("message")
        return (
            code if isinstance(code, str) and code else fallback_code,
            _clip(message if isinstance(message, str) else json.dumps(error)),
        )
    return fallback_code, _clip(text) if text else f"HTTP {status} with an empty body"


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date), else None.

    A malformed value is ignored (the caller falls back to its own backoff); a date in the
    past means "now" (0 s).
    """
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; parsedate gives naive for "-0000"
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 1] + "…"
