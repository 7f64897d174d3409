"""A step's deadline has two parts: the wait for an agent (queue budget) and the call (run
budget), staged against real Azurite, the development broker and the fake remote services.

A request that waits in its queue is not a failure: it still gets its whole run budget when an
agent picks it up. A call that hangs is: the agent stops it after the run budget and says so at
once, instead of leaving the Supervisor to find the order only after the whole CompleteBy.
"""

from __future__ import annotations

import pytest

from domain.states import ProcessState
from service.agent import handle_request
from service.intake import handle_submission
from service.replies import handle_response
from service.sweep import run_tick
from tests.support.app import make_runtime
from tests.support.pattern import new_order, queue, run_agent_step

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

RUN_BUDGET_S = 1.0
QUEUE_BUDGET_S = 30.0


@pytest.fixture
async def rt(env, clock):  # type: ignore[no-untyped-def]
    env |= {"STEP_TIMEOUT_SECONDS": str(RUN_BUDGET_S), "STEP_QUEUE_SECONDS": str(QUEUE_BUDGET_S)}
    runtime = await make_runtime(env, "scheduler", clock)
    yield runtime
    await runtime.close()


async def test_complete_by_allows_for_the_queue_and_the_request_carries_the_run_budget(rt, reader):  # type: ignore[no-untyped-def]
    order = new_order()
    await handle_submission(order.model_dump_json().encode(), rt)
    process = await rt.store.load(order.order_id)
    assert process.complete_by is not None
    budget = (process.complete_by - process.updated_at).total_seconds()
    assert budget == pytest.approx(QUEUE_BUDGET_S + RUN_BUDGET_S, abs=0.01)
    request = await run_agent_step(rt, reader, order.order_id, "inventory")
    assert request["run_budget_s"] == RUN_BUDGET_S


async def test_a_request_that_waited_longer_than_its_run_budget_still_succeeds(rt, reader, clock):  # type: ignore[no-untyped-def]
    order = new_order()
    await handle_submission(order.model_dump_json().encode(), rt)
    clock.advance(20)  # a backlog: picked up 20 s after the claim, 20 run budgets late
    assert (await run_tick(rt)).retried == 0  # queued, not overdue
    await run_agent_step(rt, reader, order.order_id, "inventory")
    process = await rt.store.load(order.order_id)
    assert process.current_step == "charge_payment" and process.failure_count == 0


async def test_a_hung_call_is_reported_after_its_run_budget_and_retried_without_the_supervisor(  # type: ignore[no-untyped-def]
    rt, reader, fakes
):
    fakes.set_profile({"services": {"inventory": {"hang_rate": 1.0, "hang_seconds": 3}}})
    order = new_order()
    await handle_submission(order.model_dump_json().encode(), rt)
    claimed = await rt.store.load(order.order_id)
    await handle_request(reader.expect(queue(rt, "inventory"), order.order_id), "inventory", rt)
    reply = reader.expect(queue(rt, "responses"), order.order_id)
    await handle_response(reply, rt)
    released = await rt.store.load(order.order_id)
    assert released.state is ProcessState.PENDING and released.failure_count == 1
    assert "timed_out" in (released.last_error or "")
    assert claimed.complete_by is not None and rt.clock() < claimed.complete_by
    assert reader.expect(queue(rt, "commands"), order.order_id)  # its retry, after its delay
