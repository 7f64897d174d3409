"""The agent's remote client over :mod:`adapters.remote_http` (aiohttp) instead of httpx: the
same retries, circuit breaker and deadline (:class:`agent.aio.remote_client.RemoteServiceClient`,
whose attempts this only carries differently), each attempt one traced POST through the
worker's shared session, bounded by the service's settings.

Async only, beside the client the app runs today; the restructuring folds the two into one
when the app moves onto adapters/ (the httpx form and its generated sync twin then go).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime
from typing import Any

from adapters.remote_http import AnswerTooLarge, CallFailed, CallTimedOut, RemoteHttp
from agent.aio.remote_client import RemoteServiceClient
from agent.circuit import CircuitBreaker
from agent.outcomes import Failed, NothingToUndo, Succeeded
from agent.remote_call import (
    IDEMPOTENCY_HEADER,
    RetryPolicy,
    _CallState,
    _TransientFailure,
    _utc_now,
)
from core.aio import primitives


class RemoteHttpClient(RemoteServiceClient):
    """Calls one remote service through the worker's :class:`RemoteHttp`."""

    def __init__(
        self,
        service: str,
        http: RemoteHttp,
        breaker: CircuitBreaker | None = None,
        *,
        policy: RetryPolicy | None = None,
        now: Callable[[], datetime] = _utc_now,
        sleep: Callable[[float], Any] = primitives.sleep,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(
            service, http.base_url(service), None, breaker,  # type: ignore[arg-type]
            policy=policy, now=now, sleep=sleep, rng=rng,
        )  # fmt: skip
        self._remote = http

    async def _exchange(
        self, state: _CallState, body: bytes, timeout: float
    ) -> Succeeded | NothingToUndo | Failed:
        headers = {
            IDEMPOTENCY_HEADER: state.key,
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        try:
            answer = await self._remote.post(
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
