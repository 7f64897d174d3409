"""A cold start on the local host, and an order that still finishes inside its budget.

The real app runs in the local host against the development broker and Azurite, with the
payment agent's first call delayed as Flex Consumption delays the first message after its
function scaled to zero (DEVHOST_COLD_START_SECONDS). The cold start (6 s) is longer than the
step's run budget (STEP_TIMEOUT_SECONDS, 4 s) but inside its queue budget (STEP_QUEUE_SECONDS,
30 s: room for a loaded machine's delays besides the cold start): the run budget counts from
when the agent starts work, so the order ends Processed on its first attempts, with no failure
counted and no retry. Were the budget counted from the claim, the agent would find the request
past its deadline and drop it.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from devstack.host.cold_start import COLD_START_SETTING
from domain.messages import encode
from domain.states import ProcessState
from service.intake import handle_submission
from tests.support.app import hosting, make_runtime, pattern_app
from tests.support.pattern import effects, new_order

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

COLD_START_S = 6.0
FUNCTIONS = ("scheduler_replies", "inventory_agent", "payment_agent", "shipping_agent")


@pytest.fixture
def cold_env(env):
    return env | {
        "STEP_TIMEOUT_SECONDS": "4",
        "STEP_QUEUE_SECONDS": "30",
        COLD_START_SETTING: f"payment_agent:{COLD_START_S:g}",
    }


@pytest.fixture
async def hosted(cold_env):
    rt = await make_runtime(cold_env, "scheduler")
    app, root = pattern_app(rt)
    async with hosting(app, root, rt, settings=cold_env, host_json="host.json",
                       concurrency_override=1, functions=FUNCTIONS) as host:  # fmt: skip
        yield rt, host


async def test_an_order_finishes_inside_its_budget_after_a_cold_start(hosted, fakes):
    rt, host = hosted
    order = new_order()
    started = time.monotonic()
    await handle_submission(encode(order), rt)
    deadline = started + 90
    while (current := await rt.store.load(order.order_id)).state is not ProcessState.PROCESSED:
        assert time.monotonic() < deadline, f"not Processed: {current}"
        await asyncio.sleep(0.2)
    took = time.monotonic() - started
    finished = await rt.store.load(order.order_id)
    assert took >= COLD_START_S, "the payment agent's first call did not wait"
    assert host._invoker.cold_starts.pending == {}
    assert finished.failure_count == 0
    assert [service for service, *_ in effects(fakes, order.order_id)] == [
        "inventory",
        "payment",
        "shipping",
    ]
    stats = host.stats()
    assert {name: stats[name].failures for name in FUNCTIONS} == dict.fromkeys(FUNCTIONS, 0)
    events = [entry.event for entry in await rt.store.get_timeline(order.order_id)]
    assert not any("retry" in event or "recover" in event for event in events), events
