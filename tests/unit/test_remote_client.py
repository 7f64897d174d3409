"""RemoteServiceClient against httpx.MockTransport, on a fake clock: no sockets, no real sleeps."""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from agent.circuit import BreakerSettings, BreakerState, CircuitBreaker, breaker_for
from agent.http_errors import error_details, parse_retry_after
from agent.outcomes import DeadlinePassed, Deferred, Failed, NothingToUndo, Succeeded
from agent.remote_client import MIN_DEFER_SECONDS, RemoteServiceClient, RetryPolicy

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
BASE = "http://payment.test/payment"


class FakeClock:
    """Wall clock and monotonic clock in one; ``sleep`` advances it and records the wait."""

    def __init__(self) -> None:
        self.current = T0
        self.sleeps: list[float] = []

    def now(self) -> datetime:
        return self.current

    def monotonic(self) -> float:
        return (self.current - T0).total_seconds()

    def advance(self, seconds: float) -> None:
        self.current += timedelta(seconds=seconds)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)


Handler = Callable[[httpx.Request], httpx.Response]


class Harness:
    def __init__(self, handler: Handler, policy: RetryPolicy | None = None, **breaker: float):
        self.clock = FakeClock()
        self.requests: list[httpx.Request] = []
        self.handler = handler
        self.breaker = CircuitBreaker(
            "payment", BreakerSettings(**breaker), clock=self.clock.monotonic
        )
        self.http = httpx.Client(transport=httpx.MockTransport(self._handle))
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

    def _handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.handler(request)

    def call(self, budget: float = 60.0, key: str = "order-1:charge", **payload: object):
        body = payload or {"order_id": "order-1", "amount": 25}
        return self.client.call("charge", body, key, self.clock.now() + timedelta(seconds=budget))

    def undo(self, budget: float = 60.0, undoes: str | None = "order-1:charge"):
        return self.client.call(
            "refund",
            {"order_id": "order-1", "amount": 25},
            "order-1:refund",
            self.clock.now() + timedelta(seconds=budget),
            undoes=undoes,
        )


def responses(*items: httpx.Response | Exception) -> Handler:
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


# -- retries ----------------------------------------------------------------------------------


def test_retries_a_503_then_succeeds() -> None:
    h = Harness(responses(error(503, "unavailable"), ok(charge_id="ch-9")))
    outcome = h.call()
    assert outcome == Succeeded({"charge_id": "ch-9"}, attempts=2)
    assert len(h.requests) == 2
    assert len(h.clock.sleeps) == 1
    assert 0 <= h.clock.sleeps[0] <= 0.5  # full jitter under the first cap


def test_request_shape_and_idempotency_key_identical_across_attempts() -> None:
    failures = [error(500, "boom"), httpx.ConnectError("refused"), httpx.ReadTimeout("slow")]
    h = Harness(responses(*failures, ok()))
    assert isinstance(h.call(), Succeeded)
    assert len(h.requests) == 4
    assert {r.headers["Idempotency-Key"] for r in h.requests} == {"order-1:charge"}
    assert {r.content for r in h.requests} == {b'{"order_id":"order-1","amount":25}'}
    assert all(r.method == "POST" and str(r.url) == f"{BASE}/charge" for r in h.requests)
    assert h.requests[0].headers["Content-Type"] == "application/json"


def test_backoff_caps_grow_exponentially_with_full_jitter() -> None:
    policy = RetryPolicy(max_attempts=6, backoff_initial=1.0, backoff_max=4.0)
    h = Harness(responses(error(503, "unavailable")), policy, failure_threshold=100)
    outcome = h.call(budget=1000)
    assert isinstance(outcome, Failed) and outcome.transient and outcome.attempts == 6
    caps = [1.0, 2.0, 4.0, 4.0, 4.0]
    assert len(h.clock.sleeps) == len(caps)
    assert all(0 <= s <= cap for s, cap in zip(h.clock.sleeps, caps, strict=True))
    assert len(set(h.clock.sleeps)) > 1  # jittered, not fixed


def test_429_retry_after_seconds_is_honoured() -> None:
    h = Harness(responses(error(429, "too_many_requests", **{"Retry-After": "7"}), ok()))
    assert isinstance(h.call(), Succeeded)
    assert h.clock.sleeps == [7.0]


