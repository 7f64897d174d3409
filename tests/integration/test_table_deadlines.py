"""The invocation's deadline against the real Azurite behind the storage fault proxy, which
trickles an answer a byte every 0.4 s (no read timeout ever fires): a Supervisor tick's Table
calls end by its bound (its claim, at least service.deadlines.TICK_FLOOR), whatever the storage
does (adapters.deadline)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from azure.core.exceptions import ServiceResponseTimeoutError

from adapters.settings import Connection, Settings
from service import deadlines
from service.sweep import run_tick
from tests.support.proxied_runtime import fresh_tables, runtime_through_proxy
from tests.support.world import QUEUES

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
async def tables(azurite: Any) -> AsyncIterator[dict[str, str]]:
    async with fresh_tables(azurite) as names:
        yield names


async def test_a_tick_ends_by_its_claim_however_slowly_storage_answers(azurite, tables) -> None:
    settings = Settings(
        queues=QUEUES,
        service_urls={},
        servicebus=Connection("sb"),
        storage=Connection("st"),
        supervisor_schedule="*/2 * * * * *",  # a tick's claim: 1.75 s; its bound: the floor
    )
    async with runtime_through_proxy(azurite, tables, settings) as (proxy, rt):
        proxy.arm("trickle", method="GET", path=tables["supervision_table"])
        with pytest.raises(ServiceResponseTimeoutError, match="deadline"):
            await run_tick(rt)
        assert proxy.faults == {"trickle": 1}, "the roster's answer was trickling"
        for _ in range(100):  # the proxy sees the client gone at its next byte
            if proxy.abandoned:
                break
            await asyncio.sleep(0.1)
        assert proxy.abandoned == 1, "the tick stopped reading before the answer ended"
    assert settings.supervisor_claim < deadlines.TICK_FLOOR
