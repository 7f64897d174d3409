"""The Agent function (service.agent): the AgentResponse it sends for each outcome of the
remote call, what it sends nothing for, and what it alerts.

The remote service answers through a stand-in for the worker's remote HTTP
(tests/support/remote_http.py) and the runtime is a stand-in holding only what the agent uses
of service.runtime.Runtime (it records what the bus
sends, after encoding it as the real one does); each response sent is encoded and parsed back,
so it is a valid message.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

from adapters.remote_http import Answer
from domain.messages import (
    EXPIRED,
    MAX_MESSAGE_BYTES,
    AgentRequest,
    AgentResponse,
    MessageBase,
    MessageTooLarge,
    encode,
    message_id_for,
    parse_message,
)
from service import agent as handler
from service.agent import handle_request, remote_client
from service.circuit import BreakerRegistry, BreakerSettings, CircuitBreaker
from service.consistency import INCONSISTENT_REASON
from service.remote_calls import MIN_DEFER_SECONDS, RemoteServiceClient, RetryPolicy
from tests.support.remote_http import FakeRemoteHttp, Handler, Post, json_answer
from tests.support.sent import as_sent

pytestmark = pytest.mark.anyio

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

    def advance(self, seconds: float) -> None:
        self.current += timedelta(seconds=seconds)

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)


class Settings:
    def queue(self, role: str) -> str:
        return f"{role}-queue"


@dataclass
class Bus:
    """The async bus: records what it sends, after encoding it as the real one does."""

    sent: list[tuple[str, MessageBase]] = field(default_factory=list)

    async def send(self, queue: str, message: MessageBase) -> None:
        encode(message)  # what the Service Bus adapter refuses: a message over 256 KiB
        await anyio.lowlevel.checkpoint()
        self.sent.append((queue, message))


class Runtime:
    """What handle_request uses of service.runtime.Runtime, and no more."""

    def __init__(self, service: Handler, **breaker: Any):
        self.clock_ = Clock()
        self.settings = Settings()
        self.bus = Bus()
        self.alerts: list[Any] = []
        self.breaker = CircuitBreaker(
            "payment", BreakerSettings(**breaker), clock=self.clock_.monotonic
        )
        self.breakers = BreakerRegistry()
        self.service = service
        self.remote_http = FakeRemoteHttp(self._answer, {"payment": "http://payment.test/payment"})
        self.requests = self.remote_http.posts
        self.rng = random.Random(1)
        self.agent_clients: dict[str, RemoteServiceClient] = {
            "payment": RemoteServiceClient(
                "payment",
                self.remote_http,  # type: ignore[arg-type]
                self.breaker,
                policy=RetryPolicy(max_attempts=3, backoff_initial=0.1, backoff_max=0.5),
                now=self.clock_.now,
                sleep=self.clock_.sleep,
                rng=random.Random(1),
            )
        }

    def _answer(self, post: Post) -> Answer | Awaitable[Answer]:
        return self.service(post)  # the service as it is now (a test may swap it)

    def clock(self) -> datetime:
        return self.clock_.now()

    def actor(self, role: str) -> str:
        return f"{role}:test"

    async def alert(self, alert: Any) -> None:
        await anyio.lowlevel.checkpoint()
        self.alerts.append(alert)

    async def handle(self, request: AgentRequest | bytes) -> AgentResponse | None:
        body = request if isinstance(request, bytes) else encode(request)
        await handle_request(body, "payment", self)  # type: ignore[arg-type]
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


def answer(status: int, body: dict[str, Any]) -> Callable[[Post], Answer]:
    return lambda _post: json_answer(status, body)


def refusal(code: str, message: str = "no") -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def slow(rt: Runtime, seconds: float) -> Callable[[Post], Answer]:
    """A service that answers 503 after ``seconds`` (of the test's clock)."""

    def service(_post: Post) -> Answer:
        rt.clock_.advance(seconds)
        return json_answer(503, refusal("unavailable"))

    return service


# -- answered ---------------------------------------------------------------------------------


async def test_handle_request_is_a_coroutine_function() -> None:
    rt = Runtime(answer(200, {}))
    pending = handle_request(encode(request()), "payment", rt)  # type: ignore[arg-type]
    assert isinstance(pending, Awaitable) and rt.requests == []  # nothing runs until awaited
    await pending
    assert len(rt.bus.sent) == 1


async def test_a_forward_success_answers_succeeded_with_its_key_and_result() -> None:
    rt = Runtime(answer(200, {"charge_id": "ch-1", "status": "captured"}))
    response = await rt.handle(request("do"))
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
    assert json.loads(sent.body) == PAYLOAD  # a forward call names nothing it undoes
    assert sent.headers["Idempotency-Key"] == FORWARD_KEY


async def test_a_replayed_request_answers_the_same_with_the_same_key() -> None:
    """A redelivered request is sent again under the same Idempotency-Key; the service's
    stored answer comes back and the agent reports it again, unchanged."""
    applied: dict[str, dict[str, Any]] = {}

    def idempotent(post: Post) -> Answer:
        key = post.headers["Idempotency-Key"]
        applied.setdefault(key, {"charge_id": f"ch-{len(applied) + 1}"})
        return json_answer(200, applied[key])

    rt = Runtime(idempotent)
    first = await rt.handle(request("do"))
    rt.bus.sent.clear()
    again = await rt.handle(request("do"))
    assert first is not None and again is not None
    assert first.model_dump(exclude={"responded_at"}) == again.model_dump(exclude={"responded_at"})
    assert first.result == {"charge_id": "ch-1"}
    assert len(applied) == 1
    assert [r.headers["Idempotency-Key"] for r in rt.requests] == [FORWARD_KEY, FORWARD_KEY]


async def test_an_undo_sends_undoes_and_maps_nothing_to_undo() -> None:
    body = {"order_id": "o-1", "status": "nothing_to_undo", "undoes": FORWARD_KEY}
    rt = Runtime(answer(200, body))
    response = await rt.handle(request("undo"))
    assert response is not None
    assert (response.outcome, response.idempotency_key) == ("nothing_to_undo", UNDO_KEY)
    assert response.operation == "undo" and response.result == body
    [sent] = rt.requests
    assert sent.url == "http://payment.test/payment/refund"
    assert sent.headers["Idempotency-Key"] == UNDO_KEY
    assert json.loads(sent.body) == {**PAYLOAD, "undoes": FORWARD_KEY}


async def test_an_undo_that_undid_answers_succeeded() -> None:
    body = {"refund_id": "rf-1", "status": "refunded", "undoes": FORWARD_KEY}
    response = await Runtime(answer(200, body)).handle(request("undo"))
    assert response is not None
    assert (response.outcome, response.idempotency_key, response.result) == (
        "succeeded",
        UNDO_KEY,
        body,
    )


async def test_undone_before_applied_is_a_non_transient_failure() -> None:
    message = "this key was undone before it was applied; it will never take effect"
    rt = Runtime(answer(409, refusal("undone_before_applied", message)))
    response = await rt.handle(request("do"))
    assert response is not None
    assert (response.outcome, response.transient) == ("failed", False)
    assert (response.error_code, response.error_message) == ("undone_before_applied", message)
    assert response.idempotency_key == FORWARD_KEY
    assert len(rt.requests) == 1  # a refusal is not retried


async def test_transient_errors_are_retried_then_succeed() -> None:
    answers = iter([503, 502, 200])

    def flaky(_post: Post) -> Answer:
        status = next(answers)
        if status == 200:
            return json_answer(200, {"charge_id": "ch-3"})
        return json_answer(status, refusal("unavailable"))

    rt = Runtime(flaky, failure_threshold=100)
    response = await rt.handle(request("do"))
    assert response is not None and response.outcome == "succeeded"
    assert response.result == {"charge_id": "ch-3"} and len(rt.requests) == 3


async def test_exhausted_retries_are_a_transient_failure() -> None:
    rt = Runtime(answer(503, refusal("unavailable")), failure_threshold=100)
    response = await rt.handle(request("do"))
    assert response is not None
    assert (response.outcome, response.transient, response.error_code) == (
        "failed",
        True,
        "unavailable",
    )
    assert len(rt.requests) == 3


async def test_a_429_waits_its_retry_after_then_succeeds() -> None:
    answers = iter(
        [
            json_answer(429, refusal("slow_down"), **{"Retry-After": "2"}),
            json_answer(200, {"charge_id": "ch-1"}),
        ]
    )
    rt = Runtime(lambda _post: next(answers))
    response = await rt.handle(request("do"))
    assert response is not None and response.outcome == "succeeded"
    assert rt.clock() == T0 + timedelta(seconds=2)  # the server's wait, not the backoff's


# -- the circuit ------------------------------------------------------------------------------


async def test_an_open_circuit_answers_deferred_with_the_next_trial_time() -> None:
    rt = Runtime(answer(200, {}), failure_threshold=1, reset_timeout=20.0)
    rt.breaker.acquire()
    rt.breaker.record_failure()  # another call opened the circuit ...
    rt.clock_.advance(5.0)  # ... five seconds ago
    response = await rt.handle(request("undo"))
    assert response is not None
    assert (response.outcome, response.idempotency_key) == ("deferred", UNDO_KEY)
    assert response.retry_at == T0 + timedelta(seconds=20.0)
    assert response.error_code is None and response.transient is False
    assert rt.requests == []  # nothing was attempted


async def test_a_circuit_opening_during_the_retries_answers_deferred() -> None:
    rt = Runtime(answer(503, refusal("unavailable")), failure_threshold=2, reset_timeout=9.0)
    response = await rt.handle(request("do"))
    assert response is not None
    assert response.outcome == "deferred"
    assert len(rt.requests) == 2  # the second failure opened it: no third attempt
    assert response.retry_at == rt.clock() + timedelta(seconds=9.0)


async def test_a_deferral_is_never_sooner_than_the_minimum() -> None:
    rt = Runtime(answer(200, {}), failure_threshold=1, reset_timeout=1.0)
    rt.breaker.acquire()
    rt.breaker.record_failure()
    rt.clock_.advance(1.0)
    assert rt.breaker.acquire()  # half-open: another call holds the one trial
    response = await rt.handle(request("do"))
    assert response is not None and response.outcome == "deferred"
    assert response.retry_at == rt.clock() + timedelta(seconds=MIN_DEFER_SECONDS)


# -- time: complete-by and the run budget -----------------------------------------------------


async def test_past_complete_by_nothing_is_called_and_the_attempt_is_reported_expired() -> None:
    rt = Runtime(answer(200, {}))
    rt.clock_.advance(31.0)
    response = await rt.handle(request("do", budget=30.0))
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


async def test_a_request_that_waited_in_the_queue_still_gets_its_whole_run_budget() -> None:
    rt = Runtime(answer(200, {"charge_id": "ch-1"}))
    rt.clock_.advance(50.0)  # picked up 50 s after the claim: within the queue budget
    response = await rt.handle(request("do", budget=90.0, run_budget=30.0))
    assert response is not None and response.outcome == "succeeded"


async def test_a_hang_stopped_by_the_run_budget_reports_a_transient_timeout_at_once() -> None:
    rt = Runtime(answer(200, {}), failure_threshold=100)
    rt.service = slow(rt, 9.0)
    rt.clock_.advance(50.0)  # picked up at +50 s: its call may run until +65 s, not +90 s
    response = await rt.handle(request("do", budget=90.0, run_budget=15.0))
    assert response is not None
    assert (response.outcome, response.transient, response.error_code) == (
        "failed",
        True,
        "timed_out",
    )
    assert "run budget of 15s" in (response.error_message or "")
    assert len(rt.requests) == 2  # the second attempt ran out of the run budget


async def test_a_hang_stopped_by_complete_by_reports_a_transient_timeout() -> None:
    rt = Runtime(answer(200, {}), failure_threshold=100)
    rt.service = slow(rt, 9.0)
    rt.clock_.advance(75.0)  # picked up at +75 s: complete-by (+90 s) comes before the budget
    response = await rt.handle(request("do", budget=90.0, run_budget=30.0))
    assert response is not None
    assert (response.outcome, response.transient, response.error_code) == (
        "failed",
        True,
        "timed_out",
    )
    assert "within complete-by" in (response.error_message or "")
    assert rt.requests  # it did try: the service was reached
    assert rt.alerts == []


async def test_without_a_run_budget_the_call_runs_until_complete_by() -> None:
    rt = Runtime(answer(200, {}), failure_threshold=100)
    rt.service = slow(rt, 9.0)
    response = await rt.handle(request("do", budget=15.0, run_budget=None))
    assert response is not None and response.error_code == "timed_out"
    assert len(rt.requests) == 2


async def test_too_little_time_left_to_call_is_reported_expired() -> None:
    rt = Runtime(answer(200, {}), failure_threshold=100)
    rt.clock_.advance(29.99)  # 0.01 s left: too little to start an attempt
    response = await rt.handle(request("do", budget=30.0, run_budget=None))
    assert response is not None and response.error_code == EXPIRED
    assert rt.requests == []


# -- malformed --------------------------------------------------------------------------------


async def test_a_malformed_request_is_alerted_not_answered() -> None:
    rt = Runtime(answer(200, {}))
    bad = json.loads(encode(request("undo")))
    del bad["undoes"]  # an undo must name the forward key
    assert await rt.handle(json.dumps(bad).encode()) is None
    [alert] = rt.alerts
    assert alert.reason == "bad_message" and "undoes" in alert.detail
    assert alert.source == "agent-payment:test"
    assert rt.requests == []


async def test_a_request_no_call_could_carry_out_is_alerted_not_answered() -> None:
    rt = Runtime(answer(200, {}))
    contradictory = request("undo").model_copy(
        update={"payload": {**PAYLOAD, "undoes": "o-1:some-other-key"}}
    )
    assert await rt.handle(contradictory) is None
    [alert] = rt.alerts
    assert (alert.reason, alert.order_id, alert.severity) == ("bad_agent_request", "o-1", "error")
    assert "payment cannot carry out refund" in alert.detail
    assert rt.requests == []


@pytest.mark.parametrize(
    ("code", "expected"),
    [("card declined!", "card_declined"), ("___", "remote_error"), ("x" * 80, "x" * 64)],
)
async def test_an_unusual_error_code_still_makes_a_valid_response(code: str, expected: str) -> None:
    rt = Runtime(answer(402, refusal(code)))
    response = await rt.handle(request("do"))
    assert response is not None and response.error_code == expected


# -- the request against its order -----------------------------------------------------------


async def test_a_request_its_order_sent_is_carried_out() -> None:
    rt = Runtime(answer(200, {"charge_id": "ch-1"}))
    response = await rt.handle(as_sent(request("do")))
    assert response is not None and response.outcome == "succeeded"
    assert rt.alerts == [] and len(rt.requests) == 1


@pytest.mark.parametrize(
    ("change", "differs"),
    [
        ({"attempt": 3}, "no such request"),
        ({"action": "refund"}, "it differs in action"),
        ({"payload": {**PAYLOAD, "amount": 99_999}}, "it differs in payload"),
        ({"complete_by": T0 + timedelta(seconds=300)}, "it differs in complete_by"),
        ({"idempotency_key": "o-1:charge_payment:do:2"}, "it differs in idempotency_key"),
    ],
)
async def test_a_request_that_disagrees_with_its_order_is_refused_without_a_call(
    change: dict[str, Any], differs: str
) -> None:
    sent = as_sent(request("do"))
    rt = Runtime(answer(200, {"charge_id": "ch-1"}))
    assert await rt.handle(sent.model_copy(update=change)) is None
    assert rt.requests == [] and rt.bus.sent == []
    [alert] = rt.alerts
    assert (alert.reason, alert.severity, alert.order_id) == (INCONSISTENT_REASON, "error", "o-1")
    assert alert.detail.startswith("payment refused do charge_payment attempt")
    assert differs in alert.detail


async def test_an_inconsistent_request_is_alerted_once_per_message_that_carried_it() -> None:
    """Named by the message (issue 28, item 3): the same bytes sent twice are two alerts, one
    message delivered twice is one."""
    body = encode(as_sent(request("do")).model_copy(update={"attempt": 3}))
    rt = Runtime(answer(200, {"charge_id": "ch-1"}))
    for cause in ("payment/m-1", "payment/m-2", "payment/m-1"):
        await handle_request(body, "payment", rt, caused_by=cause)  # type: ignore[arg-type]
    assert [a.reason for a in rt.alerts] == [INCONSISTENT_REASON] * 3
    assert len({a.detail for a in rt.alerts}) == 1, "the same text each time"
    ids = [message_id_for(a) for a in rt.alerts]
    assert ids[0] != ids[1] and ids[0] == ids[2]
    assert rt.requests == [] and rt.bus.sent == []


async def test_an_undo_dressed_as_its_do_is_refused() -> None:
    undo = as_sent(request("undo"))
    do = request("do", attempt=undo.attempt).model_copy(update={"resume": undo.resume})
    rt = Runtime(answer(200, {"charge_id": "ch-1"}))
    assert await rt.handle(do) is None
    [alert] = rt.alerts
    assert "holds no such request (it holds: undo charge_payment attempt 2)" in alert.detail
    assert rt.requests == []


async def test_a_request_carrying_another_orders_or_no_readable_snapshot_is_refused() -> None:
    other = as_sent(
        request("do").model_copy(
            update={"order_id": "o-2", "idempotency_key": "o-2:charge_payment:do:1"}
        )
    )
    for resume in (other.resume, "r1.not-a-snapshot"):
        rt = Runtime(answer(200, {"charge_id": "ch-1"}))
        assert await rt.handle(request("do").model_copy(update={"resume": resume})) is None
        [alert] = rt.alerts
        assert "the order snapshot it carries cannot be read or is another order's" in alert.detail
        assert rt.requests == []


async def test_a_request_without_a_snapshot_is_carried_out_unchecked() -> None:
    """The Scheduler leaves out a snapshot too large to carry: the request still goes."""
    response = await Runtime(answer(200, {"charge_id": "ch-1"})).handle(request("do"))
    assert response is not None and response.outcome == "succeeded" and response.resume is None


# -- the reply --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("service", "operation", "outcome"),
    [
        (answer(200, {"charge_id": "ch-1"}), "do", "succeeded"),
        (
            answer(200, {"status": "nothing_to_undo", "undoes": FORWARD_KEY}),
            "undo",
            "nothing_to_undo",
        ),
        (answer(402, refusal("card_declined")), "do", "failed"),
        (answer(503, refusal("unavailable")), "do", "failed"),
    ],
)
async def test_every_answer_echoes_the_requests_snapshot_unchanged(
    service: Callable[[Post], Answer], operation: str, outcome: str
) -> None:
    """The snapshot is the Scheduler's (service.resume): the agent checks the request against it
    (service.consistency), passes it back as it came and never sends it to the remote service."""
    rt = Runtime(service, failure_threshold=100)
    carrying = as_sent(request(operation))
    assert carrying.resume is not None
    response = await rt.handle(carrying)
    assert response is not None and response.outcome == outcome
    assert response.resume == carrying.resume
    assert all(carrying.resume.encode() not in sent.body for sent in rt.requests)