def test_429_retry_after_http_date_is_honoured() -> None:
    when = format_datetime(T0 + timedelta(seconds=12), usegmt=True)
    h = Harness(responses(error(429, "too_many_requests", **{"Retry-After": when}), ok()))
    assert isinstance(h.call(), Succeeded)
    assert h.clock.sleeps == [12.0]


def test_retry_after_beyond_the_deadline_stops_without_sleeping() -> None:
    h = Harness(responses(error(503, "unavailable", **{"Retry-After": "120"}), ok()))
    outcome = h.call(budget=30)
    assert isinstance(outcome, DeadlinePassed)
    assert "unavailable" in (outcome.last_error or "")
    assert h.clock.sleeps == []
    assert len(h.requests) == 1


def test_exhausted_attempts_fail_transient_with_last_error() -> None:
    h = Harness(responses(error(502, "bad_gateway", "upstream down")), RetryPolicy(max_attempts=3))
    outcome = h.call()
    assert outcome == Failed("bad_gateway", "upstream down", transient=True, attempts=3)


# -- business refusals ------------------------------------------------------------------------


def test_402_decline_is_not_retried() -> None:
    h = Harness(responses(error(402, "card_declined", "issuer said no"), ok()))
    outcome = h.call()
    assert outcome == Failed("card_declined", "issuer said no", transient=False, attempts=1)
    assert len(h.requests) == 1
    assert h.clock.sleeps == []


def test_text_error_body_becomes_the_message() -> None:
    h = Harness(responses(httpx.Response(400, text="order_id missing")))
    assert h.call() == Failed("http_400", "order_id missing", transient=False, attempts=1)


def test_408_is_transient() -> None:
    h = Harness(responses(httpx.Response(408), ok()))
    assert isinstance(h.call(), Succeeded)
    assert len(h.requests) == 2


def test_success_without_json_object_is_a_failure() -> None:
    h = Harness(responses(httpx.Response(200, text="<html>proxy</html>")))
    outcome = h.call()
    assert isinstance(outcome, Failed) and outcome.code == "invalid_response"
    assert not outcome.transient


# -- deadline ---------------------------------------------------------------------------------


def test_deadline_stops_retries_and_nothing_runs_past_it() -> None:
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
    outcome = h.call(budget=5)
    assert isinstance(outcome, DeadlinePassed)
    assert outcome.attempts == len(seen) >= 3
    assert all(start < deadline for start in seen)
    assert h.clock.now() <= deadline  # no sleep and no attempt ended past complete-by


def test_attempt_timeout_is_cut_to_the_time_left() -> None:
    timeouts: list[dict[str, float]] = []

    def hang(request: httpx.Request) -> httpx.Response:
        timeouts.append(request.extensions["timeout"])
        h.clock.advance(request.extensions["timeout"]["read"])
        raise httpx.ReadTimeout("no answer", request=request)

    h = Harness(hang, RetryPolicy(attempt_timeout=10.0, backoff_initial=0.1))
    outcome = h.call(budget=3)
    assert isinstance(outcome, DeadlinePassed)
    assert timeouts[0] == {"connect": 3.0, "read": 3.0, "write": 3.0, "pool": 3.0}
    assert len(timeouts) == 1


def test_past_deadline_sends_nothing() -> None:
    h = Harness(responses(ok()))
    outcome = h.call(budget=-1)
    assert outcome == DeadlinePassed(None, attempts=0)
    assert h.requests == []


def test_naive_deadline_is_refused() -> None:
    h = Harness(responses(ok()))
    with pytest.raises(ValueError, match="timezone-aware"):
        h.client.call("charge", {"order_id": "o"}, "k", datetime(2030, 1, 1))


# -- undo -------------------------------------------------------------------------------------


def test_an_undo_names_the_forward_key_in_its_body() -> None:
    h = Harness(responses(ok(refund_id="rf-1", status="refunded")))
    outcome = h.undo()
    assert outcome == Succeeded({"refund_id": "rf-1", "status": "refunded"}, attempts=1)
    [request] = h.requests
    assert json.loads(request.content) == {
        "order_id": "order-1",
        "amount": 25,
        "undoes": "order-1:charge",
    }
    assert request.headers["Idempotency-Key"] == "order-1:refund"
    assert str(request.url) == f"{BASE}/refund"


