"""RemoteServiceClient on the worker's remote HTTP (adapters.remote_http) against the real
fake-services server: real sockets, real time."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from adapters.remote_http import RemoteHttp, RemoteService
from devstack.fakes.remote_services import FakeServices
from service.circuit import BreakerSettings, CircuitBreaker
from service.outcomes import CallOutcome, DeadlinePassed, Deferred, Failed, NothingToUndo, Succeeded
from service.remote_calls import RemoteServiceClient, RetryPolicy

pytestmark = pytest.mark.anyio

FAST = RetryPolicy(max_attempts=None, attempt_timeout=5.0, backoff_initial=0.01, backoff_max=0.05)


@pytest.fixture
def fakes() -> Iterator[FakeServices]:
    with FakeServices.start(seed=3) as running:
        yield running


@pytest.fixture
async def http(fakes: FakeServices) -> AsyncIterator[RemoteHttp]:
    """The fake services as the worker's remote HTTP reaches them."""
    remote = RemoteHttp([RemoteService("payment", fakes.url("payment"))])
    yield remote
    await remote.close()


def client_for(http: RemoteHttp, service: str = "payment", **policy: Any) -> RemoteServiceClient:
    settings = BreakerSettings(failure_threshold=1000)  # these tests are about retries
    return RemoteServiceClient(
        service,
        http,
        CircuitBreaker(service, settings),
        policy=dataclasses.replace(FAST, **policy),
    )


async def charge(client: RemoteServiceClient, order: str, budget: float = 10.0) -> CallOutcome:
    deadline = datetime.now(UTC) + timedelta(seconds=budget)
    return await client.call(
        "charge", {"order_id": order, "amount": 10}, f"{order}:charge", deadline
    )


async def refund(client: RemoteServiceClient, order: str, budget: float = 10.0) -> CallOutcome:
    deadline = datetime.now(UTC) + timedelta(seconds=budget)
    return await client.call(
        "refund",
        {"order_id": order, "amount": 10},
        f"{order}:refund",
        deadline,
        undoes=f"{order}:charge",
    )


async def test_transient_faults_are_retried_to_exactly_one_effect(
    fakes: FakeServices, http: RemoteHttp
) -> None:
    fakes.set_profile({"services": {"payment": {"fail_first_n": 3}}})
    outcome = await charge(client_for(http), "order-1")
    assert isinstance(outcome, Succeeded) and outcome.attempts == 4
    assert outcome.result["order_id"] == "order-1"
    assert [e["idempotency_key"] for e in fakes.ledger()] == ["order-1:charge"]


async def test_many_orders_through_random_faults_apply_once_each(
    fakes: FakeServices, http: RemoteHttp
) -> None:
    fakes.set_profile(
        {"default": {"transient_rate": 0.4, "throttle_rate": 0.1, "retry_after_seconds": 0}}
    )
    client = client_for(http)
    outcomes = [await charge(client, f"order-{n}") for n in range(30)]
    assert all(isinstance(o, Succeeded) for o in outcomes)
    assert sum(o.attempts for o in outcomes) > 30  # faults really happened
    keys = [e["idempotency_key"] for e in fakes.ledger()]
    assert sorted(keys) == sorted(f"order-{n}:charge" for n in range(30))


async def test_a_hang_is_bounded_by_the_deadline(fakes: FakeServices, http: RemoteHttp) -> None:
    fakes.set_profile({"default": {"hang_rate": 1.0, "hang_seconds": 60}})
    started = time.monotonic()
    outcome = await charge(client_for(http), "order-1", budget=1.0)
    elapsed = time.monotonic() - started
    assert isinstance(outcome, DeadlinePassed)
    assert "timeout" in (outcome.last_error or "")
    # It waited for the deadline, not for the hang: a loaded machine adds far less than 30 s.
    assert 0.9 <= elapsed < 30
    assert fakes.ledger() == []


async def test_hung_attempts_time_out_and_late_answers_do_not_double_apply(
    fakes: FakeServices, http: RemoteHttp
) -> None:
    fakes.set_profile({"default": {"hang_rate": 1.0, "hang_seconds": 3}})  # then answers
    client = client_for(http, attempt_timeout=0.5)
    outcome = await charge(client, "order-1", budget=2.0)
    assert isinstance(outcome, DeadlinePassed) and outcome.attempts >= 2
    fakes.set_profile({})
    assert isinstance(await charge(client, "order-1", budget=30.0), Succeeded)
    # Each hung request answers its long-gone client in the end, replaying the effect.
    deadline = time.monotonic() + 60
    while fakes.stats().get("replays", 0) < outcome.attempts:
        assert time.monotonic() < deadline, f"hung requests not answered: {fakes.stats()}"
        await asyncio.sleep(0.1)
    assert len(fakes.ledger()) == 1


