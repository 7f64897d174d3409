"""The remote client over core.http_transport against the real fake-services server: every test
of tests/integration/test_remote_client_http.py again, its ``http`` client on
:class:`~core.http_transport.PooledTransport` (faults, hangs, Retry-After, an unreachable
service), and the async remote client on :class:`~core.http_transport.PooledAsyncTransport`
through transient faults and a hang."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from agent.circuit import BreakerSettings, CircuitBreaker
from agent.outcomes import DeadlinePassed, Succeeded
from agent.remote_client import RemoteServiceClient as AsyncRemoteServiceClient
from core.http_transport import PooledAsyncTransport, PooledTransport
from devstack.fakes.remote_services import FakeServices
from tests.integration.test_remote_client_http import *  # noqa: F403 (its tests run here too)
from tests.integration.test_remote_client_http import FAST


@pytest.fixture
def http() -> Iterator[httpx.Client]:  # overrides the imported module's: the pooled transport
    with httpx.Client(transport=PooledTransport()) as client:
        assert isinstance(client._transport, PooledTransport)
        yield client


def async_client_for(fakes: FakeServices, http: httpx.AsyncClient) -> AsyncRemoteServiceClient:
    return AsyncRemoteServiceClient(
        "payment",
        fakes.url("payment"),
        http,
        CircuitBreaker("payment", BreakerSettings(failure_threshold=1000)),
        policy=FAST,
    )


@pytest.mark.anyio
async def test_async_faults_are_retried_to_one_effect_each(fakes: FakeServices) -> None:
    fakes.set_profile(
        {"default": {"transient_rate": 0.4, "throttle_rate": 0.1, "retry_after_seconds": 0}}
    )
    async with httpx.AsyncClient(transport=PooledAsyncTransport()) as http:
        client = async_client_for(fakes, http)
        deadline = datetime.now(UTC) + timedelta(seconds=10)
        outcomes = [
            await client.call("charge", {"order_id": f"o-{n}", "amount": 10}, f"o-{n}:c", deadline)
            for n in range(20)
        ]
    assert all(isinstance(o, Succeeded) for o in outcomes)
    assert sum(o.attempts for o in outcomes) > 20  # faults really happened
    keys = sorted(e["idempotency_key"] for e in fakes.ledger())
    assert keys == sorted(f"o-{n}:c" for n in range(20))


@pytest.mark.anyio
async def test_async_a_hang_is_bounded_by_the_deadline(fakes: FakeServices) -> None:
    fakes.set_profile({"default": {"hang_rate": 1.0, "hang_seconds": 30}})
    async with httpx.AsyncClient(transport=PooledAsyncTransport()) as http:
        client = async_client_for(fakes, http)
        started = time.monotonic()
        deadline = datetime.now(UTC) + timedelta(seconds=1)
        outcome = await client.call("charge", {"order_id": "o", "amount": 1}, "o:c", deadline)
    elapsed = time.monotonic() - started
    assert isinstance(outcome, DeadlinePassed)
    assert "timeout" in (outcome.last_error or "")
    assert 0.9 <= elapsed < 1.5
    assert fakes.ledger() == []
