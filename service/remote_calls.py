"""The agent's call to its remote service: retries with backoff, a circuit breaker, a deadline.

One ``call`` POSTs ``{the service's URL}/{operation}`` with a JSON body and an
``Idempotency-Key`` header that stays the same on every attempt, so the service applies the
effect at most once however often the request is repeated. Each attempt is one traced call
through the worker's :class:`adapters.remote_http.RemoteHttp` (its shared aiohttp session,
bounded per service by the settings), which never sends a POST twice itself. An undo also names
the forward call it undoes (``"undoes"`` in the body); the service answers ``{"status":
"nothing_to_undo"}`` when that call never took effect, which is ``NothingToUndo``
(docs/remote-service-contract.md).

- Transient failures (timeouts, connection errors, an answer over ``max_response_bytes``, 408,
  429, 5xx) are retried by tenacity with exponential backoff and full jitter, or after the
  server's Retry-After when it sends one.
- Every other 4xx is a business refusal: no retry, ``Failed(transient=False)``.
- Nothing runs past ``complete_by``: an attempt's timeout, which bounds the whole exchange
  (waiting for a connection, sending, reading the answer whole), is the smaller of the
  configured one and the time left; no sleep and no attempt starts unless it can end before
  complete-by. When that stops the call, the outcome is ``DeadlinePassed`` (the agent
  reports it as a transient failure: service.agent.out_of_time).
- The per-service circuit breaker counts only transient failures; while it is open, a call is
  not attempted (or, if the circuit opens between its attempts, not attempted again) and the
  outcome is ``Deferred(retry_at)``: the time of the breaker's next trial, at least
  ``MIN_DEFER_SECONDS`` away. Only a call with no definitive answer is ever deferred.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    retry_if_exception_type,
    wait_exponential,
)

from adapters.remote_http import AnswerTooLarge, CallFailed, CallTimedOut, RemoteHttp
from domain.messages import utc_now
from service.circuit import BreakerState, CircuitBreaker
from service.http_errors import error_details, is_transient_status, parse_retry_after
from service.outcomes import CallOutcome, DeadlinePassed, Deferred, Failed, NothingToUndo, Succeeded

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


log = logging.getLogger("service.remote_calls")


class RemoteServiceClient:
    """Calls one remote service through ``http``, which knows its URL and limits; safe to share
    between the tasks of one event loop (state lives per call)."""

    def __init__(
        self,
        service: str,
        http: RemoteHttp,
        breaker: CircuitBreaker,
        *,
        policy: RetryPolicy | None = None,
        now: Callable[[], datetime] = utc_now,
        sleep: Callable[[float], Any] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.service = service
        self.policy = policy or RetryPolicy()
        self.breaker = breaker
        self._http = http
        self._now = now
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._backoff = wait_exponential(
            multiplier=self.policy.backoff_initial, max=self.policy.backoff_max
        )

    async def call(
        self,
        operation: str,
        payload: Mapping[str, Any],
        idempotency_key: str,
        complete_by: datetime,
        *,
        undoes: str | None = None,
    ) -> CallOutcome:
        """Run ``operation`` until it succeeds, is refused, or complete-by stops it.

        ``undoes``: for an undo, the Idempotency-Key of the forward call it undoes; it is added
        to the body as ``"undoes"``.

        Raises ValueError for arguments that no attempt could fix (naive ``complete_by``, bad
        operation name or key, a payload that is not JSON); every remote failure is an outcome.
        """
        if complete_by.tzinfo is None:
            raise ValueError("complete_by must be timezone-aware")
        if not _OPERATION.match(operation):
            raise ValueError(f"invalid operation name {operation!r}")
        if not _KEY.match(idempotency_key):
            raise ValueError("idempotency_key must be 1-255 visible ASCII characters, no spaces")
        fields = dict(payload)
        if undoes is not None:
            if not _KEY.match(undoes) or undoes == idempotency_key:
                raise ValueError(
                    "undoes must be the forward call's idempotency key (1-255 visible ASCII "
                    "characters, no spaces), not the undo's own"
                )
            if fields.get(UNDOES_FIELD, undoes) != undoes:
                raise ValueError("the payload's 'undoes' differs from the undoes argument")
            fields[UNDOES_FIELD] = undoes
        body = json.dumps(fields, separators=(",", ":"), allow_nan=False).encode()
        state = _CallState(operation, idempotency_key, complete_by, undoes)
        outcome = await self._run(state, body)
        self._log_outcome(state, outcome)
        return outcome

    async def _run(self, state: _CallState, body: bytes) -> CallOutcome:
        retrying = AsyncRetrying(
            sleep=self._sleep,
            stop=lambda rs: self._should_stop(state, rs),
            wait=self._wait,
            retry=retry_if_exception_type(_TransientFailure),
            reraise=False,
        )
        try:
            return await retrying(self._attempt, state, body)
        except RetryError as stopped:  # out of attempts
            failure = stopped.last_attempt.exception()
            if not isinstance(failure, _TransientFailure):  # only these are retried
                raise TypeError("retry stopped on an unexpected outcome") from stopped
            return Failed(failure.code, failure.message, transient=True, attempts=state.attempts)
        except _NoTimeLeft:
            return DeadlinePassed(state.last_error, state.attempts)
        except _CircuitOpen:
            return self._deferred(state)

    def _deferred(self, state: _CallState) -> Deferred | DeadlinePassed:
        """Every attempt so far (maybe none) failed transiently and the circuit is open.

        Past complete-by there is nothing to defer: the attempt's time is over.
        """
        if self._time_left(state.complete_by) <= 0:
            return DeadlinePassed(state.last_error, state.attempts)
        wait = max(MIN_DEFER_SECONDS, self.breaker.retry_in())
        return Deferred(self._now() + timedelta(seconds=wait), state.attempts, state.last_error)

    def _time_left(self, complete_by: datetime) -> float:
        return (complete_by - self._now()).total_seconds()

    def _should_stop(self, state: _CallState, rs: RetryCallState) -> bool:
        """Whether to stop retrying after a transient failure: True when out of attempts; when the
        circuit is open or no attempt would fit before complete-by, it raises what :meth:`_run`
        turns into the outcome, as when that stops a first attempt (:meth:`_attempt`)."""
        if self.breaker.state is BreakerState.OPEN:  # opened by this call or another: defer now
            raise _CircuitOpen
        if self.policy.max_attempts is not None and rs.attempt_number >= self.policy.max_attempts:
            return True
        if rs.upcoming_sleep + self.policy.min_attempt_time > self._time_left(state.complete_by):
            raise _NoTimeLeft
        return False

    def _wait(self, rs: RetryCallState) -> float:
        failure = rs.outcome.exception() if rs.outcome is not None else None
        if isinstance(failure, _TransientFailure) and failure.retry_after is not None:
            return failure.retry_after
        return self._rng.uniform(0.0, self._backoff(rs))

    async def _attempt(self, state: _CallState, body: bytes) -> CallOutcome:
        left = self._time_left(state.complete_by)
        if left < self.policy.min_attempt_time:
            raise _NoTimeLeft
        if not self.breaker.acquire():
            raise _CircuitOpen
        state.attempts += 1
        timeout = min(self.policy.attempt_timeout, left)
        started = time.monotonic()
        try:
            outcome = await self._exchange(state, body, timeout)
        except _TransientFailure as failure:
            self.breaker.record_failure()
            state.last_error = str(failure)
            self._log_attempt(state, timeout, started, f"transient {failure}")
            raise
        except BaseException:
            self.breaker.release()
            raise
        # A refusal is a healthy service answering: only transient failures trip the breaker.
        self.breaker.record_success()
        match outcome:
            case Succeeded():
                result = "ok"
            case NothingToUndo():
                result = "nothing to undo"
            case Failed(code=code):
                result = f"refused {code}"
        self._log_attempt(state, timeout, started, result)
        return outcome

    async def _exchange(
        self, state: _CallState, body: bytes, timeout: float
    ) -> Succeeded | NothingToUndo | Failed:
        headers = {
            IDEMPOTENCY_HEADER: state.key,
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        try:
            answer = await self._http.post(
                self.service,
                state.operation,
                body,
                headers,
                timeout=timeout,
                max_answer_bytes=self.policy.max_response_bytes,
            )
        except CallTimedOut as exc:
            raise _TransientFailure("timeout", str(exc)) from exc
        except AnswerTooLarge as exc:
            raise _TransientFailure("response_too_large", str(exc)) from exc
        except CallFailed as exc:
            raise _TransientFailure("connection_error", str(exc)) from exc
        return self._answered(answer.status, answer.body, answer.headers.get("Retry-After"), state)

    def _answered(
        self, status: int, data: bytes, retry_after: str | None, state: _CallState
    ) -> Succeeded | NothingToUndo | Failed:
        """What a whole answer means: a success, a refusal, or (raised) a transient failure
        to retry, after the server's ``Retry-After`` when it sends one."""
        if 200 <= status < 300:
            return self._success(status, data, state)
        code, message = error_details(status, data)
        if is_transient_status(status):
            raise _TransientFailure(code, message, parse_retry_after(retry_after, self._now()))
        return Failed(code, message, transient=False, attempts=state.attempts)

    @staticmethod
    def _success(status: int, data: bytes, state: _CallState) -> Succeeded | NothingToUndo | Failed:
        attempts = state.attempts
        if not data.strip():
            return Succeeded({}, attempts)
        try:
            result = json.loads(data)
        except ValueError:
            result = None
        if not isinstance(result, dict):
            return Failed(
                "invalid_response",
                f"HTTP {status} body is not a JSON object",
                transient=False,
                attempts=attempts,
            )
        if state.undoes is not None and result.get("status") == NOTHING_TO_UNDO:
            return NothingToUndo(result, attempts)
        return Succeeded(result, attempts)

    def _log_attempt(self, state: _CallState, timeout: float, started: float, result: str) -> None:
        log.debug(
            "remote attempt service=%s operation=%s key=%s attempt=%d timeout=%.3fs "
            "elapsed=%.3fs result=%s",
            self.service,
            state.operation,
            state.key,
            state.attempts,
            timeout,
            time.monotonic() - started,
            result,
        )

    def _log_outcome(self, state: _CallState, outcome: CallOutcome) -> None:
        match outcome:
            case Succeeded():
                detail = "succeeded"
            case NothingToUndo():
                detail = "nothing_to_undo"
            case Failed(code=code, transient=transient):
                detail = f"failed code={code} transient={transient}"
            case Deferred(retry_at=retry_at, last_error=last_error):
                detail = f"deferred retry_at={retry_at.isoformat()} last_error={last_error}"
            case DeadlinePassed(last_error=last_error):
                detail = f"deadline_passed last_error={last_error}"
        log.info(
            "remote call service=%s operation=%s key=%s attempts=%d outcome=%s",
            self.service,
            state.operation,
            state.key,
            state.attempts,
            detail,
        )
