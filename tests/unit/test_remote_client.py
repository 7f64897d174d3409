"""RemoteServiceClient (agent.remote_client): retries, refusals, the deadline, undo and the
circuit breaker against httpx.MockTransport on a fake clock (no sockets, no real sleeps), with
every outcome and every wait of a few scenarios pinned; against the real fake services it must
bound a hang by the deadline without ever blocking the event loop, and give up its half-open
trial when cancelled.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import anyio
import httpx
import pytest

from agent.circuit import BreakerSettings, BreakerState, CircuitBreaker, breaker_for
from agent.http_errors import error_details, parse_retry_after
from agent.outcomes import CallOutcome, DeadlinePassed, Deferred, Failed, NothingToUndo, Succeeded
from agent.remote_call import MIN_DEFER_SECONDS, RetryPolicy
from agent.remote_client import RemoteServiceClient
from devstack.fakes.remote_services import FakeServices

pytestmark = pytest.mark.anyio

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
BASE = "http://payment.test/payment"


class FakeClock:
    """Wall clock and monotonic clock in one; ``sleep`` (a coroutine, as the client awaits it)
    advances it and records the wait."""

    def __init__(self) -> None:
        self.current = T0
        self.sleeps: list[float] = []

    def now(self) -> datetime:
        return self.current

    def monotonic(self) -> float:
        return (self.current - T0).total_seconds()

    def advance(self, seconds: float) -> None:
        self.current += timedelta(seconds=seconds)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)


Handler = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]


class Harness:
    def __init__(self, handler: Handler, policy: RetryPolicy | None = None, **breaker: float):
        self.clock = FakeClock()
        self.requests: list[httpx.Request] = []
        self.handler = handler
        self.breaker = CircuitBreaker(
            "payment", BreakerSettings(**breaker), clock=self.clock.monotonic
        )
        self.http = httpx.AsyncClient(transport=httpx.MockTransport(self._handle))
        self.client = RemoteServiceClient(
            "payment",
            BASE,
            self.http,
            self.breaker,
            policy=policy or RetryPolicy(backoff_initial=0.5, backoff_max=4.0),
            now=self.clock.now,
            sleep=self.clock.sleep,
            rng=random.Random(7),
        )

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.handler(request)
        if not isinstance(answer, httpx.Response):
            answer = await answer
        return answer

    async def call(
        self, budget: float = 60.0, key: str = "order-1:charge", **payload: object
    ) -> CallOutcome:
        body = payload or {"order_id": "order-1", "amount": 25}
        deadline = self.clock.now() + timedelta(seconds=budget)
        return await self.client.call("charge", body, key, deadline)

    async def undo(self, budget: float = 60.0, undoes: str | None = "order-1:charge"):
        return await self.client.call(
            "refund",
            {"order_id": "order-1", "amount": 25},
            "order-1:refund",
            self.clock.now() + timedelta(seconds=budget),
            undoes=undoes,
        )


def responses(*items: httpx.Response | Exception) -> Callable[[httpx.Request], httpx.Response]:
    """A handler answering with ``items`` in turn (the last one repeats)."""
    queue = list(items)

    def handler(_request: httpx.Request) -> httpx.Response:
        item = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(item, Exception):
            raise item
        return item

    return handler


def ok(**result: object) -> httpx.Response:
    return httpx.Response(200, json=result or {"charge_id": "ch-1"})


def error(status: int, code: str, message: str = "m", **headers: str) -> httpx.Response:
    return httpx.Response(
        status, json={"error": {"code": code, "message": message}}, headers=headers
    )


# -- on the event loop -------------------------------------------------------------------------


async def test_call_is_a_coroutine_and_the_default_sleep_is_the_event_loops() -> None:
    client = RemoteServiceClient(
        "payment", BASE, httpx.AsyncClient(transport=httpx.MockTransport(lambda r: ok()))
    )
    assert client._sleep is asyncio.sleep
    deadline = datetime.now(UTC) + timedelta(seconds=5)
    pending = client.call("charge", {"order_id": "o"}, "k", deadline)
    assert isinstance(pending, Awaitable)
    assert await pending == Succeeded({"charge_id": "ch-1"}, attempts=1)


# -- retries ----------------------------------------------------------------------------------


async def test_retries_a_503_then_succeeds() -> None:
    h = Harness(responses(error(503, "unavailable"), ok(charge_id="ch-9")))
    outcome = await h.call()
    assert outcome == Succeeded({"charge_id": "ch-9"}, attempts=2)
    assert len(h.requests) == 2
    assert len(h.clock.sleeps) == 1
    assert 0 <= h.clock.sleeps[0] <= 0.5  # full jitter under the first cap


async def test_request_shape_and_idempotency_key_identical_across_attempts() -> None:
    failures = [error(500, "boom"), httpx.ConnectError("refused"), httpx.ReadTimeout("slow")]
    h = Harness(responses(*failures, ok()))
    assert isinstance(await h.call(), Succeeded)
    assert len(h.requests) == 4
    assert {r.headers["Idempotency-Key"] for r in h.requests} == {"order-1:charge"}
    assert {r.content for r in h.requests} == {b'{"order_id":"order-1","amount":25}'}
    assert all(r.method == "POST" and str(r.url) == f"{BASE}/charge" for r in h.requests)
    assert h.requests[0].headers["Content-Type"] == "application/json"


async def test_backoff_caps_grow_exponentially_with_full_jitter() -> None:
    policy = RetryPolicy(max_attempts=6, backoff_initial=1.0, backoff_max=4.0)
    h = Harness(responses(error(503, "unavailable")), policy, failure_threshold=100)
    outcome = await h.call(budget=1000)
    assert isinstance(outcome, Failed) and outcome.transient and outcome.attempts == 6
    caps = [1.0, 2.0, 4.0, 4.0, 4.0]
    assert len(h.clock.sleeps) == len(caps)
    assert all(0 <= s <= cap for s, cap in zip(h.clock.sleeps, caps, strict=True))
    assert len(set(h.clock.sleeps)) > 1  # jittered, not fixed


async def test_429_retry_after_seconds_is_honoured() -> None:
    h = Harness(responses(error(429, "too_many_requests", **{"Retry-After": "7"}), ok()))
    assert isinstance(await h.call(), Succeeded)
    assert h.clock.sleeps == [7.0]


async def test_429_retry_after_http_date_is_honoured() -> None:
    when = format_datetime(T0 + timedelta(seconds=12), usegmt=True)
    h = Harness(responses(error(429, "too_many_requests", **{"Retry-After": when}), ok()))
    assert isinstance(await h.call(), Succeeded)
    assert h.clock.sleeps == [12.0]


async def test_retry_after_beyond_the_deadline_stops_without_sleeping() -> None:
    h = Harness(responses(error(503, "unavailable", **{"Retry-After": "120"}), ok()))
    outcome = await h.call(budget=30)
    assert isinstance(outcome, DeadlinePassed)
    assert "unavailable" in (outcome.last_error or "")
    assert h.clock.sleeps == []
    assert len(h.requests) == 1


async def test_exhausted_attempts_fail_transient_with_last_error() -> None:
    h = Harness(responses(error(502, "bad_gateway", "upstream down")), RetryPolicy(max_attempts=3))
    outcome = await h.call()
    assert outcome == Failed("bad_gateway", "upstream down", transient=True, attempts=3)


# -- business refusals ------------------------------------------------------------------------


async def test_402_decline_is_not_retried() -> None:
    h = Harness(responses(error(402, "card_declined", "issuer said no"), ok()))
    outcome = await h.call()
    assert outcome == Failed("card_declined", "issuer said no", transient=False, attempts=1)
    assert len(h.requests) == 1
    assert h.clock.sleeps == []


async def test_text_error_body_becomes_the_message() -> None:
    h = Harness(responses(httpx.Response(400, text="order_id missing")))
    assert await h.call() == Failed("http_400", "order_id missing", transient=False, attempts=1)


async def test_408_is_transient() -> None:
    h = Harness(responses(httpx.Response(408), ok()))
    assert isinstance(await h.call(), Succeeded)
    assert len(h.requests) == 2


async def test_success_without_json_object_is_a_failure() -> None:
    h = Harness(responses(httpx.Response(200, text="<html>proxy</html>")))
    outcome = await h.call()
    assert isinstance(outcome, Failed) and outcome.code == "invalid_response"
    assert not outcome.transient


# -- the answer's size and time ---------------------------------------------------------------


async def test_an_answer_too_large_is_a_transient_failure() -> None:
    policy = RetryPolicy(max_attempts=2, backoff_initial=0.1, max_response_bytes=100)
    h = Harness(responses(httpx.Response(200, content=b"{" + b" " * 100 + b"}")), policy)
    outcome = await h.call()
    assert outcome == Failed(
        "response_too_large", "answer exceeds 100 bytes", transient=True, attempts=2
    )


def gzipped(body: bytes) -> Callable[[httpx.Request], httpx.Response]:
    """A service answering ``body`` gzip-compressed, streamed (so httpx decodes it as read)."""
    packed = gzip.compress(body)

    def handler(_request: httpx.Request) -> httpx.Response:
        async def stream() -> AsyncIterator[bytes]:
            for start in range(0, len(packed), 16):
                yield packed[start : start + 16]

        return httpx.Response(200, content=stream(), headers={"Content-Encoding": "gzip"})

    return handler


async def test_the_size_bound_counts_the_decoded_answer_not_the_compressed_one() -> None:
    body = b"{" + b" " * 10_000 + b"}"
    assert len(gzip.compress(body)) < 200
    policy = RetryPolicy(max_attempts=1, max_response_bytes=1_000)
    outcome = await Harness(gzipped(body), policy).call()
    assert isinstance(outcome, Failed) and outcome.code == "response_too_large"
    fits = await Harness(gzipped(body), RetryPolicy(max_response_bytes=len(body))).call()
    assert fits == Succeeded({}, attempts=1)  # decoded whole: an empty JSON object


async def test_an_answer_at_exactly_the_size_bound_is_read() -> None:
    body = json.dumps({"pad": "x" * 80}).encode()
    h = Harness(
        responses(httpx.Response(200, content=body)), RetryPolicy(max_response_bytes=len(body))
    )
    assert await h.call() == Succeeded({"pad": "x" * 80}, attempts=1)


async def test_an_answer_still_arriving_at_the_attempt_timeout_is_cut_off() -> None:
    """httpx bounds each read only; the client bounds the whole answer by the attempt timeout."""
    answers = 0

    def trickle(_request: httpx.Request) -> httpx.Response:
        nonlocal answers
        answers += 1
        if answers > 1:
            return ok(charge_id="ch-2")

        async def chunks() -> AsyncIterator[bytes]:
            for part in (b'{"charge_id":', b'"ch-1"', b"}"):
                yield part
                h.clock.advance(1.5)  # each chunk within the read timeout, not the whole

        return httpx.Response(200, content=chunks())

    h = Harness(trickle, RetryPolicy(attempt_timeout=2.0, backoff_initial=0.1))
    outcome = await h.call()
    assert outcome == Succeeded({"charge_id": "ch-2"}, attempts=2)
    assert answers == 2


# -- deadline ---------------------------------------------------------------------------------


async def test_deadline_stops_retries_and_nothing_runs_past_it() -> None:
    seen: list[datetime] = []

    def slow_failure(request: httpx.Request) -> httpx.Response:
        seen.append(h.clock.now())
        timeout = request.extensions["timeout"]["read"]
        h.clock.advance(min(0.7, timeout))  # each answer takes 0.7 s of (fake) time
        if timeout < 0.7:
            raise httpx.ReadTimeout("no answer", request=request)
        return error(503, "unavailable")

    policy = RetryPolicy(max_attempts=None, backoff_initial=0.5)
    h = Harness(slow_failure, policy, failure_threshold=100)
    deadline = T0 + timedelta(seconds=5)
    outcome = await h.call(budget=5)
    assert isinstance(outcome, DeadlinePassed)
    assert outcome.attempts == len(seen) >= 3
    assert all(start < deadline for start in seen)
    assert h.clock.now() <= deadline  # no sleep and no attempt ended past complete-by


async def test_attempt_timeout_is_cut_to_the_time_left() -> None:
    timeouts: list[dict[str, float]] = []

    def hang(request: httpx.Request) -> httpx.Response:
        timeouts.append(request.extensions["timeout"])
        h.clock.advance(request.extensions["timeout"]["read"])
        raise httpx.ReadTimeout("no answer", request=request)

    h = Harness(hang, RetryPolicy(attempt_timeout=10.0, backoff_initial=0.1))
    outcome = await h.call(budget=3)
    assert isinstance(outcome, DeadlinePassed)
    assert timeouts[0] == {"connect": 3.0, "read": 3.0, "write": 3.0, "pool": 3.0}
    assert len(timeouts) == 1


async def test_past_deadline_sends_nothing() -> None:
    h = Harness(responses(ok()))
    outcome = await h.call(budget=-1)
    assert outcome == DeadlinePassed(None, attempts=0)
    assert h.requests == []


async def test_naive_deadline_is_refused() -> None:
    h = Harness(responses(ok()))
    with pytest.raises(ValueError, match="timezone-aware"):
        await h.client.call("charge", {"order_id": "o"}, "k", datetime(2030, 1, 1))


# -- undo -------------------------------------------------------------------------------------


async def test_an_undo_names_the_forward_key_in_its_body() -> None:
    h = Harness(responses(ok(refund_id="rf-1", status="refunded")))
    outcome = await h.undo()
    assert outcome == Succeeded({"refund_id": "rf-1", "status": "refunded"}, attempts=1)
    [request] = h.requests
    assert json.loads(request.content) == {
        "order_id": "order-1",
        "amount": 25,
        "undoes": "order-1:charge",
    }
    assert request.headers["Idempotency-Key"] == "order-1:refund"
    assert str(request.url) == f"{BASE}/refund"


async def test_nothing_to_undo_is_its_own_outcome() -> None:
    answer = {"order_id": "order-1", "status": "nothing_to_undo", "undoes": "order-1:charge"}
    h = Harness(responses(error(503, "unavailable"), ok(**answer)))
    assert await h.undo() == NothingToUndo(answer, attempts=2)


async def test_nothing_to_undo_status_on_a_forward_call_is_just_a_success() -> None:
    h = Harness(responses(ok(status="nothing_to_undo")))
    assert await h.call() == Succeeded({"status": "nothing_to_undo"}, attempts=1)


async def test_undone_before_applied_is_a_refusal_not_retried() -> None:
    message = "this key was undone before it was applied; it will never take effect"
    h = Harness(responses(error(409, "undone_before_applied", message), ok()))
    outcome = await h.call()
    assert outcome == Failed("undone_before_applied", message, transient=False, attempts=1)
    assert len(h.requests) == 1


@pytest.mark.parametrize("undoes", ["", "has space", "order-1:refund"])
async def test_an_invalid_undoes_is_refused_before_any_request(undoes: str) -> None:
    h = Harness(responses(ok()))
    with pytest.raises(ValueError, match="undoes"):
        await h.undo(undoes=undoes)
    assert h.requests == []


async def test_invalid_arguments_are_refused() -> None:
    http = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: ok()))
    with pytest.raises(ValueError, match="base_url"):
        RemoteServiceClient("payment", "payment.local", http)
    client = RemoteServiceClient("payment", BASE, http, CircuitBreaker("p"))
    deadline = datetime.now(UTC) + timedelta(seconds=5)
    with pytest.raises(ValueError, match="operation"):
        await client.call("../charge", {"order_id": "o"}, "k", deadline)
    for key in ("", "with space", "ключ", "k" * 256):
        with pytest.raises(ValueError, match="idempotency_key"):
            await client.call("charge", {"order_id": "o"}, key, deadline)
    with pytest.raises(ValueError):
        await client.call("charge", {"amount": float("nan")}, "k", deadline)


# -- circuit breaker --------------------------------------------------------------------------


async def test_open_breaker_fails_fast_then_half_opens_after_reset() -> None:
    healthy = False

    def service(request: httpx.Request) -> httpx.Response:
        return ok() if healthy else error(503, "unavailable")

    policy = RetryPolicy(max_attempts=2, backoff_initial=0.1)
    h = Harness(service, policy, failure_threshold=4, reset_timeout=30.0)
    assert isinstance(await h.call(key="a"), Failed)
    opened = await h.call(key="b")  # its second attempt opens the circuit: deferred, not failed
    assert isinstance(opened, Deferred) and opened.attempts == 2
    assert h.breaker.state is BreakerState.OPEN
    sent = len(h.requests)

    h.clock.advance(10.0)
    outcome = await h.call(key="c")
    assert isinstance(outcome, Deferred) and outcome.attempts == 0
    assert outcome.retry_at == h.clock.now() + timedelta(seconds=20.0)  # the next trial
    assert outcome.retry_at == opened.retry_at
    assert len(h.requests) == sent  # nothing sent

    h.clock.advance(30.0)
    healthy = True
    assert h.breaker.state is BreakerState.HALF_OPEN
    assert isinstance(await h.call(key="d"), Succeeded)
    assert h.breaker.state is BreakerState.CLOSED
    assert len(h.requests) == sent + 1


async def test_failed_half_open_trial_reopens() -> None:
    h = Harness(responses(error(503, "x")), RetryPolicy(max_attempts=1), failure_threshold=1)
    await h.call(key="a")
    h.clock.advance(31)
    trial = await h.call(key="b")  # the trial fails and reopens the circuit
    assert h.breaker.state is BreakerState.OPEN
    assert isinstance(trial, Deferred) and trial.attempts == 1
    assert trial.retry_at == h.clock.now() + timedelta(seconds=30.0)
    assert isinstance(await h.call(key="c"), Deferred)


async def test_breaker_opening_mid_call_stops_the_retries() -> None:
    h = Harness(responses(error(503, "x")), RetryPolicy(max_attempts=5), failure_threshold=2)
    outcome = await h.call()
    assert isinstance(outcome, Deferred)
    assert outcome.attempts == 2 and outcome.last_error == "x: m"
    assert len(h.clock.sleeps) == 1  # no backoff once the circuit is open: it defers at once
    assert outcome.retry_at == h.clock.now() + timedelta(seconds=30.0)


async def test_a_half_open_circuit_busy_with_its_trial_defers_by_the_minimum() -> None:
    h = Harness(responses(ok()), failure_threshold=1, reset_timeout=5.0)
    h.breaker.acquire()
    h.breaker.record_failure()
    h.clock.advance(5.0)
    assert h.breaker.acquire()  # another caller's trial call is in flight
    outcome = await h.call()
    assert isinstance(outcome, Deferred) and outcome.attempts == 0
    assert outcome.retry_at == h.clock.now() + timedelta(seconds=MIN_DEFER_SECONDS)
    assert h.requests == []


async def test_a_circuit_opening_at_complete_by_answers_nothing() -> None:
    def slow_failure(request: httpx.Request) -> httpx.Response:
        h.clock.advance(request.extensions["timeout"]["read"])  # the whole attempt timeout
        raise httpx.ReadTimeout("no answer", request=request)

    h = Harness(slow_failure, RetryPolicy(attempt_timeout=10.0), failure_threshold=1)
    outcome = await h.call(budget=4.0)  # the first attempt is cut to 4 s, ends at complete-by
    assert h.breaker.state is BreakerState.OPEN
    assert isinstance(outcome, DeadlinePassed) and outcome.attempts == 1


async def test_a_call_refused_by_the_service_is_never_deferred() -> None:
    """A definitive answer is reported even if the circuit is open by the time it arrives."""

    def refuse_while_others_open_the_circuit(request: httpx.Request) -> httpx.Response:
        for _ in range(3):
            h.breaker.record_failure()  # other calls' failures, meanwhile
        return error(402, "card_declined")

    h = Harness(refuse_while_others_open_the_circuit, failure_threshold=3)
    outcome = await h.call()
    assert isinstance(outcome, Failed) and outcome.code == "card_declined"


async def test_refusals_do_not_trip_the_breaker() -> None:
    h = Harness(responses(error(402, "card_declined")), failure_threshold=2)
    for key in "abcd":
        await h.call(key=key)
    assert h.breaker.state is BreakerState.CLOSED
    assert h.breaker.consecutive_failures == 0


def test_half_open_admits_one_trial_at_a_time() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("s", BreakerSettings(1, 5.0), clock=clock.monotonic)
    assert breaker.acquire()
    breaker.record_failure()
    assert not breaker.acquire()
    clock.advance(5)
    assert breaker.acquire()  # the trial
    assert not breaker.acquire()  # a second caller meanwhile
    breaker.release()  # trial ended without a verdict
    assert breaker.acquire()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED and breaker.acquire()


def test_breaker_is_shared_per_service_name() -> None:
    assert breaker_for("payment-shared") is breaker_for("payment-shared")
    assert breaker_for("payment-shared") is not breaker_for("shipping-shared")
    http = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: ok()))
    one = RemoteServiceClient("svc-x", "http://x.test/svc", http)
    two = RemoteServiceClient("svc-x", "http://x.test/svc", http)
    assert one.breaker is two.breaker is breaker_for("svc-x")


async def test_a_cancelled_call_gives_its_half_open_trial_back() -> None:
    """Cancellation (the host ending the invocation) is no verdict on the service: the trial
    slot is released, not kept for ever nor counted as a failure."""
    entered = anyio.Event()

    async def never_answers(_request: httpx.Request) -> httpx.Response:
        entered.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    h = Harness(never_answers, failure_threshold=1, reset_timeout=5.0)
    h.breaker.acquire()
    h.breaker.record_failure()
    h.clock.advance(5.0)  # half-open: the next call is the trial
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(h.call)
        with anyio.fail_after(5):
            await entered.wait()
        tasks.cancel_scope.cancel()
    assert h.breaker.state is BreakerState.HALF_OPEN
    assert h.breaker.acquire()  # the trial slot is free again


async def test_calls_through_one_breaker_are_not_serialised() -> None:
    """A slow call must not hold up another call to the same service on the same loop (pybreaker
    would)."""
    release = anyio.Event()
    entered = anyio.Event()

    async def service(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["order_id"] == "slow":
            entered.set()
            await release.wait()
        return ok()

    h = Harness(service)
    results: list[CallOutcome] = []

    async def slow() -> None:
        results.append(await h.call(key="slow", order_id="slow"))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(slow)
            await entered.wait()
            assert isinstance(await h.call(key="fast", order_id="fast"), Succeeded)
            assert results == []  # the slow one is still waiting for its answer
            release.set()
    assert [type(r) for r in results] == [Succeeded]


# -- logging ----------------------------------------------------------------------------------


async def test_logs_one_debug_line_per_attempt_and_one_info_line_per_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(responses(error(503, "unavailable"), error(503, "unavailable"), ok()))
    with caplog.at_level(logging.DEBUG, logger="agent.remote_client"):
        await h.call()
    records = [r for r in caplog.records if r.name == "agent.remote_client"]
    attempts = [r.getMessage() for r in records if r.levelno == logging.DEBUG]
    finals = [r.getMessage() for r in records if r.levelno == logging.INFO]
    assert len(attempts) == 3 and len(finals) == 1
    for number, line in enumerate(attempts, start=1):
        assert "service=payment operation=charge key=order-1:charge" in line
        assert f"attempt={number}" in line
    assert "attempts=3 outcome=succeeded" in finals[0]


# -- every outcome and every wait ---------------------------------------------------------------

Answers = Callable[[], list[httpx.Response | Exception]]
"""A scenario's answers, made afresh for each client (a client binds a response to itself)."""
Expected = Callable[[datetime], CallOutcome]
"""The outcome, given the fake clock's time once the call returned."""
OPEN_S = 30.0  # the breaker's reset timeout: a circuit that opens defers to its next trial


