"""Resume snapshots against Azurite and the development broker (service.resume).

What the reply handler decides on instead of a point read must be what the point read would
return, ETag included: every request an order sends, taken off its queue, carries a snapshot
equal to the order loaded from the table at that moment. The snapshot survives the agent
unchanged, and its size stays small (measured here for a three-step order).
"""

from __future__ import annotations

import json

import pytest

from domain.messages import AgentRequest, AgentResponse, parse_message
from domain.states import ProcessState
from service import resume
from service.agent import handle_request
from service.intake import handle_submission
from service.replies import handle_response
from service.runtime import Runtime
from tests.support.app import QueueReader
from tests.support.pattern import SERVICES, new_order, queue

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


@pytest.fixture
def env(env):
    """A step budget no test here comes near: each request is read off the shared queue and handled
    some time after its claim, and the shared five seconds could pass on a loaded machine. No
    deadline is under test here."""
    return env | {"STEP_TIMEOUT_SECONDS": "60"}


MAX_SNAPSHOT_BYTES = 5 * 1024
"""A three-step order's snapshots measure 2.7-3.2 KB, 3.6-4.0 KB when it names a reply queue
(its status updates are in the outbox)."""


async def step(rt: Runtime, reader: QueueReader, order_id: str, service: str) -> tuple[int, int]:
    """Deliver ``service``'s request and its answer; (snapshot size, request size) in bytes."""
    body = reader.expect(queue(rt, service), order_id)
    request = parse_message(body, AgentRequest)
    assert request.resume is not None, "every request carries its order's snapshot"
    assert resume.restore(request.resume, order_id) == await rt.store.load(order_id), (
        "the snapshot is the order as a point read returns it, ETag included"
    )
    await handle_request(body, service, rt)
    reply_body = reader.expect(queue(rt, "responses"), order_id)
    assert parse_message(reply_body, AgentResponse).resume == request.resume, "echoed unchanged"
    await handle_response(reply_body, rt)
    return len(request.resume), len(body)


@pytest.mark.parametrize("reply_to", [False, True], ids=["no reply queue", "reply queue"])
async def test_each_request_carries_the_order_as_a_read_returns_it(
    rt, reader, servicebus, reply_to
):
    submitted = new_order(reply_to=servicebus.queue("order-status") if reply_to else None)
    await handle_submission(submitted.model_dump_json().encode(), rt)

    sizes = [await step(rt, reader, submitted.order_id, service) for service in SERVICES]

    assert (await rt.store.load(submitted.order_id)).state is ProcessState.PROCESSED
    snapshots = [size for size, _ in sizes]
    assert max(snapshots) <= MAX_SNAPSHOT_BYTES, snapshots
    print(json.dumps({"reply_to": reply_to, "snapshot_bytes": snapshots, "request_bytes": sizes}))


async def test_a_redelivered_reply_with_its_stale_snapshot_changes_nothing(rt, reader):
    """The reply is handled, then comes again (a lost settlement): its snapshot is stale, the
    write conditional on it fails (412), and the read shows the answer applied already."""
    submitted = new_order()
    oid = submitted.order_id
    await handle_submission(submitted.model_dump_json().encode(), rt)
    await handle_request(reader.expect(queue(rt, "inventory"), oid), "inventory", rt)
    reply = reader.expect(queue(rt, "responses"), oid)
    await handle_response(reply, rt)
    moved = await rt.store.load(oid)

    await handle_response(reply, rt)

    assert await rt.store.load(oid) == moved, "nothing written"
    request = parse_message(reader.expect(queue(rt, "payment"), oid), AgentRequest)
    assert (request.step, request.attempt) == ("charge_payment", 2)
    assert reader.take(queue(rt, "payment"), oid, wait=1.0) is None, "sent once"
