"""Resume snapshots (service.resume): the order as stored, carried by a request or retry command and
echoed by the reply, so the Scheduler applies the answer without reading the order first.

The codec round trip, its refusal of anything malformed, and the shell's use of it
(service.apply.handle) on the in-memory store: no read when the snapshot is current, and the read
it always did when the snapshot is stale (412), forged, about another order or absent.
"""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from datetime import timedelta

import pytest

from adapters.store.rows import order_entity, order_from_entity
from domain.events import Replied
from domain.messages import (
    MAX_RESUME_CHARS,
    AgentRequest,
    AgentResponse,
    SchedulerCommand,
    encode,
    message_id_for,
    parse_message,
)
from domain.order import Failures, Order, StepState
from domain.states import ProcessState
from service import apply, resume
from tests.support.world import CLOCK_SKEW, QUEUES, Envelope, World

pytestmark = pytest.mark.anyio

ORDER = "order-1"


# ----------------------------------------------------------------------------- helpers


async def world_with_order(order_id: str = ORDER) -> World:
    world = World()
    assert await world.submit(order_id)
    return world


def requests(world: World, order_id: str = ORDER) -> list[Envelope]:
    return [
        e
        for e in world.deliverable("agent")
        if isinstance(e.message, AgentRequest) and e.message.order_id == order_id
    ]


def the_request(world: World, order_id: str = ORDER) -> AgentRequest:
    (envelope,) = requests(world, order_id)
    world.pending.remove(envelope)
    assert isinstance(envelope.message, AgentRequest)
    return envelope.message


def reply(request: AgentRequest, outcome: str = "succeeded", **fields: object) -> AgentResponse:
    """The agent's answer to ``request``, echoing its snapshot (override with ``resume=``)."""
    fields.setdefault("responded_at", request.requested_at)
    if outcome == "transient":
        fields = {"outcome": "failed", "transient": True, "error_code": "unavailable", **fields}
    else:
        fields = {"outcome": outcome, **fields}
    fields.setdefault("resume", request.resume)
    return AgentResponse(
        order_id=request.order_id,
        step=request.step,
        operation=request.operation,
        attempt=request.attempt,
        idempotency_key=request.idempotency_key,
        **fields,  # type: ignore[arg-type]
    )


