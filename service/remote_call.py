"""The remote client's policy, rules and per-call state (no I/O): ``RetryPolicy``, its
constants and the failures that end an attempt.

The underscored names are the client's internals, kept under the names it has always used;
``service.remote_calls`` imports the public ones back, so ``service.remote_calls.RetryPolicy``
and the like keep working.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

IDEMPOTENCY_HEADER = "Idempotency-Key"
_OPERATION = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
_KEY = re.compile(r"^[!-~]{1,255}$")  # visible ASCII: safe in a header, same rule as the fakes
UNDOES_FIELD = "undoes"
NOTHING_TO_UNDO = "nothing_to_undo"
MIN_DEFER_SECONDS = 0.5
"""A deferred call is retried no sooner than this, even when the breaker's trial is due now."""


@dataclass(frozen=True)
class RetryPolicy:
    """How hard one call tries. All times in seconds.

    ``max_attempts``: attempts per call (None: as many as fit before complete-by).
    ``attempt_timeout``: upper bound for one attempt (cut to the time left).
    ``backoff_initial`` / ``backoff_max``: full jitter, the n-th wait is
    uniform(0, min(backoff_max, backoff_initial * 2 ** (n - 1))).
    ``min_attempt_time``: an attempt is not started with less time than this left.
    ``max_response_bytes``: larger answers are refused.
    """

    max_attempts: int | None = 5
    attempt_timeout: float = 10.0
    backoff_initial: float = 0.2
    backoff_max: float = 10.0
    min_attempt_time: float = 0.05
    max_response_bytes: int = 1_048_576

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1 (or None)")
        if self.attempt_timeout <= 0 or self.min_attempt_time <= 0:
            raise ValueError("attempt_timeout and min_attempt_time must be positive")
        if self.backoff_initial < 0 or self.backoff_max < self.backoff_initial:
            raise ValueError("need 0 <= backoff_initial <= backoff_max")
        if self.max_response_bytes < 1:
            raise ValueError("max_response_bytes must be positive")


class _TransientFailure(Exception):
    """One attempt failed in a way that a later attempt may not."""

    def __init__(self, code: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retry_after = retry_after


class _CircuitOpen(Exception):
    pass


class _NoTimeLeft(Exception):
    pass


@dataclass
class _CallState:
    operation: str
    key: str
    complete_by: datetime
    undoes: str | None = None
    attempts: int = 0
    last_error: str | None = None
    stopped_by_deadline: bool = False
    stopped_by_circuit: bool = False


def _utc_now() -> datetime:
    return datetime.now(UTC)
