"""The hot path touches orders with point reads and conditional writes only, and costs exactly
what the README's "Cost per order" table says.

Every Table request goes through adapters.tables, where adapters.clients installs a request
hook (adapters.op_counts). Here that hook is replaced by one that records, for each
request, its table and its kind: point read, query, insert, batch, update or delete. Orders go
through the real handlers (intake, agent, replies, commands, the Supervisor's tick) against
Azurite, the development broker and the fake services, one message at a time and one order
after another, so each order's requests are the ones made while it moved.

A query on the orders table is a scan in Azurite (and a partition query at best in Azure): its
cost grows with the orders ever processed. The hot path must not make one. The Supervisor's tick
queries the active-order index and its lease roster by design (its cost follows what is due:
test_supervisor_cost); intake, replies and commands query no table at all.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from azure.servicebus.exceptions import MessageNotFoundError

from adapters import clients
from domain.messages import AgentResponse, encode
from domain.states import ProcessState
from service.commands import handle_command
from service.intake import handle_submission
from service.replies import handle_response
from service.runtime import Runtime
from service.sweep import run_tick
from service.sweep_report import TickReport
from tests.support.app import Clock, QueueReader, make_runtime
from tests.support.pattern import new_order, queue, run_agent_step
from tests.support.table_requests import RequestLog, TableRequest, classify, queries, tally

pytestmark = pytest.mark.anyio

ORDER_STEPS = ("inventory", "payment", "shipping")


def without_row_moves(requests: Counter[TableRequest]) -> dict[str, dict[str, int]]:
    """:func:`tally`, less at most one upsert of the order's index row (a row moved earlier)."""
    moves = requests[TableRequest("active", "update")]
    assert moves <= 1, f"the index row was moved {moves} times: {tally(requests)}"
    return tally(requests - Counter({TableRequest("active", "update"): moves}))


@pytest.fixture
def log(env, monkeypatch) -> RequestLog:
    recorder = RequestLog(
        {
            env["ORDERS_TABLE"]: "orders",
            env["ACTIVE_ORDERS_TABLE"]: "active",
            env["SUPERVISION_TABLE"]: "supervision",
        }
    )
    monkeypatch.setattr(clients, "COUNTS", recorder)
    return recorder


@pytest.fixture
async def runtime(env, log, clock) -> AsyncIterator[Runtime]:
    rt = await make_runtime(env, "scheduler", clock)
    log.take()  # table creation
    yield rt
    await rt.close()


class Journey:
    """Moves orders through the real handlers and keeps each handler's requests apart:
    ``handlers`` (intake, agents, replies, commands) and ``ticks`` (the Supervisor)."""

    def __init__(self, rt: Runtime, reader: QueueReader, clock: Clock, log: RequestLog) -> None:
        self.rt, self.reader, self.clock, self.log = rt, reader, clock, log
        self.handlers: Counter[TableRequest] = Counter()
        self.ticks: Counter[TableRequest] = Counter()

    async def handler(self, action: Callable[[], Awaitable[object]]) -> None:
        await action()
        self.handlers += self.log.take()

    async def tick(self) -> TickReport:
        report = await run_tick(self.rt)
        self.ticks += self.log.take()
        return report

    async def submit(self, workflow: str) -> str:
        order = new_order(workflow=workflow)
        await self.handler(lambda: handle_submission(encode(order), self.rt))
        return order.order_id

    async def step(self, order_id: str, service: str) -> None:
        await self.handler(lambda: run_agent_step(self.rt, self.reader, order_id, service))

    async def transient_failure(self, order_id: str, service: str) -> None:
        """The agent gave up on a transient failure: the step is released for a retry."""
        request = json.loads(self.reader.expect(queue(self.rt, service), order_id))
        failed = AgentResponse(
            order_id=order_id,
            step=request["step"],
            operation="do",
            attempt=request["attempt"],
            idempotency_key=request["idempotency_key"],
            outcome="failed",
            transient=True,
            error_code="unavailable",
        )
        await self.handler(lambda: handle_response(encode(failed), self.rt))

    def silent_agent(self, order_id: str, service: str) -> None:
        """The agent died with the request: nobody answers before CompleteBy."""
        self.reader.expect(queue(self.rt, service), order_id)

    async def retry_command(self, order_id: str) -> None:
        commands = queue(self.rt, "commands")
        try:
            command, _ = self.reader.take_scheduled(commands, order_id)
        except MessageNotFoundError:  # it fell due (and could no longer be cancelled)
            command = self.reader.expect(commands, order_id)
        await self.handler(lambda: handle_command(command, self.rt))

    async def past_complete_by(self, order_id: str) -> None:
        complete_by = (await self.rt.store.load(order_id)).complete_by
        self.log.take()
        assert complete_by is not None
        self.clock.advance((complete_by - self.clock()).total_seconds() + 1)

    async def state(self, order_id: str) -> ProcessState:
        state = (await self.rt.store.load(order_id)).state
        self.log.take()
        return state


async def happy(
    journey: Journey, workflow: str, services: tuple[str, ...]
) -> Counter[TableRequest]:
    before = journey.handlers.copy()
    order_id = await journey.submit(workflow)
    for service in services:
        await journey.step(order_id, service)
    assert await journey.state(order_id) is ProcessState.PROCESSED
    return journey.handlers - before


async def retried(journey: Journey) -> Counter[TableRequest]:
    """Payment fails transiently once; the retry command runs it again."""
    before = journey.handlers.copy()
    order_id = await journey.submit("order")
    await journey.step(order_id, "inventory")
    await journey.transient_failure(order_id, "payment")
    await journey.retry_command(order_id)
    await journey.step(order_id, "payment")
    await journey.step(order_id, "shipping")
    assert await journey.state(order_id) is ProcessState.PROCESSED
    return journey.handlers - before