def jittered(n: int) -> list[float]:
    """The first ``n`` backoff waits (caps 0.5, 1, 2 and 4 s): full jitter, each the Harness's
    rng's next draw times its cap."""
    rng = random.Random(7)
    return [rng.random() * cap for cap in (0.5, 1.0, 2.0, 4.0)[:n]]


def deferred(last_error: str) -> Expected:
    return lambda end: Deferred(end + timedelta(seconds=OPEN_S), attempts=5, last_error=last_error)


SCENARIOS: dict[str, tuple[Answers, dict[str, Any], float, Expected, list[float]]] = {
    "retried to success": (
        lambda: [error(503, "u"), httpx.ConnectError("no"), ok()],
        {},
        60.0,
        lambda _: Succeeded({"charge_id": "ch-1"}, attempts=3),
        jittered(2),
    ),
    "exhausted": (
        lambda: [error(502, "bad_gateway")],
        {"max_attempts": 4},
        600.0,
        lambda _: Failed("bad_gateway", "m", transient=True, attempts=4),
        jittered(3),
    ),
    "refused": (
        lambda: [error(409, "out_of_stock")],
        {},
        60.0,
        lambda _: Failed("out_of_stock", "m", transient=False, attempts=1),
        [],
    ),
    "throttled": (
        lambda: [error(429, "slow_down", **{"Retry-After": "3"}), ok()],
        {},
        60.0,
        lambda _: Succeeded({"charge_id": "ch-1"}, attempts=2),
        [3.0],
    ),
    "deadline": (
        lambda: [error(503, "u")],
        {"max_attempts": None},
        5.0,
        deferred("u: m"),
        jittered(4),
    ),
    "circuit opens": (
        lambda: [error(500, "boom")],
        {"max_attempts": 9},
        600.0,
        deferred("boom: m"),
        jittered(4),
    ),
    "too large": (
        lambda: [httpx.Response(200, content=b"{}" + b" " * 64)],
        {"max_response_bytes": 64},
        60.0,
        deferred("response_too_large: answer exceeds 64 bytes"),
        jittered(4),
    ),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_each_scenario_gives_its_outcome_after_its_waits(scenario: str) -> None:
    answers, policy_fields, budget, expected, waits = SCENARIOS[scenario]
    policy = RetryPolicy(**{"backoff_initial": 0.5, "backoff_max": 4.0, **policy_fields})
    h = Harness(responses(*answers()), policy, failure_threshold=5)

    outcome = await h.call(budget=budget)

    assert outcome == expected(h.clock.now())
    assert h.clock.sleeps == waits
    assert len(h.requests) == outcome.attempts >= 1


# -- helpers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", 0.0),
        ("15", 15.0),
        ("Tue, 01 Jan 2030 12:00:30 GMT", 30.0),
        ("Tue, 01 Jan 2030 11:00:00 GMT", 0.0),  # in the past: now
        ("-5", None),
        ("soon", None),
        (None, None),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, T0) == expected


