"""agent.remote_http_client: the agent's remote client with its attempts on adapters.remote_http
(aiohttp). The retries, breaker and deadline are agent.aio.remote_client's, tested there
against httpx.MockTransport; here what the attempts carry is tested against real servers, the
cases of tests/unit/test_remote_client_aio.py that depend on the HTTP under them: the request,
retries and Retry-After, refusals, the answer's size (decoded) and time, a hung or unreachable
service, and one effect at the fake services however often a call is retried."""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from adapters.remote_http import RemoteHttp, RemoteService
from agent.circuit import BreakerSettings, CircuitBreaker
from agent.outcomes import CallOutcome, DeadlinePassed, Deferred, Failed, NothingToUndo, Succeeded
from agent.remote_call import RetryPolicy
from agent.remote_http_client import RemoteHttpClient
from devstack.fakes.remote_services import FakeServices
from tests.support.scripted_http import Reply, Script, ScriptedServer, answer

pytestmark = pytest.mark.anyio

FAST = RetryPolicy(max_attempts=None, attempt_timeout=5.0, backoff_initial=0.01, backoff_max=0.05)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], Any]]:
    servers: list[ScriptedServer] = []

    async def start(script: Script) -> ScriptedServer:
        server = await ScriptedServer(script).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


class Calls:
    """A client of ``payment`` at ``origin``, recording its waits instead of sleeping them
    (``real_waits``: sleeping them too)."""

    def __init__(
        self, origin: str, policy: RetryPolicy = FAST, *, real_waits: bool = False, **breaker: float
    ) -> None:
        self.http = RemoteHttp([RemoteService("payment", f"{origin}/payment")])
        self.waits: list[float] = []
        self._real_waits = real_waits
        self.client = RemoteHttpClient(
            "payment",
            self.http,
            CircuitBreaker("payment", BreakerSettings(**{"failure_threshold": 1000, **breaker})),
            policy=policy,
            sleep=self._sleep,
            rng=random.Random(7),
        )

    async def _sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self._real_waits:
            await asyncio.sleep(seconds)

    async def charge(self, order: str = "order-1", budget: float = 10.0) -> CallOutcome:
        deadline = datetime.now(UTC) + timedelta(seconds=budget)
        try:
            return await self.client.call(
                "charge", {"order_id": order, "amount": 25}, f"{order}:charge", deadline
            )
        finally:
            await self.http.close()


def replies(*answers: bytes) -> Script:
    return lambda request, n: (answers[min(n, len(answers)) - 1], False)


def ok(**result: object) -> bytes:
    return answer(200, json.dumps(result or {"charge_id": "ch-1"}).encode())


def error(status: int, code: str, **headers: str) -> bytes:
    body = json.dumps({"error": {"code": code, "message": "m"}}).encode()
    return answer(status, body, {"Content-Type": "application/json", **headers})


async def test_a_503_is_retried_with_the_same_request_until_it_succeeds(serve) -> None:
    server = await serve(replies(error(503, "busy"), ok()))
    outcome = await Calls(server.origin).charge()
    assert outcome == Succeeded({"charge_id": "ch-1"}, attempts=2)
    assert without_trace(server.requests[0]) == without_trace(server.requests[1])
    assert server.requests[0].startswith(b"POST /payment/charge HTTP/1.1\r\n")
    assert server.headers(1)["idempotency-key"] == "order-1:charge"
    assert server.headers(1)["content-type"] == "application/json"


def without_trace(request: bytes) -> bytes:
    """The request but its trace context (each attempt is a span of its own, when a tracer
    provider records them)."""
    return b"\r\n".join(
        line for line in request.split(b"\r\n") if not line.lower().startswith(b"traceparent:")
    )


async def test_retry_after_is_honoured(serve) -> None:
    server = await serve(replies(error(429, "slow_down", **{"Retry-After": "3"}), ok()))
    calls = Calls(server.origin)
    assert isinstance(await calls.charge(), Succeeded)
    assert calls.waits == [3.0]


async def test_a_decline_is_not_retried(serve) -> None:
    server = await serve(replies(error(402, "card_declined")))
    outcome = await Calls(server.origin).charge()
    assert outcome == Failed("card_declined", "m", transient=False, attempts=1)
    assert server.methods() == ["POST"]


