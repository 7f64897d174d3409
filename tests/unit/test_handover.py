"""An operator's action is written by the operations app and sent by the pattern app
(service.handover), in the lifecycle world (tests/support/world.py): the action sends one
SendOwed and nothing else; what the write owes is sent when the pattern app takes it; a crash
between the write and that command loses nothing; a command that comes twice, or after the
order's outbox went, sends nothing twice."""

from __future__ import annotations

import pytest

from domain.messages import AgentRequest, OperatorAlert, SendOwed, message_id_for
from domain.states import ProcessState
from service import handover
from tests.support.world import QUEUES, World
from tests.unit.test_lifecycle_stateful import order_id

pytestmark = pytest.mark.anyio


async def charging(world: World) -> str:
    """An order whose reservation took effect and whose charge is in flight."""
    oid = order_id(0)
    await world.submit(oid, reply_to=None)
    await world.deliver(world.deliverable("agent")[0], "ok")
    await world.deliver(world.deliverable("responses")[0])
    return oid


def sent_since(world: World, seen: int) -> list[tuple[str, object]]:
    return [(s.queue, s.message) for s in world.bus.sent[seen:]]


async def test_an_action_sends_one_command_and_the_pattern_app_sends_what_it_wrote():
    world = World()
    oid = await charging(world)
    seen = len(world.bus.sent)
    assert await world.cancel(oid)
    [(queue, asked)] = sent_since(world, seen)
    cancelled = await world.store.load(oid)
    assert (queue, type(asked)) == (QUEUES["commands"], SendOwed)
    assert isinstance(asked, SendOwed)
    assert (asked.order_id, asked.timeline_seq) == (oid, cancelled.timeline_seq)
    assert message_id_for(asked) == f"owed:{oid}:{cancelled.timeline_seq}"
    [undo] = [o.message for o in cancelled.outbox]
    assert isinstance(undo, AgentRequest) and undo.operation == "undo"

    seen = len(world.bus.sent)
    await world.deliver(world.deliverable("commands")[-1])
    assert [(q, message_id_for(m)) for q, m in sent_since(world, seen)] == [  # type: ignore[arg-type]
        (QUEUES["payment"], message_id_for(undo))
    ]
    assert (await world.store.load(oid)).etag == cancelled.etag, "sending writes nothing"
    await world.drain()
    await world.check_final()


async def test_a_crash_between_the_write_and_the_command_loses_nothing():
    world = World()
    oid = await charging(world)
    seen = len(world.bus.sent)
    assert not await world.cancel(oid, crash_after=0)  # written; the command never left
    assert sent_since(world, seen) == [] and not world.deliverable("commands")
    written = await world.store.load(oid)
    assert written.state is ProcessState.COMPENSATING and written.outbox

    # Nobody else touches it: the Supervisor finds it past its CompleteBy and undoes the charge.
    assert written.complete_by is not None
    world.advance((written.complete_by - world.now).total_seconds() + 11)
    await world.tick()
    await world.drain()
    await world.check_final()
    ended = await world.store.load(oid)
    assert ended.state is ProcessState.ERROR and "cancelled" in (ended.last_error or "")


async def test_a_finished_order_sends_its_outbox_once_however_often_it_is_asked():
    world = World()
    oid = order_id(0)
    await world.submit(oid, reply_to=None)
    await world.deliver(world.deliverable("agent")[0], "decline")
    reply = world.deliverable("responses")[0]
    # The decline is written (Error, its alert owed), and the sends after it fail: a crash.
    await world.deliver(reply, crash_after=0)
    failed = await world.store.load(oid)
    assert failed.state is ProcessState.ERROR
    assert await world.store.index.has(oid, failed.generation)
    ask = SendOwed(order_id=oid, timeline_seq=failed.timeline_seq, requested_by="operator:ann")

    seen = len(world.bus.sent)
    await handover.send_owed(world.rt, ask)
    [(queue, alert)] = sent_since(world, seen)
    assert queue == QUEUES["alerts"] and isinstance(alert, OperatorAlert)
    assert not await world.store.index.has(oid, failed.generation), "it owes nothing now"

    seen = len(world.bus.sent)
    await handover.send_owed(world.rt, ask)  # the same command again, after the window
    assert sent_since(world, seen) == []
    assert (await world.store.load(oid)).etag == failed.etag