def test_error_details_fallbacks() -> None:
    assert error_details(409, b'{"error": {"code": "out_of_stock", "message": "none"}}') == (
        "out_of_stock",
        "none",
    )
    assert error_details(500, b"") == ("http_500", "HTTP 500 with an empty body")
    assert error_details(404, b'{"detail": "x"}') == ("http_404", '{"detail": "x"}')


# -- real sockets, real time: the fake services -----------------------------------------------

FAST = RetryPolicy(max_attempts=None, attempt_timeout=5.0, backoff_initial=0.01, backoff_max=0.05)


@pytest.fixture
def fakes() -> Iterator[FakeServices]:
    with FakeServices.start(seed=3) as running:
        yield running


def real_client(fakes: FakeServices, http: httpx.AsyncClient, **policy: Any) -> RemoteServiceClient:
    breaker = CircuitBreaker("payment", BreakerSettings(failure_threshold=1000))
    return RemoteServiceClient(
        "payment", fakes.url("payment"), http, breaker, policy=replace(FAST, **policy)
    )


async def charge(client: RemoteServiceClient, order: str, budget: float = 10.0) -> CallOutcome:
    deadline = datetime.now(UTC) + timedelta(seconds=budget)
    return await client.call(
        "charge", {"order_id": order, "amount": 10}, f"{order}:charge", deadline
    )