class Reads:
    """Counts the store's point reads of orders."""

    def __init__(self, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        load = world.store.load

        async def counted(order_id: str) -> Order:
            self.count += 1
            return await load(order_id)

        monkeypatch.setattr(world.store, "load", counted)


async def handle(world: World, response: AgentResponse) -> None:
    """The Scheduler handles ``response``; what it sends is queued in ``world``."""
    actor = "scheduler:test"
    assert await world.run(
        lambda: apply.handle(world.rt, response.order_id, Replied(response), actor=actor)
    )


async def events(world: World, order_id: str = ORDER) -> list[str]:
    return [entry.event for entry in await world.store.get_timeline(order_id)]


def token_of(payload: object) -> str:
    raw = json.dumps(payload).encode()
    return resume.PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


# ---------------------------------------------------------------------------- the codec


async def test_a_snapshot_restores_the_order_as_stored_etag_included() -> None:
    world = await world_with_order()
    await handle(world, reply(the_request(world)))
    stored = await world.store.load(ORDER)
    assert stored.reply_to and stored.outbox and stored.etag, "a full record"

    token = resume.snapshot(stored)

    assert token is not None and token.startswith("r1.")
    assert resume.restore(token, ORDER) == stored


async def test_a_snapshot_is_normalised_as_a_point_read_of_the_row_is() -> None:
    """What the store clips or leaves out on the way to the table, the snapshot does too, so a
    decision on it is the decision on a read."""
    world = await world_with_order()
    stored = await world.store.load(ORDER)
    long = replace(stored, last_error="é" * 5000, locked_by="")

    restored = resume.restore(resume.snapshot(long), ORDER)

    assert restored == order_from_entity(order_entity(long), long.etag)
    assert restored is not None and restored.locked_by is None
    assert len((restored.last_error or "").encode()) <= 2048


async def test_the_snapshot_in_a_request_holds_no_snapshot() -> None:
    world = await world_with_order()
    request = the_request(world)
    assert request.resume is not None

    restored = resume.restore(request.resume, ORDER)

    assert restored is not None
    inner = [o.message for o in restored.outbox if isinstance(o.message, AgentRequest)]
    assert inner == [request.model_copy(update={"resume": None})], "the request, bare"
    stored = (await world.store.load(ORDER)).outbox
    assert all(getattr(o.message, "resume", None) is None for o in stored), "never stored"


async def test_an_order_without_an_etag_or_too_large_gets_no_snapshot(monkeypatch) -> None:
    world = await world_with_order()
    stored = await world.store.load(ORDER)
    assert resume.snapshot(replace(stored, etag="")) is None
    assert resume.snapshot(replace(stored, etag='W/"x"\r\nX-Evil: 1')) is None
    monkeypatch.setattr(resume, "MAX_RESUME_CHARS", 100)
    assert resume.snapshot(stored) is None


async def test_a_snapshot_of_another_order_is_ignored() -> None:
    world = await world_with_order()
    await world.submit("order-2")
    other = resume.snapshot(await world.store.load("order-2"))
    assert resume.restore(other, ORDER) is None
    assert resume.restore(other, "order-2") is not None


@pytest.mark.parametrize(
    "token",
    [
        None,
        "",
        "r2.AAAA",
        "r1.",
        "r1.!!!!",
        "r1." + base64.urlsafe_b64encode(b"not json").decode(),
        "r1." + base64.urlsafe_b64encode(b"\xff\xfe").decode(),
        token_of([1, 2, 3]),
        token_of({"t": "e1", "d": []}),
        token_of({"t": "", "d": [], "e": {}}),
        token_of({"t": "e 1\r\n", "d": [], "e": {}}),
        token_of({"t": "e1", "d": ["CreatedAt"], "e": {"CreatedAt": 5}}),
        token_of({"t": "e1", "d": [], "e": {"OrderID": ORDER}}),
        token_of({"t": "e1", "d": [], "e": {"OrderID": ORDER, "CreatedAt": "2026-01-01"}}),
    ],
)
def test_anything_but_a_well_formed_snapshot_is_ignored(token: str | None) -> None:
    assert resume.restore(token, ORDER) is None


async def test_an_oversized_snapshot_is_ignored_unread() -> None:
    world = await world_with_order()
    stored = await world.store.load(ORDER)
    token = resume.snapshot(stored)
    assert token is not None
    padded = token + "A" * (MAX_RESUME_CHARS - len(token) + 4)
    assert resume.restore(padded, ORDER) is None


async def test_a_resend_with_another_snapshot_is_the_same_message() -> None:
    """Duplicate detection keys on the MessageId: a request resent after a later write (with
    that write's snapshot) is still one request."""
    world = await world_with_order()
    request = the_request(world)
    later = request.model_copy(update={"resume": resume.PREFIX + "AAAA"})
    assert message_id_for(later) == message_id_for(request)
    assert message_id_for(reply(later)) == message_id_for(reply(request))

    await world.bus.send(QUEUES["inventory"], later)
    assert world.bus.on(QUEUES["inventory"]).count(later) == 0, "dropped as a duplicate"


async def test_messages_without_a_snapshot_encode_as_before() -> None:
    world = await world_with_order()
    bare = the_request(world).model_copy(update={"resume": None})
    assert b"resume" not in encode(bare)
    assert "resume" not in bare.model_dump(mode="json")
    assert parse_message(encode(bare), AgentRequest) == bare


# ----------------------------------------------------------------------- the shell's use


async def test_a_reply_with_its_snapshot_is_applied_without_a_read(monkeypatch) -> None:
    world = await world_with_order()
    reads = Reads(world, monkeypatch)

    await handle(world, reply(the_request(world)))

    assert reads.count == 0
    moved = await world.store.load(ORDER)
    assert moved.step("reserve_inventory").state is StepState.SUCCEEDED
    assert (moved.current_step, moved.attempt) == ("charge_payment", 2)
    assert await events(world) == ["created", "step_succeeded"]


async def test_the_snapshot_decides_exactly_what_a_read_would() -> None:
    with_snapshot, with_read = await world_with_order(), await world_with_order()
    for world, echo in ((with_snapshot, True), (with_read, False)):
        request = the_request(world)
        await handle(world, reply(request, resume=request.resume if echo else None))

    def comparable(order: Order) -> Order:
        return replace(order, etag="", write_id="")

    assert comparable(await with_snapshot.store.load(ORDER)) == comparable(
        await with_read.store.load(ORDER)
    )
    assert sent_bare(with_snapshot) == sent_bare(with_read)


def sent_bare(world: World) -> list[tuple[str, object]]:
    """What went out, snapshots left out (they hold a random WriteId)."""
    return [
        (s.queue, s.message.model_copy(update={"resume": None}) if _resumable(s) else s.message)
        for s in world.bus.sent
    ]


def _resumable(sent: object) -> bool:
    return isinstance(getattr(sent, "message", None), AgentRequest)


@pytest.mark.parametrize("why", ["absent", "another order", "malformed"])
async def test_a_reply_without_a_usable_snapshot_reads_the_order_first(why, monkeypatch) -> None:
    world = await world_with_order()
    await world.submit("order-2")
    tokens = {
        "absent": None,
        "another order": resume.snapshot(await world.store.load("order-2")),
        "malformed": resume.PREFIX + "AAAA",
    }
    request = the_request(world)
    reads = Reads(world, monkeypatch)

    await handle(world, reply(request, resume=tokens[why]))

    assert reads.count == 1
    assert (await world.store.load(ORDER)).step("reserve_inventory").state is StepState.SUCCEEDED
    assert await events(world) == ["created", "step_succeeded"]


async def test_a_stale_snapshot_loses_its_write_and_the_fresh_state_decides(monkeypatch) -> None:
    """The Supervisor released the step (deadline passed) while its agent was still working;
    then the success arrives with the snapshot of the order as it was before the release. The
    conditional write fails; the answer is applied to the released order (a definitive answer
    for the step in flight counts whichever attempt carried it), and the retry command that
    follows, stale in turn, claims nothing: the step is applied once, the next step sent
    once."""
    world = await world_with_order()
    request = the_request(world)
    world.advance((request.complete_by + CLOCK_SKEW - world.now).total_seconds() + 1)
    assert await world.tick()
    released = await world.store.load(ORDER)
    assert (released.state, released.locked_by, released.failure_count) == (
        ProcessState.PENDING,
        None,
        1,
    )
    reads = Reads(world, monkeypatch)

    await handle(world, reply(request))

    assert reads.count == 1, "the lost race, then one read"
    moved = await world.store.load(ORDER)
    assert (moved.state, moved.current_step, moved.attempt) == (
        ProcessState.PROCESSING,
        "charge_payment",
        2,
    )
    assert (moved.failure_count, moved.timeline_seq) == (0, released.timeline_seq + 1)
    assert await events(world) == ["created", "released", "step_succeeded"]

    (retry,) = [e for e in world.pending if e.queue == QUEUES["commands"]]
    await world.deliver(retry)

    assert await events(world) == ["created", "released", "step_succeeded"], (
        "the retry claims nothing"
    )
    assert [m.attempt for m in world.bus.on(QUEUES["payment"])] == [2]
    assert [m.attempt for m in world.bus.on(QUEUES["inventory"])] == [1]


async def test_a_duplicate_reply_reads_and_changes_nothing(monkeypatch) -> None:
    """Its snapshot is stale and decides a write that fails; the read finds the answer applied
    already and resends what the order owes (duplicate detection drops it)."""
    world = await world_with_order()
    answer = reply(the_request(world))
    await handle(world, answer)
    sent = len(world.bus.sent)
    reads = Reads(world, monkeypatch)

    await handle(world, answer)

    assert reads.count == 1
    assert await events(world) == ["created", "step_succeeded"]
    assert len(world.bus.sent) == sent


async def test_an_answer_for_a_replaced_attempt_loses_its_write_and_changes_nothing(
    monkeypatch,
) -> None:
    """Attempt 1 timed out and attempt 2 is in flight when attempt 1's transient failure comes
    in: on its snapshot it would release the step; the write fails, and on the read it is an
    answer for an attempt no longer in flight, which says only whose failure attempt 1 was."""
    world = await world_with_order()
    request = the_request(world)
    world.advance((request.complete_by + CLOCK_SKEW - world.now).total_seconds() + 1)
    await world.tick()
    (retry,) = [e for e in world.pending if e.queue == QUEUES["commands"]]
    await world.deliver(retry)
    assert (await world.store.load(ORDER)).attempt == 2
    reads = Reads(world, monkeypatch)

    await handle(world, reply(request, "transient"))

    assert reads.count == 1
    order = await world.store.load(ORDER)
    assert order.attempt == 2 and order.state is ProcessState.PROCESSING
    assert await events(world) == ["created", "released", "claimed", "late_answer"]
    assert order.step("reserve_inventory").forward_failures == Failures(at_service=1)


async def test_a_decision_that_writes_nothing_is_not_taken_on_a_snapshot(monkeypatch) -> None:
    """Only a write proves a snapshot current (its ETag); a decision that writes nothing is
    made again on a read. Here the snapshot claims, under the order's current ETag, a state in
    which the answer changes nothing (only a forger could make one): the read shows the step
    in flight, and its transient failure releases it."""
    world = await world_with_order()
    request = the_request(world)
    stored = await world.store.load(ORDER)
    claimed = replace(stored, state=ProcessState.PENDING, locked_by=None, complete_by=None)
    reads = Reads(world, monkeypatch)

    await handle(world, reply(request, "transient", resume=resume.snapshot(claimed)))

    assert reads.count == 1
    assert await events(world) == ["created", "released"]


async def test_a_retry_command_carries_no_snapshot_and_claims_on_a_read(monkeypatch) -> None:
    """Only agent replies skip the read; a retry command's claim reads the order as before."""
    world = await world_with_order()
    await handle(world, reply(the_request(world), "transient"))
    (command,) = [e for e in world.pending if e.queue == QUEUES["commands"]]
    assert isinstance(command.message, SchedulerCommand)
    assert b"resume" not in encode(command.message)
    reads = Reads(world, monkeypatch)

    await world.deliver(command)

    assert reads.count == 1
    assert await events(world) == ["created", "released", "claimed"]
    assert [m.attempt for m in world.bus.on(QUEUES["inventory"])] == [1, 2]


async def test_a_release_that_moves_the_index_row_reads_first(monkeypatch) -> None:
    """A decision that must move the order's index row earlier does so before its write; on a
    stale snapshot a lost race would leave the row later than the order, so it reads first."""
    world = await world_with_order()
    request = the_request(world)
    row = world.store.index.get(ORDER, 1)
    assert row is not None
    reads = Reads(world, monkeypatch)

    await handle(world, reply(request, "transient"))

    assert reads.count == 1
    moved = world.store.index.get(ORDER, 1)
    assert moved is not None and moved.due_at < row.due_at, "the retry falls due first"
    assert moved.due_at <= apply.due(world.rt, await world.store.load(ORDER))


async def test_an_unknown_workflow_in_a_snapshot_reads_the_order(monkeypatch) -> None:
    world = await world_with_order()
    request = the_request(world)
    stored = await world.store.load(ORDER)
    foreign = resume.snapshot(replace(stored, workflow="order@99"))
    reads = Reads(world, monkeypatch)

    await handle(world, reply(request, resume=foreign))

    assert reads.count == 1
    assert await events(world) == ["created", "step_succeeded"]


async def test_restored_deadlines_are_aware_utc_datetimes() -> None:
    """The restored deadlines are aware UTC datetimes, as a read returns them."""
    world = await world_with_order()
    stored = await world.store.load(ORDER)
    restored = resume.restore(resume.snapshot(stored), ORDER)
    assert restored is not None and restored.complete_by is not None
    assert restored.complete_by - stored.created_at == stored.complete_by - stored.created_at
    assert restored.complete_by.utcoffset() == timedelta(0)