async def test_an_answer_too_large_is_a_transient_failure(serve) -> None:
    server = await serve(replies(answer(200, b"{" + b" " * 100 + b"}")))
    policy = RetryPolicy(max_attempts=2, backoff_initial=0.1, max_response_bytes=100)
    outcome = await Calls(server.origin, policy).charge()
    assert isinstance(outcome, Failed) and outcome.code == "response_too_large"
    assert outcome.transient and outcome.attempts == 2


async def test_the_size_bound_counts_the_decoded_answer_not_the_compressed_one(serve) -> None:
    body = b"{" + b" " * 10_000 + b"}"
    packed = answer(200, gzip.compress(body), {"Content-Encoding": "gzip"})
    server = await serve(replies(packed))
    outcome = await Calls(
        server.origin, RetryPolicy(max_attempts=1, max_response_bytes=1_000)
    ).charge()
    assert isinstance(outcome, Failed) and outcome.code == "response_too_large"
    fits = await Calls(server.origin, RetryPolicy(max_response_bytes=len(body))).charge()
    assert fits == Succeeded({}, attempts=1)


async def test_an_attempt_that_times_out_sends_one_post_and_the_next_attempt_another(
    serve,
) -> None:
    async def script(request: bytes, n: int) -> Reply:
        if n == 1:
            await asyncio.sleep(1.5)
        return ok(charge_id=f"ch-{n}"), False

    server = await serve(script)
    policy = RetryPolicy(max_attempts=2, attempt_timeout=1.0, backoff_initial=0.01)
    outcome = await Calls(server.origin, policy).charge()
    assert outcome == Succeeded({"charge_id": "ch-2"}, attempts=2)
    await asyncio.sleep(0.7)
    assert server.methods() == ["POST", "POST"]  # one per attempt, none resent under it


# ---------------------------------------------------------------------- the fake services


@pytest.fixture
def fakes() -> Iterator[FakeServices]:
    with FakeServices.start(seed=3) as running:
        yield running


def fake_calls(fakes: FakeServices, **breaker: float) -> Calls:
    return Calls(fakes.url("payment").rsplit("/payment", 1)[0], real_waits=True, **breaker)


async def test_real_transient_faults_are_retried_to_exactly_one_effect(fakes) -> None:
    fakes.set_profile({"services": {"payment": {"fail_first_n": 3}}})
    outcome = await fake_calls(fakes).charge()
    assert isinstance(outcome, Succeeded) and outcome.attempts == 4
    assert [e["idempotency_key"] for e in fakes.ledger()] == ["order-1:charge"]


async def test_real_hang_is_bounded_by_the_deadline_without_blocking_the_loop(fakes) -> None:
    fakes.set_profile({"default": {"hang_rate": 1.0, "hang_seconds": 30}})
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    ticking = asyncio.ensure_future(ticker())
    started = time.monotonic()
    outcome = await fake_calls(fakes).charge(budget=1.0)
    elapsed = time.monotonic() - started
    ticking.cancel()
    assert isinstance(outcome, DeadlinePassed) and "timeout" in (outcome.last_error or "")
    assert 0.9 <= elapsed < 1.5
    assert ticks >= 10
    assert fakes.ledger() == []


async def test_real_undo_and_refusal(fakes) -> None:
    fakes.set_profile({"services": {"payment": {"decline_order_ids": ["order-9"]}}})
    calls = fake_calls(fakes)
    declined = await calls.charge("order-9")
    undo = await calls.client.call(
        "refund",
        {"order_id": "order-2", "amount": 10},
        "order-2:refund",
        datetime.now(UTC) + timedelta(seconds=10),
        undoes="order-2:charge",
    )
    await calls.http.close()
    assert isinstance(declined, Failed)
    assert (declined.code, declined.transient, declined.attempts) == ("card_declined", False, 1)
    assert isinstance(undo, NothingToUndo) and undo.result["undoes"] == "order-2:charge"
    assert fakes.ledger() == []


async def test_real_unreachable_service_defers_once_the_circuit_opens() -> None:
    with FakeServices.start() as gone:
        origin = gone.url("payment").rsplit("/payment", 1)[0]
    calls = Calls(origin, real_waits=True, failure_threshold=3)
    before = datetime.now(UTC)
    outcome = await calls.charge(budget=5.0)
    assert isinstance(outcome, Deferred) and outcome.attempts == 3
    assert "connection_error" in (outcome.last_error or "")
    assert before + timedelta(seconds=29) < outcome.retry_at < before + timedelta(seconds=31)