async def test_real_transient_faults_are_retried_to_exactly_one_effect(fakes: FakeServices) -> None:
    fakes.set_profile({"services": {"payment": {"fail_first_n": 3}}})
    async with httpx.AsyncClient() as http:
        outcome = await charge(real_client(fakes, http), "order-1")
    assert isinstance(outcome, Succeeded) and outcome.attempts == 4
    assert [e["idempotency_key"] for e in fakes.ledger()] == ["order-1:charge"]


async def test_real_hang_is_bounded_by_the_deadline_without_blocking_the_loop(
    fakes: FakeServices,
) -> None:
    fakes.set_profile({"default": {"hang_rate": 1.0, "hang_seconds": 30}})
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.05)
            ticks += 1

    async with httpx.AsyncClient() as http, anyio.create_task_group() as tasks:
        tasks.start_soon(ticker)
        started = time.monotonic()
        outcome = await charge(real_client(fakes, http), "order-1", budget=1.0)
        elapsed = time.monotonic() - started
        tasks.cancel_scope.cancel()
    assert isinstance(outcome, DeadlinePassed)
    assert "timeout" in (outcome.last_error or "")
    assert 0.9 <= elapsed < 1.5
    assert ticks >= 10  # the loop ran other tasks all along the hung call
    assert fakes.ledger() == []