async def recovered(journey: Journey) -> tuple[Counter[TableRequest], Counter[TableRequest]]:
    """The payment agent dies with its request; the Supervisor releases the step after
    CompleteBy and its retry command runs it again."""
    handlers, ticks = journey.handlers.copy(), journey.ticks.copy()
    order_id = await journey.submit("order")
    await journey.step(order_id, "inventory")
    journey.silent_agent(order_id, "payment")
    await journey.past_complete_by(order_id)
    assert (await journey.tick()).retried == 1
    await journey.retry_command(order_id)
    await journey.step(order_id, "payment")
    await journey.step(order_id, "shipping")
    assert await journey.state(order_id) is ProcessState.PROCESSED
    return journey.handlers - handlers, journey.ticks - ticks


# The README's "Cost per order" table: 6 Table requests for a three-step order (1 index insert,
# 1 create-and-claim transaction, 3 ETag writes, 1 index delete), 4 for a single_step one. No
# read: each reply carries the order as stored when its request was sent (service.resume), and
# its write is conditional on that state's ETag.
THREE_STEPS = {
    "active": {"delete": 1, "insert": 1},
    "orders": {"batch": 4},
}
SINGLE_STEP = {
    "active": {"delete": 1, "insert": 1},
    "orders": {"batch": 2},
}
# A retry costs the release (read + write) and the retry command's claim (read + write): the
# transient failure here is written by hand without the order's snapshot, as an agent that
# predates snapshots answers, and a retry command carries none. The release also moves the
# order's index row when the retry falls due before the step's deadline would have
# (service.apply._index_due): a timing matter, so that upsert is not pinned (a reply whose decision
# moves the row is decided on a read, snapshot or not).
RETRIED = {
    "active": {"delete": 1, "insert": 1},
    "orders": {"batch": 6, "point_read": 2},
}
# Recovered by the Supervisor: its release is in the tick; the handlers cost the create, one
# step, the retry command's claim (read + write), two more steps and the index delete.
RECOVERED = {
    "active": {"delete": 1, "insert": 1},
    "orders": {"batch": 5, "point_read": 1},
}


async def test_orders_move_with_point_reads_and_conditional_writes_only(
    runtime, reader, clock, log
):
    journey = Journey(runtime, reader, clock, log)

    three_steps = await happy(journey, "order", ORDER_STEPS)
    single_step = await happy(journey, "single_step", ("inventory",))
    with_retry = await retried(journey)
    with_recovery, recovery_ticks = await recovered(journey)

    assert tally(three_steps) == THREE_STEPS
    assert sum(three_steps.values()) == 6
    assert tally(single_step) == SINGLE_STEP
    assert sum(single_step.values()) == 4
    assert without_row_moves(with_retry) == RETRIED, tally(with_retry)
    # The Supervisor's recovery: the tick reads the order and releases it (on the orders
    # table, one point read and one batch); the handlers then cost what a retry costs.
    recovery_orders = Counter({r: n for r, n in recovery_ticks.items() if r.table == "orders"})
    assert tally(recovery_orders) == {"orders": {"batch": 1, "point_read": 1}}
    assert without_row_moves(with_recovery) == RECOVERED, tally(with_recovery)

    assert queries(journey.handlers) == 0, tally(journey.handlers)
    assert queries(journey.ticks, "orders") == 0, tally(journey.ticks)
    assert queries(journey.ticks, "active") > 0, "the tick's index queries are seen"


async def test_a_query_on_the_orders_table_is_seen(runtime, log):
    """The detector works: an operator's read of an order's timeline is a partition query,
    and is reported as one."""
    order = new_order()
    await handle_submission(encode(order), runtime)
    log.take()
    await runtime.store.get_timeline(order.order_id)
    await runtime.store.load(order.order_id)
    assert tally(log.take()) == {"orders": {"point_read": 1, "query": 1}}


async def test_a_duplicate_submission_is_answered_with_point_reads(runtime, log):
    """A redelivered submission finds its order by two point reads (details, state), no
    query: Azurite answers any query by scanning the whole table."""
    order = new_order()
    await handle_submission(encode(order), runtime)
    log.take()
    await handle_submission(encode(order), runtime)
    requests = log.take()
    assert queries(requests) == 0, tally(requests)
    assert tally(requests)["orders"]["point_read"] == 2


@pytest.mark.parametrize(
    ("method", "url", "batch", "expected"),
    [
        ("GET", "http://h/acct/orders(PartitionKey='o-1',RowKey='process')", [], "point_read"),
        ("GET", "http://h/acct/orders()?$filter=PartitionKey%20eq%20%27o-1%27", [], "query"),
        ("GET", "http://h/acct/orders()", [], "query"),
        ("GET", "http://h/acct/orders(PartitionKey='o-1',RowKey='p')?$filter=x", [], "query"),
        ("POST", "http://h/acct/$batch", ["http://h/acct/orders"], "batch"),
        ("POST", "http://h/acct/orders", [], "insert"),
        ("PATCH", "http://h/acct/orders(PartitionKey='o',RowKey='r')", [], "update"),
        ("PUT", "http://h/acct/orders(PartitionKey='o',RowKey='r')", [], "update"),
        ("DELETE", "http://h/acct/orders(PartitionKey='o',RowKey='r')", [], "delete"),
    ],
)
def test_request_kinds(method: str, url: str, batch: list[str], expected: str) -> None:
    assert classify(method, url, batch) == ("orders", expected)
