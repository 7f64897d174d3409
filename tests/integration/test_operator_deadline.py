"""An HTTP request of the operations app has a deadline, as every other invocation has
(service.deadlines.http_request): Azure's front end gives up on it after 230 s, so its Table
calls end before that, and it answers that it ran out of time. Against the real Azurite behind
the storage fault proxy, which trickles an answer a byte every 0.4 s (no read timeout fires)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from adapters import deadline
from adapters.settings import Connection, Settings
from service import deadlines
from service.operations import orders
from tests.support.operations import OperationsApp, call, serving
from tests.support.proxied_runtime import fresh_tables, runtime_through_proxy
from tests.support.world import QUEUES

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.timeout(180)]
SETTINGS = Settings(
    queues=QUEUES, service_urls={}, servicebus=Connection("sb"), storage=Connection("st")
)


@pytest.fixture
async def tables(azurite: Any) -> AsyncIterator[dict[str, str]]:
    async with fresh_tables(azurite) as names:
        yield names


@pytest.fixture
async def installed(  # type: ignore[no-untyped-def]
    operations, azurite, tables
) -> AsyncIterator[tuple[Any, dict[str, str], OperationsApp]]:
    """The operations app on a Runtime whose Table calls go through the fault proxy."""
    async with runtime_through_proxy(azurite, tables, SETTINGS) as (proxy, rt):
        async with serving(operations, rt) as handlers:
            yield proxy, tables, handlers


async def test_a_request_runs_within_the_front_ends_time(installed, monkeypatch):
    *_, handlers = installed
    seen: list[float | None] = []
    show = orders.show_order

    async def noting(*args: Any, **kwargs: Any) -> Any:
        seen.append(deadline.remaining())
        return await show(*args, **kwargs)

    monkeypatch.setattr(orders, "show_order", noting)
    status, answer = await call(handlers, "show_order", route={"order_id": "o-none"})
    assert (status, answer["error"]["code"]) == (404, "order_not_found")
    bound = (deadlines.HTTP_TIMEOUT - deadlines.ANSWER_MARGIN).total_seconds()
    [left] = seen
    assert left is not None and 0 < left <= bound
    assert deadline.remaining() is None, "the bound ends with the request"


async def test_a_request_whose_storage_trickles_is_cut_and_says_so(installed, monkeypatch):
    proxy, tables, handlers = installed
    short = deadlines.ANSWER_MARGIN + timedelta(seconds=2)
    monkeypatch.setattr(deadlines, "HTTP_TIMEOUT", short)
    proxy.arm("trickle", method="GET", path=tables["orders_table"])
    status, answer = await call(handlers, "show_order", route={"order_id": "o-slow"})
    assert (status, answer["error"]["code"]) == (500, "out_of_time")
    assert "ran out of time: try again" in answer["error"]["message"]
    assert proxy.faults == {"trickle": 1}, "the order's answer was trickling"
