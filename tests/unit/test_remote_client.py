"""RemoteServiceClient (service.remote_calls): retries, refusals, the deadline, undo and the
circuit breaker against a stand-in for its remote HTTP (adapters.remote_http) on a fake clock
(no sockets, no real sleeps), with every outcome and every wait of a few scenarios pinned; it
must give up its half-open trial when cancelled. On the real adapters.remote_http, against
scripted servers, what the attempts carry (the request, Retry-After, refusals, the answer's size
decoded and its time, one POST per attempt); against the real fake services it must bound a
hang by the deadline without ever blocking the event loop, and leave one effect however often
a call is retried.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import anyio
import pytest

from adapters.remote_http import Answer, CallFailed, CallTimedOut, RemoteHttp, RemoteService
from devstack.fakes.remote_services import FakeServices
from service.circuit import BreakerRegistry, BreakerSettings, BreakerState, CircuitBreaker
from service.http_errors import error_details, parse_retry_after
from service.outcomes import CallOutcome, DeadlinePassed, Deferred, Failed, NothingToUndo, Succeeded
from service.remote_calls import MIN_DEFER_SECONDS, RemoteServiceClient, RetryPolicy
from tests.support.remote_http import FakeRemoteHttp, Handler, Post, answer, json_answer
from tests.support.scripted_http import Reply, replies
from tests.support.scripted_http import answer as raw_answer

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


class Harness:
    def __init__(self, handler: Handler, policy: RetryPolicy | None = None, **breaker: float):
        self.clock = FakeClock()
        self.http = FakeRemoteHttp(handler, {"payment": BASE})
        self.requests = self.http.posts
        self.breaker = CircuitBreaker(
            "payment", BreakerSettings(**breaker), clock=self.clock.monotonic
        )
        self.client = RemoteServiceClient(
            "payment",
            self.http,  # type: ignore[arg-type]
            self.breaker,
            policy=policy or RetryPolicy(backoff_initial=0.5, backoff_max=4.0),
            now=self.clock.now,
            sleep=self.clock.sleep,
            rng=random.Random(7),
        )

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


def responses(*items: Answer | Exception) -> Callable[[Post], Answer]:
    """A handler answering with ``items`` in turn (the last one repeats)."""
    queue = list(items)

    def handler(_post: Post) -> Answer:
        item = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(item, Exception):
            raise item
        return item

    return handler


def ok(**result: object) -> Answer:
    return json_answer(200, result or {"charge_id": "ch-1"})


def error(status: int, code: str, message: str = "m", **headers: str) -> Answer:
    return json_answer(status, {"error": {"code": code, "message": message}}, **headers)


# -- on the event loop -------------------------------------------------------------------------


async def test_call_is_a_coroutine_and_the_default_sleep_is_the_event_loops() -> None:
    http = FakeRemoteHttp(lambda p: ok(), {"payment": BASE})
    client = RemoteServiceClient("payment", http, CircuitBreaker("payment"))  # type: ignore[arg-type]
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
    failures = [error(500, "boom"), CallFailed("refused"), CallTimedOut("slow")]
    h = Harness(responses(*failures, ok()))
    assert isinstance(await h.call(), Succeeded)
    assert len(h.requests) == 4
    assert {r.headers["Idempotency-Key"] for r in h.requests} == {"order-1:charge"}
    assert {r.body for r in h.requests} == {b'{"order_id":"order-1","amount":25}'}
    assert all(r.url == f"{BASE}/charge" for r in h.requests)
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
    h = Harness(responses(answer(400, b"order_id missing")))
    assert await h.call() == Failed("http_400", "order_id missing", transient=False, attempts=1)


async def test_408_is_transient() -> None:
    h = Harness(responses(answer(408), ok()))
    assert isinstance(await h.call(), Succeeded)
    assert len(h.requests) == 2


async def test_success_without_json_object_is_a_failure() -> None:
    h = Harness(responses(answer(200, b"<html>proxy</html>")))
    outcome = await h.call()
    assert isinstance(outcome, Failed) and outcome.code == "invalid_response"
    assert not outcome.transient


# -- the answer's size and time ---------------------------------------------------------------


async def test_an_answer_too_large_is_a_transient_failure() -> None:
    """The client asks its remote HTTP to read at most ``max_response_bytes``; an answer the
    adapter refuses as longer is a transient failure (the adapter's bound: test_remote_http.py;
    on the wire: below)."""
    policy = RetryPolicy(max_attempts=2, backoff_initial=0.1, max_response_bytes=100)
    h = Harness(responses(answer(200, b"{" + b" " * 100 + b"}")), policy)
    outcome = await h.call()
    assert outcome == Failed(
        "response_too_large",
        f"POST {BASE}/charge: the answer exceeds 100 bytes",
        transient=True,
        attempts=2,
    )
    assert [r.max_answer_bytes for r in h.requests] == [100, 100]


# -- deadline ---------------------------------------------------------------------------------


async def test_deadline_stops_retries_and_nothing_runs_past_it() -> None:
    seen: list[datetime] = []

    def slow_failure(post: Post) -> Answer:
        seen.append(h.clock.now())
        assert post.timeout is not None
        h.clock.advance(min(0.7, post.timeout))  # each answer takes 0.7 s of (fake) time
        if post.timeout < 0.7:
            raise CallTimedOut("no answer")
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
    timeouts: list[float] = []

    def hang(post: Post) -> Answer:
        assert post.timeout is not None
        timeouts.append(post.timeout)
        h.clock.advance(post.timeout)
        raise CallTimedOut("no answer")

    h = Harness(hang, RetryPolicy(attempt_timeout=10.0, backoff_initial=0.1))
    outcome = await h.call(budget=3)
    assert isinstance(outcome, DeadlinePassed)
    assert timeouts[0] == 3.0  # one deadline for the whole call: connecting, sending, reading
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
    assert json.loads(request.body) == {
        "order_id": "order-1",
        "amount": 25,
        "undoes": "order-1:charge",
    }
    assert request.headers["Idempotency-Key"] == "order-1:refund"
    assert request.url == f"{BASE}/refund"


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
    with pytest.raises(ValueError, match="base_url"):
        RemoteService("payment", "payment.local")
    http = FakeRemoteHttp(lambda p: ok(), {"payment": BASE})
    client = RemoteServiceClient("payment", http, CircuitBreaker("p"))  # type: ignore[arg-type]
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

    def service(_post: Post) -> Answer:
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
    def slow_failure(post: Post) -> Answer:
        assert post.timeout is not None
        h.clock.advance(post.timeout)  # the whole attempt timeout
        raise CallTimedOut("no answer")

    h = Harness(slow_failure, RetryPolicy(attempt_timeout=10.0), failure_threshold=1)
    outcome = await h.call(budget=4.0)  # the first attempt is cut to 4 s, ends at complete-by
    assert h.breaker.state is BreakerState.OPEN
    assert isinstance(outcome, DeadlinePassed) and outcome.attempts == 1


async def test_a_call_refused_by_the_service_is_never_deferred() -> None:
    """A definitive answer is reported even if the circuit is open by the time it arrives."""

    def refuse_while_others_open_the_circuit(_post: Post) -> Answer:
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


def test_a_registry_has_one_breaker_per_service_name() -> None:
    breakers, others = BreakerRegistry(), BreakerRegistry()
    assert breakers.get("payment") is breakers.get("payment")
    assert breakers.get("payment") is not breakers.get("shipping")
    assert breakers.get("payment") is not others.get("payment"), "a Runtime's own"


async def test_a_cancelled_call_gives_its_half_open_trial_back() -> None:
    """Cancellation (the host ending the invocation) is no verdict on the service: the trial
    slot is released, not kept for ever nor counted as a failure."""
    entered = anyio.Event()

    async def never_answers(_post: Post) -> Answer:
        entered.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    h = Harness(never_answers, failure_threshold=1, reset_timeout=5.0)
    h.breaker.acquire()
    h.breaker.record_failure()
    h.clock.advance(5.0)  # half-open: the next call is the trial
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(h.call)
        with anyio.fail_after(30):
            await entered.wait()
        tasks.cancel_scope.cancel()
    assert h.breaker.state is BreakerState.HALF_OPEN
    assert h.breaker.acquire()  # the trial slot is free again


async def test_calls_through_one_breaker_are_not_serialised() -> None:
    """A slow call must not hold up another call to the same service on the same loop (pybreaker
    would)."""
    release = anyio.Event()
    entered = anyio.Event()

    async def service(post: Post) -> Answer:
        if json.loads(post.body)["order_id"] == "slow":
            entered.set()
            await release.wait()
        return ok()

    h = Harness(service)
    results: list[CallOutcome] = []

    async def slow() -> None:
        results.append(await h.call(key="slow", order_id="slow"))

    with anyio.fail_after(30):
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
    with caplog.at_level(logging.DEBUG, logger="service.remote_calls"):
        await h.call()
    records = [r for r in caplog.records if r.name == "service.remote_calls"]
    attempts = [r.getMessage() for r in records if r.levelno == logging.DEBUG]
    finals = [r.getMessage() for r in records if r.levelno == logging.INFO]
    assert len(attempts) == 3 and len(finals) == 1
    for number, line in enumerate(attempts, start=1):
        assert "service=payment operation=charge key=order-1:charge" in line
        assert f"attempt={number}" in line
    assert "attempts=3 outcome=succeeded" in finals[0]


# -- every outcome and every wait ---------------------------------------------------------------

Answers = Callable[[], list[Answer | Exception]]
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
        lambda: [error(503, "u"), CallFailed("no"), ok()],
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
        lambda: [answer(200, b"{}" + b" " * 64)],
        {"max_response_bytes": 64},
        60.0,
        deferred(f"response_too_large: POST {BASE}/charge: the answer exceeds 64 bytes"),
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


# -- the real adapters.remote_http against scripted servers: real sockets, real time ----------

FAST = RetryPolicy(max_attempts=None, attempt_timeout=5.0, backoff_initial=0.01, backoff_max=0.05)


class Calls:
    """A client of ``payment`` at ``origin`` on a RemoteHttp of its own, recording its waits
    instead of sleeping them (``real_waits``: sleeping them too)."""

    def __init__(
        self, origin: str, policy: RetryPolicy = FAST, *, real_waits: bool = False, **breaker: float
    ) -> None:
        self.http = RemoteHttp([RemoteService("payment", f"{origin}/payment")])
        self.waits: list[float] = []
        self._real_waits = real_waits
        self.client = RemoteServiceClient(
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


def wire_ok(**result: object) -> bytes:
    return raw_answer(200, json.dumps(result or {"charge_id": "ch-1"}).encode())


def wire_error(status: int, code: str, **headers: str) -> bytes:
    body = json.dumps({"error": {"code": code, "message": "m"}}).encode()
    return raw_answer(status, body, {"Content-Type": "application/json", **headers})


async def test_a_503_is_retried_with_the_same_request_until_it_succeeds(serve) -> None:
    server = await serve(replies(wire_error(503, "busy"), wire_ok()))
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
    server = await serve(replies(wire_error(429, "slow_down", **{"Retry-After": "3"}), wire_ok()))
    calls = Calls(server.origin)
    assert isinstance(await calls.charge(), Succeeded)
    assert calls.waits == [3.0]


async def test_a_decline_is_not_retried(serve) -> None:
    server = await serve(replies(wire_error(402, "card_declined")))
    outcome = await Calls(server.origin).charge()
    assert outcome == Failed("card_declined", "m", transient=False, attempts=1)
    assert server.methods() == ["POST"]


async def test_an_answer_too_large_on_the_wire_fails_each_attempt(serve) -> None:
    server = await serve(replies(raw_answer(200, b"{" + b" " * 100 + b"}")))
    policy = RetryPolicy(max_attempts=2, backoff_initial=0.1, max_response_bytes=100)
    outcome = await Calls(server.origin, policy).charge()
    assert isinstance(outcome, Failed) and outcome.code == "response_too_large"
    assert outcome.transient and outcome.attempts == 2


async def test_the_size_bound_counts_the_decoded_answer_not_the_compressed_one(serve) -> None:
    body = b"{" + b" " * 10_000 + b"}"
    assert len(gzip.compress(body)) < 200
    packed = raw_answer(200, gzip.compress(body), {"Content-Encoding": "gzip"})
    server = await serve(replies(packed))
    outcome = await Calls(
        server.origin, RetryPolicy(max_attempts=1, max_response_bytes=1_000)
    ).charge()
    assert isinstance(outcome, Failed) and outcome.code == "response_too_large"
    fits = await Calls(server.origin, RetryPolicy(max_response_bytes=len(body))).charge()
    assert fits == Succeeded({}, attempts=1)  # decoded whole: an empty JSON object


async def test_an_answer_at_exactly_the_size_bound_is_read(serve) -> None:
    body = json.dumps({"pad": "x" * 80}).encode()
    server = await serve(replies(raw_answer(200, body)))
    outcome = await Calls(server.origin, RetryPolicy(max_response_bytes=len(body))).charge()
    assert outcome == Succeeded({"pad": "x" * 80}, attempts=1)


async def test_an_answer_still_arriving_at_the_attempt_timeout_is_cut_off(serve) -> None:
    """The attempt timeout bounds the whole answer, not each read of it."""

    async def trickle() -> AsyncIterator[bytes]:
        parts = (b'{"charge_id":', b'"ch-1"', b"}")
        yield b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % sum(map(len, parts))
        for part in parts:
            await asyncio.sleep(0.6)  # each part well within the timeout, not the whole
            yield part

    def script(request: bytes, n: int) -> Reply:
        return (trickle() if n == 1 else wire_ok(charge_id="ch-2")), False

    server = await serve(script)
    policy = RetryPolicy(max_attempts=2, attempt_timeout=1.0, backoff_initial=0.01)
    outcome = await Calls(server.origin, policy).charge()
    assert outcome == Succeeded({"charge_id": "ch-2"}, attempts=2)
    assert server.methods() == ["POST", "POST"]


async def test_an_attempt_that_times_out_sends_one_post_and_the_next_attempt_another(
    serve,
) -> None:
    async def script(request: bytes, n: int) -> Reply:
        if n == 1:
            await asyncio.sleep(1.5)
        return wire_ok(charge_id=f"ch-{n}"), False

    server = await serve(script)
    policy = RetryPolicy(max_attempts=2, attempt_timeout=1.0, backoff_initial=0.01)
    outcome = await Calls(server.origin, policy).charge()
    assert outcome == Succeeded({"charge_id": "ch-2"}, attempts=2)
    await asyncio.sleep(0.7)
    assert server.methods() == ["POST", "POST"]  # one per attempt, none resent under it


# -- the real fake services --------------------------------------------------------------------


@pytest.fixture
def fakes() -> Iterator[FakeServices]:
    with FakeServices.start(seed=3) as running:
        yield running


def fake_calls(fakes: FakeServices, **breaker: float) -> Calls:
    return Calls(fakes.url("payment").rsplit("/payment", 1)[0], real_waits=True, **breaker)


async def test_real_transient_faults_are_retried_to_exactly_one_effect(fakes: FakeServices) -> None:
    fakes.set_profile({"services": {"payment": {"fail_first_n": 3}}})
    outcome = await fake_calls(fakes).charge()
    assert isinstance(outcome, Succeeded) and outcome.attempts == 4
    assert [e["idempotency_key"] for e in fakes.ledger()] == ["order-1:charge"]


async def test_real_hang_is_bounded_by_the_deadline_without_blocking_the_loop(
    fakes: FakeServices,
) -> None:
    fakes.set_profile({"default": {"hang_rate": 1.0, "hang_seconds": 60}})
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.05)
            ticks += 1

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(ticker)
        started = time.monotonic()
        outcome = await fake_calls(fakes).charge(budget=1.0)
        elapsed = time.monotonic() - started
        tasks.cancel_scope.cancel()
    assert isinstance(outcome, DeadlinePassed)
    assert "timeout" in (outcome.last_error or "")
    # It waited for the deadline, not for the hang: a loaded machine adds far less than 30 s.
    assert 0.9 <= elapsed < 30
    assert ticks >= 10  # the loop ran other tasks all along the hung call
    assert fakes.ledger() == []


async def test_real_undo_and_refusal(fakes: FakeServices) -> None:
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
    outcome = await calls.charge(budget=30.0)
    after = datetime.now(UTC)
    assert isinstance(outcome, Deferred) and outcome.attempts == 3
    assert "connection_error" in (outcome.last_error or "")
    # The breaker's reset timeout (30 s) after it opened, during the call.
    assert before + timedelta(seconds=30) <= outcome.retry_at <= after + timedelta(seconds=30)