async def test_real_undo_and_refusal(fakes: FakeServices) -> None:
    fakes.set_profile({"services": {"payment": {"decline_order_ids": ["order-9"]}}})
    async with httpx.AsyncClient() as http:
        client = real_client(fakes, http)
        declined = await charge(client, "order-9")
        undo = await client.call(
            "refund",
            {"order_id": "order-2", "amount": 10},
            "order-2:refund",
            datetime.now(UTC) + timedelta(seconds=10),
            undoes="order-2:charge",
        )
    assert isinstance(declined, Failed)
    assert (declined.code, declined.transient, declined.attempts) == ("card_declined", False, 1)
    assert isinstance(undo, NothingToUndo) and undo.result["undoes"] == "order-2:charge"
    assert fakes.ledger() == []


async def test_real_unreachable_service_defers_once_the_circuit_opens() -> None:
    with FakeServices.start() as gone:
        url = gone.url("payment")
    async with httpx.AsyncClient() as http:
        client = RemoteServiceClient(
            "payment",
            url,
            http,
            CircuitBreaker("payment", BreakerSettings(failure_threshold=3)),
            policy=FAST,
        )
        before = datetime.now(UTC)
        outcome = await charge(client, "order-1", budget=5.0)
    assert isinstance(outcome, Deferred) and outcome.attempts == 3
    assert "connection_error" in (outcome.last_error or "")
    assert before + timedelta(seconds=29) < outcome.retry_at < before + timedelta(seconds=31)