def test_nothing_to_undo_is_its_own_outcome() -> None:
    answer = {"order_id": "order-1", "status": "nothing_to_undo", "undoes": "order-1:charge"}
    h = Harness(responses(error(503, "unavailable"), ok(**answer)))
    assert h.undo() == NothingToUndo(answer, attempts=2)


def test_nothing_to_undo_status_on_a_forward_call_is_just_a_success() -> None:
    h = Harness(responses(ok(status="nothing_to_undo")))
    assert h.call() == Succeeded({"status": "nothing_to_undo"}, attempts=1)


def test_undone_before_applied_is_a_refusal_not_retried() -> None:
    message = "this key was undone before it was applied; it will never take effect"
    h = Harness(responses(error(409, "undone_before_applied", message), ok()))
    outcome = h.call()
    assert outcome == Failed("undone_before_applied", message, transient=False, attempts=1)
    assert len(h.requests) == 1


@pytest.mark.parametrize("undoes", ["", "has space", "order-1:refund"])
def test_an_invalid_undoes_is_refused_before_any_request(undoes: str) -> None:
    h = Harness(responses(ok()))
    with pytest.raises(ValueError, match="undoes"):
        h.undo(undoes=undoes)
    assert h.requests == []


# -- circuit breaker --------------------------------------------------------------------------


def test_open_breaker_fails_fast_then_half_opens_after_reset() -> None:
    healthy = threading.Event()

    def service(request: httpx.Request) -> httpx.Response:
        return ok() if healthy.is_set() else error(503, "unavailable")

    policy = RetryPolicy(max_attempts=2, backoff_initial=0.1)
    h = Harness(service, policy, failure_threshold=4, reset_timeout=30.0)
    assert isinstance(h.call(key="a"), Failed)
    opened = h.call(key="b")  # its second attempt opens the circuit: deferred, not failed
    assert isinstance(opened, Deferred) and opened.attempts == 2
    assert h.breaker.state is BreakerState.OPEN
    sent = len(h.requests)

    h.clock.advance(10.0)
    outcome = h.call(key="c")
    assert isinstance(outcome, Deferred) and outcome.attempts == 0
    assert outcome.retry_at == h.clock.now() + timedelta(seconds=20.0)  # the next trial
    assert outcome.retry_at == opened.retry_at
    assert len(h.requests) == sent  # nothing sent

    h.clock.advance(30.0)
    healthy.set()
    assert h.breaker.state is BreakerState.HALF_OPEN
    assert isinstance(h.call(key="d"), Succeeded)
    assert h.breaker.state is BreakerState.CLOSED
    assert len(h.requests) == sent + 1


def test_failed_half_open_trial_reopens() -> None:
    h = Harness(responses(error(503, "x")), RetryPolicy(max_attempts=1), failure_threshold=1)
    h.call(key="a")
    h.clock.advance(31)
    trial = h.call(key="b")  # the trial fails and reopens the circuit
    assert h.breaker.state is BreakerState.OPEN
    assert isinstance(trial, Deferred) and trial.attempts == 1
    assert trial.retry_at == h.clock.now() + timedelta(seconds=30.0)
    assert isinstance(h.call(key="c"), Deferred)


def test_breaker_opening_mid_call_stops_the_retries() -> None:
    h = Harness(responses(error(503, "x")), RetryPolicy(max_attempts=5), failure_threshold=2)
    outcome = h.call()
    assert isinstance(outcome, Deferred)
    assert outcome.attempts == 2 and outcome.last_error == "x: m"
    assert len(h.clock.sleeps) == 1  # no backoff once the circuit is open: it defers at once
    assert outcome.retry_at == h.clock.now() + timedelta(seconds=30.0)


def test_a_half_open_circuit_busy_with_its_trial_defers_by_the_minimum() -> None:
    h = Harness(responses(ok()), failure_threshold=1, reset_timeout=5.0)
    h.breaker.acquire()
    h.breaker.record_failure()
    h.clock.advance(5.0)
    assert h.breaker.acquire()  # another caller's trial call is in flight
    outcome = h.call()
    assert isinstance(outcome, Deferred) and outcome.attempts == 0
    assert outcome.retry_at == h.clock.now() + timedelta(seconds=MIN_DEFER_SECONDS)
    assert h.requests == []


