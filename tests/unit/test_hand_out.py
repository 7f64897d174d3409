"""A tick hands the rows it finds due out to the fleet (``service.hand_out``), and any instance
recovers them (``service.recovery``): on the in-memory store, with the Supervisor and the
instances that recover as runtimes of their own (own instance id, own bus, own clock).

The guarantees of the tick that handles rows itself hold here too: each order recovered once
(also when a message is delivered twice, late, after its rows were handed out again, or after
a crash between the tick's mark and its send, or mid-recovery), the most overdue first, nothing
recovered early by an instance whose clock runs ahead within the tolerance, and what was not
carried out comes due again when the hand-out's lease ends.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from datetime import timedelta

import pytest
from azure.core.exceptions import ServiceResponseError

from adapters.settings import Settings
from adapters.store.active_index import INDEX_BUCKETS, index_partition
from adapters.store.supervision import BucketLease
from devstack.memory import MemoryStore
from domain.messages import DueRows, SchedulerCommand, encode, message_id_for
from service import hand_out
from service.commands import handle_command
from service.operations.context import OperatorContext
from service.operations.supervisor import Drain, drain
from service.operations.supervisor import supervisor as supervisor_view
from service.runtime import Runtime
from service.sweep import BACKLOG_REASON, run_tick
from service.sweep_report import TickReport
from tests.support.supervisor_metrics import recorded
from tests.unit.test_supervisor_tick import (
    PERIOD,
    STEP_TIMEOUT,
    T0,
    Clock,
    RecordingBus,
    StoreSpy,
    events,
    order_ids,
    scheduler,
    settings,
    submit,
)

pytestmark = pytest.mark.anyio

CLAIM = settings().supervisor_claim
PERIOD_S = PERIOD.total_seconds()
FIRST = hand_out.first_hand_out(PERIOD_S)
"""What a bucket may hand out at first."""
PER_MESSAGE = hand_out.rows_per_message(PERIOD_S)


class Instance:
    """A runtime of its own on the shared store: ticks, or recovers what ticks hand out."""

    def __init__(
        self, store: MemoryStore, clock: Clock, name: str, *, config: Settings | None = None
    ) -> None:
        self.spy = StoreSpy(store)
        self.bus = RecordingBus()
        config = config or settings()
        self.rt = Runtime(
            settings=config,
            store=self.spy,  # type: ignore[arg-type]
            bus=self.bus,  # type: ignore[arg-type]
            workflows=config.workflows(),
            instance_id=name,
            clock=clock,
            rng=random.Random(0),
        )
        self.rt._status_bus = self.bus  # type: ignore[assignment]

    async def tick(self, **kwargs) -> TickReport:  # type: ignore[no-untyped-def]
        return await run_tick(self.rt, **kwargs)

    def handed_out(self) -> list[DueRows]:
        """The DueRows messages this instance sent (a failed send is not one)."""
        return [s.message for s in self.bus.sent if isinstance(s.message, DueRows)]

    def alerts(self) -> list[str]:
        return [s.message.reason for s in self.bus.every if s.queue == "operator-alerts"]

    async def recover(self, message: DueRows) -> None:
        await handle_command(encode(message), self.rt)


def released(*instances: Instance) -> Counter[str]:
    return Counter(order_id for i in instances for order_id in i.bus.released())


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryStore:
    return MemoryStore(clock)


async def stalled(store: MemoryStore, clock: Clock, buckets: list[int]) -> list[str]:
    """Orders in flight (one per entry of ``buckets``, in that bucket) past their deadline."""
    ids = order_ids(buckets)
    await submit(scheduler(store, clock), ids)
    clock.advance(STEP_TIMEOUT + timedelta(seconds=1))
    return ids


# ------------------------------------------------------------------------------ the tick


async def test_a_tick_with_more_than_a_handful_due_hands_them_out_and_reads_no_order(store, clock):
    first = FIRST
    ids = await stalled(store, clock, [b % INDEX_BUCKETS for b in range(40)] + [3] * (first - 3))
    sup = Instance(store, clock, "sup-a")

    report = await sup.tick()

    messages = sup.handed_out()
    per_bucket = Counter(int(index_partition(o)[1:]) for o in ids)
    assert per_bucket[3] == first
    assert (report.due, report.handed_out, report.handled, report.left) == (len(ids),) * 2 + (0, 0)
    assert (
        report.messages
        == len(messages)
        == sum(math.ceil(n / PER_MESSAGE) for n in per_bucket.values())
    )
    assert sup.spy.finds == 0 and sup.bus.released() == []  # the tick recovered nothing itself
    assert Counter(r.order_id for m in messages for r in m.rows) == Counter(ids)
    for message in messages:
        assert len(message.rows) <= PER_MESSAGE
        assert message.leased_until == T0 + STEP_TIMEOUT + timedelta(seconds=1) + CLAIM
        assert message.requested_by == "supervisor:sup-a"
    assert all(s.queue == "scheduler-commands" for s in sup.bus.every)
    for row in store.index.rows():
        assert (row.dispatch_id, row.due_at) == (
            next(m.hand_out for m in messages if row.order_id in {r.order_id for r in m.rows}),
            messages[0].leased_until,
        )
    # Every bucket's rows were all handed out: each is checkpointed, with what it handed out.
    roster = await store.supervision.read()
    assert {b.bucket: b.dispatched for b in roster.buckets}[3] == first
    assert all(b.swept_at == clock.now and b.left == 0 for b in roster.buckets)


async def test_the_most_overdue_message_goes_first(store, clock):
    sched = scheduler(store, clock)
    ids = order_ids([15, 9, 0] + [4] * 20)
    for order_id in ids:
        await submit(sched, [order_id])
        clock.advance(timedelta(seconds=1))
    clock.advance(STEP_TIMEOUT)
    sup = Instance(store, clock, "sup-a")

    await sup.tick()

    messages = sup.handed_out()
    assert [m.bucket for m in messages][:4] == [15, 9, 0, 4]  # ranked by its most overdue row
    assert ids[3] in {r.order_id for r in messages[3].rows}
    assert sum(len(m.rows) for m in messages if m.bucket == 4) == 20


async def test_a_tick_with_a_handful_due_recovers_them_itself(store, clock):
    ids = await stalled(store, clock, [1, 2, 3])
    sup = Instance(store, clock, "sup-a")

    report = await sup.tick()

    assert (report.handed_out, report.retried) == (0, 3)
    assert sup.handed_out() == [] and sorted(sup.bus.released()) == sorted(ids)


async def test_a_tick_with_nothing_due_hands_out_nothing(store, clock):
    await submit(scheduler(store, clock), order_ids([0, 5]))
    sup = Instance(store, clock, "sup-a")
    report = await sup.tick(inline_rows=0)
    assert (report.queries, report.due, report.handed_out, report.messages) == (16, 0, 0, 0)
    assert sup.bus.every == []


async def test_a_tick_whose_marks_fail_hands_out_what_it_marked_and_leaves_the_rest(store, clock):
    ids = await stalled(store, clock, [b % INDEX_BUCKETS for b in range(40)])
    sup = Instance(
        store, clock, "sup-a", config=dataclasses.replace(settings(), supervisor_concurrency=1)
    )
    real = store.index.hand_out
    calls = 0

    async def failing_later(rows, until, at, dispatch_id):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls > 2:
            raise ServiceResponseError("the storage stopped answering")
        return await real(rows, until, at, dispatch_id)

    sup.spy.index.hand_out = failing_later  # type: ignore[method-assign]
    report = await sup.tick()  # one mark at a time: two marked, then the storage fails
    sent = {r.order_id for m in sup.handed_out() for r in m.rows}

    assert report.messages == len(sup.handed_out()) == 2
    assert report.handed_out == len(sent) and report.left == len(ids) - len(sent)
    del sup.spy.index.hand_out
    worker = Instance(store, clock, "app-2")
    for message in sup.handed_out():
        await worker.recover(message)
    clock.advance(PERIOD)
    report = await sup.tick()
    assert report.handed_out == len(ids) - len(sent)  # the rest


# -------------------------------------------------------------------------- the recovery


async def test_any_instance_recovers_the_rows_handed_out_and_moves_them_on(store, clock):
    ids = await stalled(store, clock, list(range(INDEX_BUCKETS)) * 2)
    sup, worker = Instance(store, clock, "sup-a"), Instance(store, clock, "app-2")
    await sup.tick()

    for message in sup.handed_out():
        await worker.recover(message)

    assert released(worker) == Counter(ids)
    assert all(e.count("released") == 1 for e in [await events(store, o) for o in ids])
    for order in store.orders():
        row = store.index.get(order.order_id, order.generation)
        assert row is not None and row.dispatch_id == "" and row.due_at > clock.now
    timeline = await store.get_timeline(ids[0])
    assert timeline[-1].actor == "supervisor:app-2"  # whoever recovered it, as the Supervisor


async def test_a_message_delivered_twice_recovers_each_order_once(store, clock):
    ids = await stalled(store, clock, list(range(INDEX_BUCKETS)) * 2)
    sup, a, b = (Instance(store, clock, n) for n in ("sup-a", "app-1", "app-2"))
    await sup.tick()
    messages = sup.handed_out()

    for message in messages:
        await a.recover(message)
        await b.recover(message)  # redelivered to another instance

    assert released(a, b) == Counter(ids)
    assert b.bus.released() == []


async def test_a_crash_between_the_mark_and_the_send_hands_the_rows_out_again_a_period_later(
    store, clock
):
    ids = await stalled(store, clock, list(range(INDEX_BUCKETS)) * 2)
    sup, worker = Instance(store, clock, "sup-a"), Instance(store, clock, "app-2")
    sup.bus.fail_after = 0  # the broker is gone: every send fails
    began = clock.now

    report = await sup.tick()

    assert report.messages == 0 and report.left == len(ids)
    marked = {row.order_id for row in store.index.rows() if row.dispatch_id}
    assert marked  # the rows of the messages marked before the first send failed
    assert all(row.due_at == began + CLAIM for row in store.index.rows() if row.dispatch_id)
    sup.bus.fail_after = None
    clock.advance(CLAIM - timedelta(seconds=1))

    report = await sup.tick(inline_rows=0)  # the rows never marked are still due...

    assert report.handed_out == len(ids) - len(marked)
    assert {r.order_id for m in sup.handed_out() for r in m.rows}.isdisjoint(marked)
    clock.advance(PERIOD - CLAIM + timedelta(seconds=1))

    report = await sup.tick(inline_rows=0)  # ...the marked ones once their lease ended

    assert report.handed_out == len(marked)
    for message in sup.handed_out():
        await worker.recover(message)
    assert released(worker) == Counter(ids)


async def test_a_message_taken_after_its_lease_recovers_its_rows_and_the_next_hand_out_none(
    store, clock
):
    """A message that waited past its lease (a backlog, an instance paused with it): its rows
    came due again and a tick handed them out anew, in new messages behind it. It still
    recovers them (it is first in the queue); the new messages then read them moved on, and
    recover nothing: no order is read twice."""
    ids = await stalled(store, clock, list(range(INDEX_BUCKETS)) * 2)
    sup, late, worker = (Instance(store, clock, n) for n in ("sup-a", "app-1", "app-2"))
    await sup.tick()
    first = sup.handed_out()
    clock.advance(PERIOD)

    report = await sup.tick()

    again = sup.handed_out()[len(first) :]
    assert report.returned == len(ids) and report.handed_out == len(ids)
    assert {message_id_for(m) for m in first}.isdisjoint(message_id_for(m) for m in again)
    for message in first:
        await late.recover(message)
    assert released(late) == Counter(ids)
    for message in again:
        await worker.recover(message)
    assert worker.spy.finds == 0 and worker.bus.every == []
    assert not any(row.dispatch_id for row in store.index.rows())


@pytest.mark.parametrize("earlier_first", [True, False])
async def test_both_hand_outs_of_a_row_are_carried_out_and_recover_it_once(
    store, clock, earlier_first
):
    """An instance whose clock runs behind (within the tolerance) still takes the first
    message after the rows were handed out again: whichever comes first recovers each order,
    the other changes nothing, and every row is moved on."""
    tolerant = dataclasses.replace(settings(), clock_skew=timedelta(seconds=10))
    ids = await stalled(store, clock, list(range(INDEX_BUCKETS)) * 2)
    clock.advance(timedelta(seconds=10))  # past the deadlines by the tolerance too
    behind = Clock()
    sup = Instance(store, clock, "sup-a", config=tolerant)
    await sup.tick()
    first = sup.handed_out()
    clock.advance(PERIOD)
    await sup.tick()
    again = sup.handed_out()[len(first) :]
    behind.now = clock.now - timedelta(seconds=9)
    slow = Instance(store, behind, "app-1", config=tolerant)
    worker = Instance(store, clock, "app-2", config=tolerant)

    order = [(slow, first), (worker, again)]
    for instance, messages in order if earlier_first else reversed(order):
        for message in messages:
            await instance.recover(message)

    assert released(slow, worker) == Counter(ids)
    assert all(e.count("released") == 1 for e in [await events(store, o) for o in ids])
    assert not any(row.dispatch_id for row in store.index.rows())
    assert all(row.due_at > clock.now for row in store.index.rows())


async def test_an_instance_that_dies_mid_recovery_leaves_its_rows_to_come_due_again(store, clock):
    ids = await stalled(store, clock, list(range(INDEX_BUCKETS)) * 2)
    sup, dying, worker = (Instance(store, clock, n) for n in ("sup-a", "app-1", "app-2"))
    await sup.tick()
    dying.bus.fail_after = 0  # each order's release is written, its retry command never sent

    for message in sup.handed_out():
        await dying.recover(message)

    assert all(e.count("released") == 1 for e in [await events(store, o) for o in ids])
    assert not [s for s in dying.bus.sent if isinstance(s.message, SchedulerCommand)]
    assert all(row.dispatch_id for row in store.index.rows())  # nobody moved them on
    seen = 0
    for _ in range(20):  # handed out again at the lease's end; the retries sent once overdue
        clock.advance(PERIOD)
        await sup.tick(inline_rows=0)
        for message in sup.handed_out()[seen:]:
            await worker.recover(message)
        seen = len(sup.handed_out())
        if len(released(worker)) == len(ids):
            break
    assert released(worker) == Counter(ids)  # the owed commands, from the orders' outboxes
    assert all(e.count("released") == 1 for e in [await events(store, o) for o in ids])


async def test_an_instance_whose_clock_runs_ahead_within_the_tolerance_recovers_nothing_early(
    store,
):
    """The instance that recovers decides on its own clock: one that runs ahead of the others
    (within CLOCK_SKEW_TOLERANCE_SECONDS) and sees a deadline passed recovers the order only
    once its clock is past it by the tolerance, so never before the deadline in real time."""
    tolerant = dataclasses.replace(settings(), clock_skew=timedelta(seconds=10))
    real, ahead = Clock(), Clock()
    ids = order_ids(list(range(INDEX_BUCKETS)))
    await submit(scheduler(store, real), ids)  # CompleteBy: T0 + 30 s
    for order_id in ids:  # rows kept early (due now), as a write that moved them earlier would
        await store.index.put(order_id, 1, "order", T0)
    real.advance(timedelta(seconds=25))
    ahead.now = real.now + timedelta(seconds=9)  # sees every deadline passed, by 4 s
    sup = Instance(store, real, "sup-a", config=tolerant)
    worker = Instance(store, ahead, "app-2", config=tolerant)

    report = await sup.tick(inline_rows=0)

    assert report.handed_out == len(ids)
    for message in sup.handed_out():
        await worker.recover(message)
    assert worker.bus.released() == []
    assert all(e == ["created"] for e in [await events(store, o) for o in ids])
    deadline = T0 + STEP_TIMEOUT
    for row in store.index.rows():  # moved up to when the order is due, with the tolerance
        assert (row.due_at, row.dispatch_id) == (deadline + timedelta(seconds=10), "")

    real.advance(timedelta(seconds=15))  # T0 + 40 s: late by the tolerance, on every clock
    ahead.now = real.now + timedelta(seconds=9)
    await sup.tick(inline_rows=0)
    for message in sup.handed_out()[report.messages :]:
        await worker.recover(message)
    assert released(worker) == Counter(ids)


async def test_rows_of_another_bucket_are_refused_with_an_alert_and_the_others_recovered(
    store, clock
):
    ids = await stalled(store, clock, [2, 2, 7])
    sup, worker = Instance(store, clock, "sup-a"), Instance(store, clock, "app-2")
    await sup.tick(inline_rows=0)
    [two, seven] = sorted(sup.handed_out(), key=lambda m: m.bucket)
    misfiled = two.model_copy(update={"rows": (*two.rows, *seven.rows)})

    await worker.recover(misfiled)

    assert sorted(worker.bus.released()) == sorted(ids[:2])
    [alert] = [s.message for s in worker.bus.every if s.queue == "operator-alerts"]
    assert alert.reason == "bad_message" and ids[2] in alert.detail
    assert "bucket 2" in alert.detail


# ------------------------------------------------------------------------------- the pace


def test_what_a_tick_hands_out_at_first_and_per_message_follows_the_period():
    assert [hand_out.first_hand_out(p) for p in (2, 15)] == [32, 240]  # 512 and 3,840 a tick
    assert [hand_out.rows_per_message(p) for p in (1, 2, 5, 15, 60)] == [8, 8, 20, 32, 32]


def test_buckets_with_no_hand_out_before_may_hand_out_the_first_measure():
    paced = hand_out.pace(BucketLease(bucket=1), T0, ())
    assert paced == hand_out.Pace(0, 0, 0.0)
    assert hand_out.allowance([paced] * INDEX_BUCKETS, PERIOD_S) == INDEX_BUCKETS * FIRST


def test_buckets_that_kept_up_may_hand_out_twice_what_they_moved_on():
    lease = BucketLease(bucket=1, dispatched=3000, dispatched_at=T0)
    paced = hand_out.pace(lease, T0 + timedelta(seconds=15), ())
    assert (paced.moved_on, paced.rate) == (3000, 200.0)
    idle = hand_out.pace(BucketLease(bucket=2), T0, ())
    assert hand_out.allowance([paced, idle], PERIOD_S) == 6000
    small = hand_out.pace(BucketLease(bucket=1, dispatched=10, dispatched_at=T0), T0, ())
    assert hand_out.allowance([small, idle], PERIOD_S) == 2 * FIRST  # at least the first


async def test_buckets_that_fell_behind_hand_out_what_the_fleet_moved_on_not_a_message_each(
    store, clock
):
    ids = order_ids([6] * 3)
    await submit(scheduler(store, clock), ids)
    rows = tuple(store.index.rows())
    marked = await store.index.hand_out(rows[:2], clock.now, T0, "c" * 32)
    lease = BucketLease(bucket=6, dispatched=400, dispatched_at=T0)
    paced = hand_out.pace(lease, T0 + timedelta(seconds=10), (*marked, rows[2]))
    assert (paced.returned, paced.moved_on, paced.rate) == (2, 398, 39.8)
    assert hand_out.allowance([paced], PERIOD_S) == 398
    stalled_all = [
        hand_out.pace(BucketLease(bucket=b, dispatched=1, dispatched_at=T0), T0, marked[:1])
        for b in range(INDEX_BUCKETS)
    ]
    assert sum(p.moved_on for p in stalled_all) == 0
    assert hand_out.allowance(stalled_all, PERIOD_S) == PER_MESSAGE  # one message in all


async def test_a_tick_hands_out_what_the_fleets_pace_allows_and_the_rest_waits_with_an_alert(
    store, clock
):
    quick = dataclasses.replace(settings(), supervisor_schedule="*/2 * * * * *")
    period = quick.supervisor_period
    first = INDEX_BUCKETS * hand_out.first_hand_out(period.total_seconds())
    extra = 30
    ids = await stalled(store, clock, [b % INDEX_BUCKETS for b in range(first + extra)])
    sup = Instance(store, clock, "sup-a", config=quick)
    worker = Instance(store, clock, "app-2", config=quick)

    report = await sup.tick()

    assert (report.handed_out, report.left) == (first, extra)
    assert sup.alerts() == [BACKLOG_REASON]
    roster = await store.supervision.read()
    assert sum(b.left for b in roster.buckets) == extra  # first next tick
    for message in sup.handed_out():
        await worker.recover(message)
    clock.advance(period)

    report = await sup.tick()

    assert (report.returned, report.handed_out, report.left) == (0, extra, 0)
    assert report.drain_rate == pytest.approx(first / period.total_seconds(), abs=1e-2)
    assert sup.alerts() == [BACKLOG_REASON]  # not again: it drains now
    for message in sup.handed_out()[report.messages * -1 :]:
        await worker.recover(message)
    assert released(worker) == Counter(ids)
    roster = await store.supervision.read()
    assert sum(b.dispatched for b in roster.buckets) == extra
    assert sum(b.returned + b.left for b in roster.buckets) == 0


async def test_a_hand_out_records_its_metrics(store, clock, metric_reader):
    await stalled(store, clock, list(range(INDEX_BUCKETS)) * 2)
    sup = Instance(store, clock, "sup-a")

    report = await sup.tick()

    found = recorded(metric_reader)
    assert sum(p.value for p in found["supervisor.handed_out"]) == report.handed_out == 32
    assert [p.value for p in found["supervisor.backlog"]] == [32]
    assert sum(p.value for p in found.get("supervisor.recovered", [])) == 0


# ------------------------------------------------------------------------ what operators see


async def test_operators_see_the_backlog_what_drains_it_and_whether_it_drains_in_a_period(
    store, clock
):
    quick = dataclasses.replace(settings(), supervisor_schedule="*/2 * * * * *")
    period = quick.supervisor_period.total_seconds()
    first = INDEX_BUCKETS * hand_out.first_hand_out(period)
    extra = 30
    await stalled(store, clock, [b % INDEX_BUCKETS for b in range(first + extra)])
    sup = Instance(store, clock, "sup-a", config=quick)
    worker = Instance(store, clock, "app-2", config=quick)
    ctx = OperatorContext(sup.rt)

    await sup.tick()
    view = await supervisor_view(ctx)

    assert (view.backlog, view.left, view.drain_rate) == (first + extra, extra, 0.0)
    assert view.time_to_drain_s is None and not view.drains_within_period
    assert sum(b.dispatched for b in view.buckets) == first
    assert sum(b.left for b in view.buckets) == extra

    for message in sup.handed_out():
        await worker.recover(message)
    clock.advance(quick.supervisor_period)
    await sup.tick()
    view = await supervisor_view(ctx)

    assert (view.backlog, view.left) == (extra, 0)
    assert view.drain_rate == pytest.approx(first / period, abs=0.05)
    assert view.time_to_drain_s == pytest.approx(extra / view.drain_rate, abs=0.01)
    assert view.drains_within_period


def test_the_backlog_drains_within_a_period_only_if_nothing_was_left_and_the_rate_suffices():
    assert drain([], 15.0) == Drain(0, 0, 0.0, 0.0, True)
    assert drain([(30, 0, 3.0)], 15.0) == Drain(30, 0, 3.0, 10.0, True)
    assert drain([(30, 0, 1.0), (0, 0, 0.5)], 15.0) == Drain(30, 0, 1.5, 20.0, False)
    assert drain([(30, 5, 30.0)], 15.0).within_period is False  # rows left for later
    assert drain([(30, 0, 0.0)], 15.0) == Drain(30, 0, 0.0, None, True)  # not measured yet
