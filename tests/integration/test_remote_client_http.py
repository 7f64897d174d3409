"""RemoteServiceClient against the real fake-services server: real sockets, real time."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from agent.circuit import BreakerSettings, CircuitBreaker
from agent.outcomes import CallOutcome, DeadlinePassed, Failed, Succeeded
from agent.remote_client import RemoteServiceClient, RetryPolicy
from devstack.fakes.remote_services import FakeServices

FAST = RetryPolicy(max_attempts=None, attempt_timeout=5.0, backoff_initial=0.01, backoff_max=0.05)


@pytest.fixture
def fakes() -> Iterator[FakeServices]:
    with FakeServices.start(seed=3) as running:
        yield running


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client() as client:
        yield client


def client_for(
    fakes: FakeServices, http: httpx.Client, service: str = "payment", **policy: Any
) -> RemoteServiceClient:
    settings = BreakerSettings(failure_threshold=1000)  # these tests are about retries
    return RemoteServiceClient(
        service,
        fakes.url(service),
        http,
        CircuitBreaker(service, settings),
        policy=dataclasses.replace(FAST, **policy),
    )


def charge(client: RemoteServiceClient, order: str, budget: float = 10.0) -> CallOutcome:
    deadline = datetime.now(UTC) + timedelta(seconds=budget)
    return client.call("charge", {"order_id": order, "amount": 10}, f"{order}:charge", deadline)


def test_transient_faults_are_retried_to_exactly_one_effect(
    fakes: FakeServices, http: httpx.Client
) -> None:
    fakes.set_profile({"services": {"payment": {"fail_first_n": 3}}})
    outcome = charge(client_for(fakes, http), "order-1")
    assert isinstance(outcome, Succeeded) and outcome.attempts == 4
    assert outcome.result["order_id"] == "order-1"
    assert [e["idempotency_key"] for e in fakes.ledger()] == ["order-1:charge"]


def test_many_orders_through_random_faults_apply_once_each(
    fakes: FakeServices, http: httpx.Client
) -> None:
    fakes.set_profile(
        {"default": {"transient_rate": 0.4, "throttle_rate": 0.1, "retry_after_seconds": 0}}
    )
    client = client_for(fakes, http)
    outcomes = [charge(client, f"order-{n}") for n in range(30)]
    assert all(isinstance(o, Succeeded) for o in outcomes)
    assert sum(o.attempts for o in outcomes) > 30  # faults really happened
    keys = [e["idempotency_key"] for e in fakes.ledger()]
    assert sorted(keys) == sorted(f"order-{n}:charge" for n in range(30))


def test_a_hang_is_bounded_by_the_deadline(fakes: FakeServices, http: httpx.Client) -> None:
    fakes.set_profile({"default": {"hang_rate": 1.0, "hang_seconds": 30}})
    started = time.monotonic()
    outcome = charge(client_for(fakes, http), "order-1", budget=1.0)
    elapsed = time.monotonic() - started
    assert isinstance(outcome, DeadlinePassed)
    assert "timeout" in (outcome.last_error or "")
    assert 0.9 <= elapsed < 1.5
    assert fakes.ledger() == []


def test_hung_attempts_time_out_and_late_answers_do_not_double_apply(
    fakes: FakeServices, http: httpx.Client
) -> None:
    fakes.set_profile({"default": {"hang_rate": 1.0, "hang_seconds": 0.6}})  # then answers
    client = client_for(fakes, http, attempt_timeout=0.2)
    outcome = charge(client, "order-1", budget=0.7)
    assert isinstance(outcome, DeadlinePassed) and outcome.attempts >= 2
    fakes.set_profile({})
    assert isinstance(charge(client, "order-1", budget=5.0), Succeeded)
    time.sleep(0.8)  # every hung request has now answered its long-gone client
    assert len(fakes.ledger()) == 1
    assert fakes.stats()["replays"] >= outcome.attempts


def test_crash_after_effect_then_retry_gives_one_effect(
    fakes: FakeServices, http: httpx.Client
) -> None:
    fakes.set_profile({"default": {"crash_after_effect_rate": 1.0}})
    outcome = charge(client_for(fakes, http), "order-1")
    assert isinstance(outcome, Succeeded) and outcome.attempts == 2
    [entry] = fakes.ledger()
    assert outcome.result["effect_seq"] == entry["seq"]


def test_a_decline_is_reported_without_retry(fakes: FakeServices, http: httpx.Client) -> None:
    fakes.set_profile({"services": {"payment": {"decline_order_ids": ["order-9"]}}})
    outcome = charge(client_for(fakes, http), "order-9")
    assert isinstance(outcome, Failed)
    assert (outcome.code, outcome.transient, outcome.attempts) == ("card_declined", False, 1)
    assert fakes.stats()["requests"] == 1
    assert fakes.ledger() == []


def test_retry_after_past_the_deadline_gives_up_at_once(
    fakes: FakeServices, http: httpx.Client
) -> None:
    fakes.set_profile({"default": {"throttle_rate": 1.0, "retry_after_seconds": 5}})
    started = time.monotonic()
    outcome = charge(client_for(fakes, http), "order-1", budget=2.0)
    assert isinstance(outcome, DeadlinePassed) and outcome.attempts == 1
    assert time.monotonic() - started < 0.5


def test_unreachable_service_is_transient(http: httpx.Client) -> None:
    with FakeServices.start() as gone:
        url = gone.url("payment")
    client = RemoteServiceClient(
        "payment",
        url,
        http,
        CircuitBreaker("payment", BreakerSettings(failure_threshold=3)),
        policy=FAST,
    )
    outcome = charge(client, "order-1", budget=5.0)
    assert isinstance(outcome, Failed)
    assert outcome.code == "circuit_open" and "connection_error" in outcome.message