def test_a_circuit_opening_at_complete_by_answers_nothing() -> None:
    def slow_failure(request: httpx.Request) -> httpx.Response:
        h.clock.advance(request.extensions["timeout"]["read"])  # the whole attempt timeout
        raise httpx.ReadTimeout("no answer", request=request)

    h = Harness(slow_failure, RetryPolicy(attempt_timeout=10.0), failure_threshold=1)
    outcome = h.call(budget=4.0)  # the first attempt is cut to 4 s and ends at complete-by
    assert h.breaker.state is BreakerState.OPEN
    assert isinstance(outcome, DeadlinePassed) and outcome.attempts == 1


def test_a_call_refused_by_the_service_is_never_deferred() -> None:
    """A definitive answer is reported even if the circuit is open by the time it arrives."""

    def refuse_while_others_open_the_circuit(request: httpx.Request) -> httpx.Response:
        for _ in range(3):
            h.breaker.record_failure()  # other calls' failures, meanwhile
        return error(402, "card_declined")

    h = Harness(refuse_while_others_open_the_circuit, failure_threshold=3)
    outcome = h.call()
    assert isinstance(outcome, Failed) and outcome.code == "card_declined"


def test_refusals_do_not_trip_the_breaker() -> None:
    h = Harness(responses(error(402, "card_declined")), failure_threshold=2)
    for key in "abcd":
        h.call(key=key)
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
    http = httpx.Client(transport=httpx.MockTransport(lambda r: ok()))
    one = RemoteServiceClient("svc-x", "http://x.test/svc", http)
    two = RemoteServiceClient("svc-x", "http://x.test/svc", http)
    assert one.breaker is two.breaker is breaker_for("svc-x")


def test_calls_through_one_breaker_are_not_serialised() -> None:
    """A slow call must not hold up another call to the same service (pybreaker would)."""
    release = threading.Event()
    entered = threading.Event()

    def service(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["order_id"] == "slow":
            entered.set()
            assert release.wait(10), "the fast call never finished while the slow one ran"
        return ok()

    h = Harness(service)
    slow = threading.Thread(target=h.call, kwargs={"key": "slow", "order_id": "slow"})
    slow.start()
    try:
        assert entered.wait(10)
        assert isinstance(h.call(key="fast", order_id="fast"), Succeeded)
    finally:
        release.set()
        slow.join(10)


# -- logging ----------------------------------------------------------------------------------


def test_logs_one_debug_line_per_attempt_and_one_info_line_per_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(responses(error(503, "unavailable"), error(503, "unavailable"), ok()))
    with caplog.at_level(logging.DEBUG, logger="agent.remote_client"):
        h.call()
    records = [r for r in caplog.records if r.name == "agent.remote_client"]
    attempts = [r.getMessage() for r in records if r.levelno == logging.DEBUG]
    finals = [r.getMessage() for r in records if r.levelno == logging.INFO]
    assert len(attempts) == 3 and len(finals) == 1
    for number, line in enumerate(attempts, start=1):
        assert "service=payment operation=charge key=order-1:charge" in line
        assert f"attempt={number}" in line
    assert "attempts=3 outcome=succeeded" in finals[0]


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


def test_invalid_arguments_are_refused() -> None:
    http = httpx.Client(transport=httpx.MockTransport(lambda r: ok()))
    with pytest.raises(ValueError, match="base_url"):
        RemoteServiceClient("payment", "payment.local", http)
    client = RemoteServiceClient("payment", BASE, http, CircuitBreaker("p"))
    deadline = datetime.now(UTC) + timedelta(seconds=5)
    with pytest.raises(ValueError, match="operation"):
        client.call("../charge", {"order_id": "o"}, "k", deadline)
    for key in ("", "with space", "ключ", "k" * 256):
        with pytest.raises(ValueError, match="idempotency_key"):
            client.call("charge", {"order_id": "o"}, key, deadline)
    with pytest.raises(ValueError):
        client.call("charge", {"amount": float("nan")}, "k", deadline)