async def test_a_deferral_echoes_the_snapshot_too() -> None:
    rt = Runtime(answer(200, {}), failure_threshold=1, reset_timeout=20.0)
    rt.breaker.acquire()
    rt.breaker.record_failure()
    carrying = as_sent(request("do"))
    response = await rt.handle(carrying)
    assert response is not None
    assert (response.outcome, response.resume) == ("deferred", carrying.resume)


async def test_an_answer_too_large_with_its_snapshot_is_sent_without_it() -> None:
    """The snapshot only spares the Scheduler a read; the answer itself must get through."""
    big = as_sent(request("do").model_copy(update={"payload": {"blob": "y" * 20_000}}))
    assert big.resume is not None and len(big.resume) > 20_000
    result = {"blob": "x" * (MAX_MESSAGE_BYTES - len(big.resume) // 2)}
    rt = Runtime(answer(200, result))
    response = await rt.handle(big)
    assert response is not None
    assert (response.outcome, response.resume, response.result) == ("succeeded", None, result)


async def test_an_answer_too_large_without_a_snapshot_is_not_swallowed() -> None:
    result = {"blob": "x" * MAX_MESSAGE_BYTES}
    rt = Runtime(answer(200, result))
    with pytest.raises(MessageTooLarge):
        await rt.handle(request("do"))
    assert rt.bus.sent == []


async def test_a_failed_send_fails_the_invocation_so_the_request_is_redelivered() -> None:
    class Unreachable(Exception):
        pass

    class FailingBus(Bus):
        async def send(self, queue: str, message: MessageBase) -> None:
            raise Unreachable("the broker is away")

    rt = Runtime(answer(200, {"charge_id": "ch-1"}))
    rt.bus = FailingBus()
    with pytest.raises(Unreachable):
        await rt.handle(request("do"))
    assert len(rt.requests) == 1  # the call was made; its retry is safe under the same key


# -- on one event loop ------------------------------------------------------------------------


async def test_requests_waiting_on_their_services_do_not_hold_each_other_up() -> None:
    release = anyio.Event()
    entered = anyio.Event()

    async def service(post: Post) -> Answer:
        if post.headers["Idempotency-Key"] == FORWARD_KEY:
            entered.set()
            await release.wait()
        return json_answer(200, {"ok": True})

    rt = Runtime(service)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(handle_request, encode(request("do")), "payment", rt)
            await entered.wait()
            await handle_request(encode(request("undo")), "payment", rt)  # type: ignore[arg-type]
            assert [m.idempotency_key for _, m in rt.bus.sent] == [UNDO_KEY]  # type: ignore[attr-defined]
            release.set()
    assert [m.idempotency_key for _, m in rt.bus.sent] == [UNDO_KEY, FORWARD_KEY]  # type: ignore[attr-defined]


def test_the_client_of_a_service_is_built_once_on_the_runtimes_http_and_breaker() -> None:
    service = "payment-handler-test"
    rt = Runtime(answer(200, {}))
    rt.remote_http.urls[service] = "http://svc.test/x"
    rt.agent_clients.clear()
    client = remote_client(rt, service)  # type: ignore[arg-type]
    assert isinstance(client, RemoteServiceClient)
    assert client._http is rt.remote_http and client.breaker is rt.breakers.get(service)
    assert remote_client(rt, service) is client  # type: ignore[arg-type]
    assert rt.agent_clients == {service: client}
    assert handler.RemoteServiceClient is RemoteServiceClient
