"""The Agent function's mapping from a remote call's outcome to the AgentResponse it sends.

The remote service is an httpx.MockTransport and the runtime a stand-in holding only what the
agent uses; each response sent is encoded and parsed back, so it is a valid message.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from agent.circuit import BreakerSettings, CircuitBreaker
from agent.handler import handle_request
from agent.remote_client import MIN_DEFER_SECONDS, RemoteServiceClient, RetryPolicy
from core.messages import (
    EXPIRED,
    MAX_MESSAGE_BYTES,
    AgentRequest,
    AgentResponse,
    MessageBase,
    encode,
    parse_message,
)
from tests.support.sent import as_sent

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
FORWARD_KEY = "o-1:charge_payment:do:1"
UNDO_KEY = "o-1:charge_payment:undo:1"
PAYLOAD = {"order_id": "o-1", "amount": 2500, "currency": "EUR"}


class Clock:
    def __init__(self) -> None:
        self.current = T0

    def now(self) -> datetime:
        return self.current

    def monotonic(self) -> float:
        return (self.current - T0).total_seconds()

    def sleep(self, seconds: float) -> None:
        self.current += timedelta(seconds=seconds)


@dataclass
class Settings:
    def queue(self, role: str) -> str:
        return f"{role}-queue"


@dataclass
class Bus:
    sent: list[tuple[str, MessageBase]] = field(default_factory=list)

    def send(self, queue: str, message: MessageBase) -> None:
        self.sent.append((queue, message))


class Runtime:
    """What handle_request uses of core.runtime.Runtime, and no more."""

    def __init__(self, service: Callable[[httpx.Request], httpx.Response], **breaker: Any):
        self.clock_ = Clock()
        self.settings = Settings()
        self.bus = Bus()
        self.alerts: list[Any] = []
        self.requests: list[httpx.Request] = []
        self.breaker = CircuitBreaker(
            "payment", BreakerSettings(**breaker), clock=self.clock_.monotonic
        )

        self.service = service

        def transport(request: httpx.Request) -> httpx.Response:
            self.requests.append(request)
            return self.service(request)

        self.client = RemoteServiceClient(
            "payment",
            "http://payment.test/payment",
            httpx.Client(transport=httpx.MockTransport(transport)),
            self.breaker,
            policy=RetryPolicy(max_attempts=3, backoff_initial=0.1, backoff_max=0.5),
            now=self.clock_.now,
            sleep=self.clock_.sleep,
            rng=random.Random(1),
        )

    def clock(self) -> datetime:
        return self.clock_.now()

    @property
    def agent_clients(self) -> dict[str, RemoteServiceClient]:
        return {"payment": self.client}

    def actor(self, role: str) -> str:
        return f"{role}:test"

    def alert(self, alert: Any) -> None:
        self.alerts.append(alert)

    def handle(self, request: AgentRequest | bytes) -> AgentResponse | None:
        body = request if isinstance(request, bytes) else encode(request)
        handle_request(body, "payment", self)  # type: ignore[arg-type]
        if not self.bus.sent:
            return None
        [(queue, response)] = self.bus.sent
        assert queue == "responses-queue"
        # What the scheduler will read: the response survives its own wire format.
        return parse_message(encode(response), AgentResponse)


def request(
    operation: str = "do", budget: float = 30.0, attempt: int = 2, run_budget: float | None = None
) -> AgentRequest:
    undo = operation == "undo"
    return AgentRequest(
        run_budget_s=run_budget,
        order_id="o-1",
        step="charge_payment",
        operation=operation,  # type: ignore[arg-type]
        action="refund" if undo else "charge",
        attempt=attempt,
        complete_by=T0 + timedelta(seconds=budget),
        idempotency_key=UNDO_KEY if undo else FORWARD_KEY,
        undoes=FORWARD_KEY if undo else None,
        payload=PAYLOAD,
    )


def answer(status: int, body: dict[str, Any]) -> Callable[[httpx.Request], httpx.Response]:
    return lambda _request: httpx.Response(status, json=body)


def refusal(status: int, code: str, message: str = "no") -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def test_a_forward_success_answers_succeeded_with_its_key_and_result() -> None:
    rt = Runtime(answer(200, {"charge_id": "ch-1", "status": "captured"}))
    response = rt.handle(request("do"))
    assert response is not None
    assert (response.outcome, response.idempotency_key) == ("succeeded", FORWARD_KEY)
    assert (response.order_id, response.step, response.operation, response.attempt) == (
        "o-1",
        "charge_payment",
        "do",
        2,
    )
    assert response.result == {"charge_id": "ch-1", "status": "captured"}
    assert response.retry_at is None and response.error_code is None
    [sent] = rt.requests
    assert json.loads(sent.content) == PAYLOAD  # a forward call names nothing it undoes
    assert sent.headers["Idempotency-Key"] == FORWARD_KEY


def test_an_undo_sends_undoes_and_maps_nothing_to_undo() -> None:
    body = {"order_id": "o-1", "status": "nothing_to_undo", "undoes": FORWARD_KEY}
    rt = Runtime(answer(200, body))
    response = rt.handle(request("undo"))
    assert response is not None
    assert (response.outcome, response.idempotency_key) == ("nothing_to_undo", UNDO_KEY)
    assert response.operation == "undo" and response.result == body
    [sent] = rt.requests
    assert str(sent.url) == "http://payment.test/payment/refund"
    assert sent.headers["Idempotency-Key"] == UNDO_KEY
    assert json.loads(sent.content) == {**PAYLOAD, "undoes": FORWARD_KEY}


def test_an_undo_that_undid_answers_succeeded() -> None:
    body = {"refund_id": "rf-1", "status": "refunded", "undoes": FORWARD_KEY}
    response = Runtime(answer(200, body)).handle(request("undo"))
    assert response is not None
    assert (response.outcome, response.idempotency_key, response.result) == (
        "succeeded",
        UNDO_KEY,
        body,
    )


def test_undone_before_applied_is_a_non_transient_failure() -> None:
    message = "this key was undone before it was applied; it will never take effect"
    rt = Runtime(answer(409, refusal(409, "undone_before_applied", message)))
    response = rt.handle(request("do"))
    assert response is not None
    assert (response.outcome, response.transient) == ("failed", False)
    assert (response.error_code, response.error_message) == ("undone_before_applied", message)
    assert response.idempotency_key == FORWARD_KEY
    assert len(rt.requests) == 1  # a refusal is not retried


def test_exhausted_retries_are_a_transient_failure() -> None:
    rt = Runtime(answer(503, refusal(503, "unavailable")), failure_threshold=100)
    response = rt.handle(request("do"))
    assert response is not None
    assert (response.outcome, response.transient, response.error_code) == (
        "failed",
        True,
        "unavailable",
    )
    assert len(rt.requests) == 3


def test_an_open_circuit_answers_deferred_with_the_next_trial_time() -> None:
    rt = Runtime(answer(200, {}), failure_threshold=1, reset_timeout=20.0)
    rt.breaker.acquire()
    rt.breaker.record_failure()  # another call opened the circuit ...
    rt.clock_.sleep(5.0)  # ... five seconds ago
    response = rt.handle(request("undo"))
    assert response is not None
    assert (response.outcome, response.idempotency_key) == ("deferred", UNDO_KEY)
    assert response.retry_at == T0 + timedelta(seconds=20.0)
    assert response.error_code is None and response.transient is False
    assert rt.requests == []  # nothing was attempted


def test_a_circuit_opening_during_the_retries_answers_deferred() -> None:
    rt = Runtime(answer(503, refusal(503, "unavailable")), failure_threshold=2, reset_timeout=9.0)
    response = rt.handle(request("do"))
    assert response is not None
    assert response.outcome == "deferred"
    assert len(rt.requests) == 2  # the second failure opened it: no third attempt
    assert response.retry_at == rt.clock() + timedelta(seconds=9.0)


def test_a_deferral_is_never_sooner_than_the_minimum() -> None:
    rt = Runtime(answer(200, {}), failure_threshold=1, reset_timeout=1.0)
    rt.breaker.acquire()
    rt.breaker.record_failure()
    rt.clock_.sleep(1.0)
    assert rt.breaker.acquire()  # half-open: another call holds the one trial
    response = rt.handle(request("do"))
    assert response is not None and response.outcome == "deferred"
    assert response.retry_at == rt.clock() + timedelta(seconds=MIN_DEFER_SECONDS)


def test_past_complete_by_nothing_is_called_and_the_attempt_is_reported_expired() -> None:
    rt = Runtime(answer(200, {}))
    rt.clock_.sleep(31.0)
    response = rt.handle(request("do", budget=30.0))
    assert response is not None
    assert (response.outcome, response.transient, response.error_code) == (
        "failed",
        True,
        EXPIRED,
    )
    assert "taken up 1.0s after complete-by; the service was not called" in (
        response.error_message or ""
    )
    assert rt.requests == [] and rt.alerts == []


def slow(rt: Runtime, seconds: float) -> Callable[[httpx.Request], httpx.Response]:
    """A service that answers 503 after ``seconds`` (of the test's clock)."""

    def service(_request: httpx.Request) -> httpx.Response:
        rt.clock_.sleep(seconds)
        return httpx.Response(503, json=refusal(503, "unavailable"))

    return service


def test_a_request_that_waited_in_the_queue_still_gets_its_whole_run_budget() -> None:
    rt = Runtime(answer(200, {"charge_id": "ch-1"}))
    rt.clock_.sleep(50.0)  # picked up 50 s after the claim: within the queue budget
    response = rt.handle(request("do", budget=90.0, run_budget=30.0))
    assert response is not None and response.outcome == "succeeded"


def test_a_call_past_its_run_budget_reports_a_transient_timeout_at_once() -> None:
    rt = Runtime(answer(200, {}), failure_threshold=100)
    rt.service = slow(rt, 9.0)
    rt.clock_.sleep(50.0)  # picked up at +50 s: its call may run until +65 s, not until +90 s
    response = rt.handle(request("do", budget=90.0, run_budget=15.0))
    assert response is not None
    assert (response.outcome, response.transient, response.error_code) == (
        "failed",
        True,
        "timed_out",
    )
    assert "run budget of 15s" in (response.error_message or "")
    assert len(rt.requests) == 2  # the second attempt ran out of the run budget


def test_a_call_stopped_by_complete_by_reports_a_transient_timeout() -> None:
    rt = Runtime(answer(200, {}), failure_threshold=100)
    rt.service = slow(rt, 9.0)
    rt.clock_.sleep(75.0)  # picked up at +75 s: complete-by (+90 s) comes before the budget
    response = rt.handle(request("do", budget=90.0, run_budget=30.0))
    assert response is not None and response.error_code == "timed_out"
    assert rt.requests  # it did try


def test_without_a_run_budget_the_call_runs_until_complete_by() -> None:
    rt = Runtime(answer(200, {}), failure_threshold=100)
    rt.service = slow(rt, 9.0)
    response = rt.handle(request("do", budget=15.0, run_budget=None))
    assert response is not None and response.error_code == "timed_out"
    assert len(rt.requests) == 2


def test_a_malformed_request_is_alerted_not_answered() -> None:
    rt = Runtime(answer(200, {}))
    bad = json.loads(encode(request("undo")))
    del bad["undoes"]  # an undo must name the forward key
    assert rt.handle(json.dumps(bad).encode()) is None
    [alert] = rt.alerts
    assert alert.reason == "bad_message" and "undoes" in alert.detail
    assert rt.requests == []


@pytest.mark.parametrize(
    ("code", "expected"),
    [("card declined!", "card_declined"), ("___", "remote_error"), ("x" * 80, "x" * 64)],
)
def test_an_unusual_error_code_still_makes_a_valid_response(code: str, expected: str) -> None:
    rt = Runtime(answer(402, refusal(402, code)))
    response = rt.handle(request("do"))
    assert response is not None and response.error_code == expected


@pytest.mark.parametrize(
    ("service", "operation", "outcome"),
    [
        (answer(200, {"charge_id": "ch-1"}), "do", "succeeded"),
        (
            answer(200, {"status": "nothing_to_undo", "undoes": FORWARD_KEY}),
            "undo",
            "nothing_to_undo",
        ),
        (answer(402, refusal(402, "card_declined")), "do", "failed"),
        (answer(503, refusal(503, "unavailable")), "do", "failed"),
    ],
)
def test_every_answer_echoes_the_requests_snapshot_unchanged(
    service: Callable[[httpx.Request], httpx.Response], operation: str, outcome: str
) -> None:
    """The snapshot is the Scheduler's (core.resume): the agent checks the request against it
    (agent.consistency), passes it back as it came and never sends it to the remote service."""
    rt = Runtime(service, failure_threshold=100)
    carrying = as_sent(request(operation))
    assert carrying.resume is not None
    response = rt.handle(carrying)
    assert response is not None and response.outcome == outcome
    assert response.resume == carrying.resume
    assert all(carrying.resume.encode() not in sent.content for sent in rt.requests)


def test_a_deferral_echoes_the_snapshot_too() -> None:
    rt = Runtime(answer(200, {}), failure_threshold=1, reset_timeout=20.0)
    rt.breaker.acquire()
    rt.breaker.record_failure()
    carrying = as_sent(request("do"))
    response = rt.handle(carrying)
    assert response is not None
    assert (response.outcome, response.resume) == ("deferred", carrying.resume)


def test_a_request_without_a_snapshot_is_answered_without_one() -> None:
    response = Runtime(answer(200, {"charge_id": "ch-1"})).handle(request("do"))
    assert response is not None and response.resume is None


@dataclass
class EncodingBus(Bus):
    """Refuses what the Service Bus adapter would refuse: a message over 256 KiB."""

    def send(self, queue: str, message: MessageBase) -> None:
        encode(message)
        super().send(queue, message)


def test_an_answer_too_large_with_its_snapshot_is_sent_without_it() -> None:
    """The snapshot only spares the Scheduler a read; the answer itself must get through."""
    big = as_sent(request("do").model_copy(update={"payload": {"blob": "y" * 20_000}}))
    assert big.resume is not None and len(big.resume) > 20_000
    result = {"blob": "x" * (MAX_MESSAGE_BYTES - len(big.resume) // 2)}
    rt = Runtime(answer(200, result))
    rt.bus = EncodingBus()
    response = rt.handle(big)
    assert response is not None
    assert (response.outcome, response.resume, response.result) == ("succeeded", None, result)