async def test_crash_after_effect_then_retry_gives_one_effect(
    fakes: FakeServices, http: RemoteHttp
) -> None:
    fakes.set_profile({"default": {"crash_after_effect_rate": 1.0}})
    outcome = await charge(client_for(http), "order-1")
    assert isinstance(outcome, Succeeded) and outcome.attempts == 2
    [entry] = fakes.ledger()
    assert outcome.result["effect_seq"] == entry["seq"]


async def test_a_decline_is_reported_without_retry(fakes: FakeServices, http: RemoteHttp) -> None:
    fakes.set_profile({"services": {"payment": {"decline_order_ids": ["order-9"]}}})
    outcome = await charge(client_for(http), "order-9")
    assert isinstance(outcome, Failed)
    assert (outcome.code, outcome.transient, outcome.attempts) == ("card_declined", False, 1)
    assert fakes.stats()["requests"] == 1
    assert fakes.ledger() == []


async def test_retry_after_past_the_deadline_gives_up_at_once(
    fakes: FakeServices, http: RemoteHttp
) -> None:
    fakes.set_profile({"default": {"throttle_rate": 1.0, "retry_after_seconds": 120}})
    started = time.monotonic()
    outcome = await charge(client_for(http), "order-1", budget=60.0)
    assert isinstance(outcome, DeadlinePassed) and outcome.attempts == 1
    # At once, not at the deadline: a loaded machine adds far less than 30 s.
    assert time.monotonic() - started < 30


async def test_unreachable_service_defers_once_the_circuit_opens() -> None:
    with FakeServices.start() as gone:
        url = gone.url("payment")
    http = RemoteHttp([RemoteService("payment", url)])
    client = RemoteServiceClient(
        "payment",
        http,
        CircuitBreaker("payment", BreakerSettings(failure_threshold=3)),
        policy=FAST,
    )
    before = datetime.now(UTC)
    outcome = await charge(client, "order-1", budget=30.0)
    after = datetime.now(UTC)
    await http.close()
    assert isinstance(outcome, Deferred) and outcome.attempts == 3
    assert "connection_error" in (outcome.last_error or "")
    # The breaker's default reset timeout (30 s) after it opened, during the call.
    assert before + timedelta(seconds=30) <= outcome.retry_at <= after + timedelta(seconds=30)


async def test_undo_after_success_is_reported_with_the_undo_result(
    fakes: FakeServices, http: RemoteHttp
) -> None:
    fakes.set_profile({"default": {"transient_rate": 0.5}})
    client = client_for(http)
    assert isinstance(await charge(client, "order-1"), Succeeded)
    outcome = await refund(client, "order-1")
    assert isinstance(outcome, Succeeded)
    assert outcome.result["status"] == "refunded" and outcome.result["undoes"] == "order-1:charge"
    assert [(e["idempotency_key"], e["undoes"]) for e in fakes.ledger()] == [
        ("order-1:charge", None),
        ("order-1:refund", "order-1:charge"),
    ]


async def test_undo_of_a_forward_lost_in_a_hang_leaves_nothing_in_place(
    fakes: FakeServices, http: RemoteHttp
) -> None:
    """The forward hangs past the agent's deadline and then lands; the undo sent meanwhile
    answers nothing_to_undo, and the late forward, and any retry of it, are refused."""
    # Then it answers: long after the undo below, even on a loaded machine.
    fakes.set_profile({"default": {"hang_rate": 1.0, "hang_seconds": 5.0}})
    client = client_for(http, max_attempts=1, attempt_timeout=0.2)
    lost = await charge(client, "order-1", budget=5.0)
    assert isinstance(lost, Failed) and (lost.code, lost.transient) == ("timeout", True)
    fakes.set_profile({})
    undo = await refund(client, "order-1")
    assert isinstance(undo, NothingToUndo)
    assert undo.result == {
        "order_id": "order-1",
        "status": "nothing_to_undo",
        "undoes": "order-1:charge",
    }
    deadline = time.monotonic() + 60  # until the hung forward request reaches the store
    while fakes.stats().get("refused_after_undo", 0) < 1:
        assert time.monotonic() < deadline, f"the hung forward never landed: {fakes.stats()}"
        await asyncio.sleep(0.1)
    assert fakes.stats()["refused_after_undo"] == 1
    retried = await charge(client, "order-1")
    assert isinstance(retried, Failed)
    assert (retried.code, retried.transient, retried.attempts) == (
        "undone_before_applied",
        False,
        1,
    )
    assert fakes.ledger() == []
    assert [t["idempotency_key"] for t in fakes.tombstones()] == ["order-1:charge"]
