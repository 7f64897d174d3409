"""``service.sweep.run_tick`` on the in-memory store: what a tick costs, what its time budget
leaves for the next tick, the order rows are handled in, the lease protocol (claimed short,
extended or given up when the tick ends, renew-only after lost races), two Supervisor instances
sharing the buckets and one order, and the tick's metrics; a tick here handles every row it
finds itself (tests/unit/test_hand_out.py hands them out).

Orders are put in flight by the Scheduler's intake (its own runtime and bus); each Supervisor
instance is a runtime with its own instance id and bus on the same :class:`MemoryStore`, seen
through a spy that records which buckets it queried. A SchedulerCommand on a Supervisor's bus is
the order it released for a retry.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from adapters.settings import Connection, Settings
from adapters.store.active_index import INDEX_BUCKETS, bucket_partition, index_partition
from adapters.store.rows import ActiveRow, ConcurrencyConflict
from devstack.memory import MemoryBus, MemoryStore, MemorySupervision, Sent
from domain.messages import MessageBase, OrderSubmitted, SchedulerCommand, encode
from service.intake import handle_submission
from service.runtime import Runtime
from service.sweep import run_tick
from service.sweep_report import TickReport
from tests.support.memory_runtime import memory_runtime
from tests.support.supervisor_metrics import recorded
from tests.support.world import QUEUES

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 1, 1, tzinfo=UTC)
STEP_TIMEOUT = timedelta(seconds=30)


def settings(concurrency: int = 4) -> Settings:
    return Settings(
        queues=QUEUES,
        service_urls={},
        servicebus=Connection("sb"),
        storage=Connection("st"),
        supervisor_concurrency=concurrency,
        step_timeout=STEP_TIMEOUT,
        step_queue=timedelta(0),
        retry_base_delay=timedelta(seconds=5),
        retry_max_delay=timedelta(seconds=60),
        clock_skew=timedelta(0),  # one clock: these tests move it to exact deadlines
    )


PERIOD = settings().supervisor_period


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


class RecordingBus(MemoryBus):
    """A MemoryBus that also keeps every send, duplicates included (MessageId dedup would hide
    an order handled twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.every: list[Sent] = []

    async def send(
        self, queue: str, message: MessageBase, *, scheduled_at: datetime | None = None
    ) -> None:
        self.every.append(Sent(queue, message, scheduled_at))
        await super().send(queue, message, scheduled_at=scheduled_at)

    def released(self) -> list[str]:
        """Order ids of the retry commands sent (one per release)."""
        return [s.message.order_id for s in self.every if isinstance(s.message, SchedulerCommand)]


class IndexSpy:
    def __init__(self, index: Any) -> None:
        self._index = index
        self.due_calls: list[int] = []

    async def due(self, bucket: int, now: datetime, limit: int = 1000) -> tuple[ActiveRow, ...]:
        self.due_calls.append(bucket)
        return await self._index.due(bucket, now, limit)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)


class StoreSpy:
    """One Supervisor instance's view of the shared store: records its due-queries and reads."""

    def __init__(self, store: MemoryStore, supervision: MemorySupervision | None = None) -> None:
        self._store = store
        self.index = IndexSpy(store.index)
        self.supervision = supervision or store.supervision
        self.finds = 0
        self.found: list[str] = []
        self.after_find: asyncio.Barrier | None = None
        """Set: each order read waits there (two instances then read the same version)."""

    async def find(self, order_id: str) -> Any:
        self.finds += 1
        self.found.append(order_id)
        order = await self._store.find(order_id)
        if self.after_find is not None:
            await asyncio.wait_for(self.after_find.wait(), 30)
        return order

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def take_due_calls(self) -> list[int]:
        calls, self.index.due_calls = self.index.due_calls, []
        return calls


INLINE_ALL = 10_000
"""These tests are about a tick that handles the rows it finds itself, however many; handing
them out to the fleet is tests/unit/test_hand_out.py's."""


class Supervisor:
    def __init__(self, rt: Runtime, spy: StoreSpy, bus: RecordingBus) -> None:
        self.rt, self.spy, self.bus = rt, spy, bus

    async def tick(self, budget_s: float | None = None) -> TickReport:
        return await run_tick(self.rt, budget_s=budget_s, inline_rows=INLINE_ALL)


def supervisor(
    store: MemoryStore,
    clock: Clock,
    name: str,
    *,
    concurrency: int = 4,
    supervision: MemorySupervision | None = None,
) -> Supervisor:
    spy = StoreSpy(store, supervision)
    bus = RecordingBus()
    return Supervisor(memory_runtime(settings(concurrency), spy, bus, name, clock), spy, bus)


def scheduler(store: MemoryStore, clock: Clock) -> Runtime:
    return memory_runtime(settings(), store, MemoryBus(), "scheduler-1", clock)


def order_ids(buckets: list[int]) -> list[str]:
    """One new order id per entry of ``buckets``, each landing in that index bucket."""
    ids: list[str] = []
    for n, bucket in enumerate(buckets):
        i = 0
        while index_partition(f"o-{n}-{i}") != bucket_partition(bucket):
            i += 1
        ids.append(f"o-{n}-{i}")
    return ids


async def submit(rt: Runtime, order_ids: list[str]) -> None:
    for order_id in order_ids:
        order = OrderSubmitted(
            order_id=order_id,
            customer_id="c-1",
            items=[{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 500}],
            currency="EUR",
        )
        await handle_submission(encode(order), rt)


async def events(store: MemoryStore, order_id: str) -> list[str]:
    return [e.event for e in await store.get_timeline(order_id)]


async def at_once(*actions: Awaitable[object]) -> None:
    """Run ``actions`` at the same moment, as tasks interleaving at each request to the store;
    re-raise what any of them raised."""
    try:
        await asyncio.wait_for(asyncio.gather(*actions), 30)
    except TimeoutError:
        raise AssertionError("a tick did not finish") from None


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryStore:
    return MemoryStore(clock)


# ---------------------------------------------------------------------------------- cost


async def test_a_tick_with_nothing_due_queries_each_held_bucket_once_and_checkpoints_it(
    store, clock
):
    await submit(scheduler(store, clock), order_ids([0, 7, 7, 15]))  # in flight, not due
    a = supervisor(store, clock, "sup-a")

    report = await a.tick()

    assert (report.held, report.swept, report.queries, report.due) == (16, 16, 16, 0)
    assert report.handled == 0
    assert sorted(a.spy.take_due_calls()) == list(range(INDEX_BUCKETS))
    assert a.spy.finds == 0 and a.bus.every == []
    assert report.recovered == 0 and report.lag_s == 0.0
    for lease in (await store.supervision.read()).buckets:
        assert (lease.holder, lease.swept_at, lease.swept_by) == ("sup-a", T0, "sup-a")
        assert (lease.lag_s, lease.due_found) == (0.0, 0)

    b = supervisor(store, clock, "sup-b")
    for _ in range(3):
        clock.advance(PERIOD)
        for s in (a, b):
            report = await s.tick()
            calls = s.spy.take_due_calls()
            assert report.queries == report.held == report.swept == len(calls)
            assert len(set(calls)) == len(calls)
    assert report.held == 8  # two instances: half each
    assert {lease.swept_at for lease in (await store.supervision.read()).buckets} == {clock.now}


# -------------------------------------------------------------------------------- budget


async def test_budget_zero_with_rows_due_in_every_bucket_sweeps_and_checkpoints_nothing(
    store, clock
):
    ids = order_ids(list(range(INDEX_BUCKETS)))
    await submit(scheduler(store, clock), ids)
    clock.advance(STEP_TIMEOUT + timedelta(seconds=1))
    a = supervisor(store, clock, "sup-a")
    rows = store.index.rows()

    report = await a.tick(budget_s=0)

    assert (report.held, report.swept) == (16, 0)
    assert (report.retried, report.recovered, report.due, report.handled) == (0, 0, 16, 0)
    assert report.lag_s == 1.0  # what the tick found due, handled or not
    assert report.left == 16  # nothing handled: the backlog does not drain within a period
    assert [s.message.reason for s in a.bus.every] == ["supervisor_backlog"]
    assert a.spy.finds == 0
    assert store.index.rows() == rows
    assert all(e == ["created"] for e in [await events(store, o) for o in ids])
    assert all(lease.swept_at is None for lease in (await store.supervision.read()).buckets)

    report = await a.tick()
    assert (report.held, report.swept, report.retried, report.handled) == (16, 16, 16, 16)
    assert sorted(a.bus.released()) == sorted(ids)
    for lease in (await store.supervision.read()).buckets:
        assert (lease.swept_at, lease.lag_s, lease.due_found) == (clock.now, 1.0, 1)


async def test_buckets_a_tick_did_not_finish_come_first_next_tick(store, clock):
    a = supervisor(store, clock, "sup-a", concurrency=1)  # one sweep at a time: a clear order
    await a.tick()
    late = [5, 9, 13]
    ids = order_ids(late)
    await submit(scheduler(store, clock), ids)
    clock.advance(STEP_TIMEOUT + timedelta(seconds=1))
    swept_before = clock.now

    report = await a.tick(budget_s=0)

    # the budget is checked per due row: a bucket with nothing due was swept to the end
    assert (report.held, report.swept, report.retried) == (16, 13, 0)
    checkpoints = {b.bucket: b.swept_at for b in (await store.supervision.read()).buckets}
    assert {b for b, at in checkpoints.items() if at == T0} == set(late)
    assert {b for b, at in checkpoints.items() if at == swept_before} == set(range(16)) - {*late}

    clock.advance(PERIOD)
    a.spy.take_due_calls()
    report = await a.tick()

    calls = a.spy.take_due_calls()
    assert calls[:3] == late
    assert calls == [*late, *(b for b in range(INDEX_BUCKETS) if b not in late)]
    assert (report.swept, report.retried) == (16, 3)
    assert sorted(a.bus.released()) == sorted(ids)


async def test_a_bucket_left_for_the_next_tick_is_first_for_whoever_holds_it_then(store, clock):
    a = supervisor(store, clock, "sup-a")
    await a.tick()
    ids = order_ids([11])
    await submit(scheduler(store, clock), ids)
    clock.advance(STEP_TIMEOUT + timedelta(seconds=1))
    assert (await a.tick(budget_s=0)).swept == 15
    # sup-a dies; sup-b takes the buckets once sup-a's leases expire
    b = supervisor(store, clock, "sup-b", concurrency=1)
    clock.advance(settings().supervisor_lease)
    report = await b.tick()
    assert b.spy.take_due_calls()[0] == 11
    assert (report.held, report.retried) == (16, 1)
    assert b.bus.released() == ids


async def test_rows_due_are_handled_most_overdue_first_across_buckets(store, clock):
    a = supervisor(store, clock, "sup-a", concurrency=1)
    scheduler_rt = scheduler(store, clock)
    ids = order_ids([15, 9, 0])  # the most overdue in the bucket swept last
    for order_id in ids:
        await submit(scheduler_rt, [order_id])
        clock.advance(timedelta(seconds=5))
    clock.advance(STEP_TIMEOUT)

    report = await a.tick()

    assert a.spy.found == ids
    assert report.lag_s == pytest.approx(15.0)
    lags = {b.bucket: b.lag_s for b in (await store.supervision.read()).buckets}
    assert (lags[15], lags[9], lags[0]) == (15.0, 10.0, 5.0)


# ----------------------------------------------------------------------------- leases

LEASE = settings().supervisor_lease
CLAIM = settings().supervisor_claim


class LosingRaces(MemorySupervision):
    """A roster whose next ``lose`` claims conflict (as if another instance had just written)."""

    def __init__(self, lose: int) -> None:
        super().__init__()
        self.lose = lose
        self.claims: list[tuple[int, ...]] = []

    async def claim(self, member, hold, release, reap=()):  # type: ignore[no-untyped-def]
        self.claims.append(tuple(b.bucket for b in hold))
        if self.lose > 0:
            self.lose -= 1
            raise ConcurrencyConflict("supervisor roster", "lost a race")
        return await super().claim(member, hold, release, reap)


async def test_leases_are_claimed_short_and_extended_when_the_tick_ends(store, clock):
    ids = order_ids([4])
    await submit(scheduler(store, clock), ids)
    clock.advance(STEP_TIMEOUT + timedelta(seconds=1))
    a = supervisor(store, clock, "sup-a")
    claimed: list[tuple[datetime | None, ...]] = []
    claim = store.supervision.claim

    async def spy(member, hold, release, reap=()):  # type: ignore[no-untyped-def]
        claimed.append(tuple(b.until for b in hold))
        return await claim(member, hold, release, reap)

    store.supervision.claim = spy  # type: ignore[method-assign]

    report = await a.tick(budget_s=0)  # bucket 4 is cut short: not swept, its lease still extended

    assert claimed == [(clock.now + CLAIM,) * 16]
    assert (report.held, report.swept) == (16, 15)
    roster = await store.supervision.read()
    assert all(b.until == clock.now + LEASE and b.holder == "sup-a" for b in roster.buckets)
    assert roster.buckets[4].swept_at is None
    assert roster.members[0].until == clock.now + LEASE


async def test_a_tick_killed_after_its_claim_frees_its_buckets_before_the_next_tick(store, clock):
    a = supervisor(store, clock, "sup-a")
    querying = asyncio.Event()

    async def hangs(bucket: int, now: datetime, limit: int = 1000) -> Any:
        querying.set()
        await asyncio.Event().wait()

    a.spy.index.due = hangs  # type: ignore[method-assign]
    tick = asyncio.create_task(a.tick())
    await querying.wait()
    tick.cancel()  # the host stops the worker mid-tick
    with pytest.raises(asyncio.CancelledError):
        await tick
    assert {b.until for b in (await store.supervision.read()).buckets} == {clock.now + CLAIM}
    assert CLAIM < PERIOD

    clock.advance(PERIOD)
    b = supervisor(store, clock, "sup-b")
    report = await b.tick()
    assert (report.held, report.swept) == (16, 16)  # orphans: taken whatever the shares say


async def test_surplus_buckets_are_swept_then_given_up(store, clock):
    a, b = supervisor(store, clock, "sup-a"), supervisor(store, clock, "sup-b")
    await a.tick()
    clock.advance(PERIOD)
    assert (await b.tick()).held == 0  # all held by sup-a; its member row now counts
    report = await a.tick()
    assert (report.held, report.swept) == (16, 16)
    roster = await store.supervision.read()
    given_up = [x for x in roster.buckets if x.free(clock.now)]
    assert len(given_up) == 8
    assert all(x.swept_at == clock.now and x.holder == "" for x in given_up)
    clock.advance(PERIOD)
    assert (await b.tick()).held == 8


async def test_after_two_lost_races_a_tick_only_renews_what_it_holds(clock):
    store = MemoryStore(clock)
    roster = LosingRaces(lose=0)
    store.supervision = roster
    a, b = supervisor(store, clock, "sup-a"), supervisor(store, clock, "sup-b")
    for _ in range(3):
        await a.tick()
        await b.tick()
        clock.advance(PERIOD)
    assert (await a.tick()).held == 8  # sup-b died after its last tick: its leases still hold
    clock.advance(PERIOD)  # now they are orphans
    roster.lose, roster.claims = 2, []

    report = await a.tick()

    assert len(roster.claims) == 3
    assert len(roster.claims[0]) == len(roster.claims[1]) == 16  # with the orphans
    assert len(roster.claims[2]) == 8  # only its own
    assert (report.held, report.swept) == (8, 8)
    clock.advance(PERIOD)
    assert (await a.tick()).held == 16


async def test_a_tick_whose_claims_all_conflict_sweeps_and_writes_nothing(clock):
    store = MemoryStore(clock)
    store.supervision = LosingRaces(lose=3)
    a = supervisor(store, clock, "sup-a")
    report = await a.tick()
    assert (report.held, report.swept, report.queries) == (0, 0, 0)
    assert a.spy.take_due_calls() == []
    assert (await store.supervision.read()).members == ()


# ----------------------------------------------------------------- two instances, one store


async def test_two_instances_share_the_buckets_and_never_handle_one_order_twice(store, clock):
    ids = order_ids([b for b in range(INDEX_BUCKETS) for _ in range(3)])
    await submit(scheduler(store, clock), ids)
    a, b = supervisor(store, clock, "sup-a"), supervisor(store, clock, "sup-b")
    handled_by: dict[str, str] = {}

    for round_ in range(6):  # T0 .. T0 + 75 s: each order due once (at T0 + 30 s)
        pair = (a, b) if round_ % 2 == 0 else (b, a)
        swept: dict[str, set[int]] = {}
        for s in pair:
            report = await s.tick()
            calls = s.spy.take_due_calls()
            assert report.queries == len(calls) == len(set(calls))
            swept[s.rt.instance_id] = set(calls)
            for order_id in s.bus.released():
                assert handled_by.setdefault(order_id, s.rt.instance_id) == s.rt.instance_id
        assert not swept["sup-a"] & swept["sup-b"], f"round {round_}: a bucket swept twice"
        if round_ >= 2:
            assert swept["sup-a"] | swept["sup-b"] == set(range(INDEX_BUCKETS))
            assert len(swept["sup-a"]) == len(swept["sup-b"]) == 8
        clock.advance(PERIOD)

    released = Counter(a.bus.released() + b.bus.released())
    assert released == Counter(ids)  # every order released, once
    assert set(a.bus.released()).isdisjoint(b.bus.released())
    assert all(e.count("released") == 1 for e in [await events(store, o) for o in ids])


async def test_two_instances_ticking_at_the_same_moment(store, clock):
    ids = order_ids([b for b in range(INDEX_BUCKETS) for _ in range(2)])
    await submit(scheduler(store, clock), ids)
    a, b = supervisor(store, clock, "sup-a"), supervisor(store, clock, "sup-b")
    per_round: list[dict[str, set[int]]] = []

    for _ in range(6):
        swept: dict[str, set[int]] = {}
        await at_once(a.tick(), b.tick())
        for s in (a, b):
            swept[s.rt.instance_id] = set(s.spy.take_due_calls())
        assert not swept["sup-a"] & swept["sup-b"]
        per_round.append(swept)
        clock.advance(PERIOD)

    assert per_round[-1]["sup-a"] | per_round[-1]["sup-b"] == set(range(INDEX_BUCKETS))
    assert Counter(a.bus.released() + b.bus.released()) == Counter(ids)
    assert all(e.count("released") == 1 for e in [await events(store, o) for o in ids])


async def test_a_due_order_is_released_exactly_once_even_when_both_think_they_hold_its_bucket(
    store, clock
):
    """Leases are an optimisation: two instances on separate rosters (both hold every bucket)
    sweep the same rows at the same moment, and each order is still released once."""
    ids = order_ids([b for b in range(INDEX_BUCKETS) for _ in range(4)])
    await submit(scheduler(store, clock), ids)
    clock.advance(STEP_TIMEOUT + timedelta(seconds=1))
    pair = [
        supervisor(store, clock, name, supervision=MemorySupervision())
        for name in ("sup-a", "sup-b")
    ]
    reports: list[TickReport] = []

    async def ticks(s: Supervisor) -> None:
        for _ in range(3):
            reports.append(await s.tick())

    await at_once(ticks(pair[0]), ticks(pair[1]))

    assert all(r.held == 16 for r in reports)
    assert sum(r.retried for r in reports) == len(ids)
    assert Counter(pair[0].bus.released() + pair[1].bus.released()) == Counter(ids)
    assert all(e.count("released") == 1 for e in [await events(store, o) for o in ids])


async def test_two_instances_reading_the_same_version_of_a_due_order_release_it_once(store, clock):
    """Both read the order before either writes: the second write conflicts (ETag), the
    conflict is counted, and nothing of the loser's is sent."""
    ids = order_ids([6])
    await submit(scheduler(store, clock), ids)
    clock.advance(STEP_TIMEOUT + timedelta(seconds=1))
    pair = [
        supervisor(store, clock, name, supervision=MemorySupervision())
        for name in ("sup-a", "sup-b")
    ]
    both_read = asyncio.Barrier(2)
    for s in pair:
        s.spy.after_find = both_read
    reports: list[TickReport] = []

    async def tick(s: Supervisor) -> None:
        reports.append(await s.tick())

    await at_once(*(tick(s) for s in pair))

    assert sorted((r.retried, r.conflicts) for r in reports) == [(0, 1), (1, 0)]
    assert pair[0].bus.released() + pair[1].bus.released() == ids
    assert await events(store, ids[0]) == ["created", "released"]


async def test_a_due_order_is_released_once_over_repeated_ticks(store, clock):
    ids = order_ids([4])
    await submit(scheduler(store, clock), ids)
    a, b = supervisor(store, clock, "sup-a"), supervisor(store, clock, "sup-b")
    await a.tick()
    await b.tick()
    clock.advance(STEP_TIMEOUT + timedelta(seconds=1))
    reports = [await s.tick() for s in (a, b, a, b, a, b)]
    assert sum(r.retried for r in reports) == 1
    assert sum(r.due for r in reports) == 1
    assert a.bus.released() + b.bus.released() == ids
    assert await events(store, ids[0]) == ["created", "released"]


# ------------------------------------------------------------------------------- metrics


async def test_a_tick_records_lag_rows_read_recovered_and_duration(store, clock, metric_reader):
    ids = order_ids([2, 2, 9])
    await submit(scheduler(store, clock), ids)
    clock.advance(STEP_TIMEOUT + timedelta(seconds=4))
    a = supervisor(store, clock, "sup-a")

    report = await a.tick()

    assert (report.due, report.retried, report.recovered) == (3, 3, 3)
    found = recorded(metric_reader)
    assert sum(p.value for p in found["supervisor.rows_read"]) == 3
    assert sum(p.value for p in found["supervisor.recovered"]) == 3
    assert [p.value for p in found["supervisor.lag"]] == [pytest.approx(4.0)]
    assert report.lag_s == pytest.approx(4.0)
    (duration,) = found["supervisor.tick.duration"]
    assert duration.count == 1 and duration.sum == pytest.approx(report.duration_s)
    assert sum(p.value for p in found.get("supervisor.buckets_unfinished", [])) == 0


async def test_a_tick_cut_short_records_its_unfinished_buckets(store, clock, metric_reader):
    await submit(scheduler(store, clock), order_ids([1, 3]))
    clock.advance(STEP_TIMEOUT + timedelta(seconds=1))

    report = await supervisor(store, clock, "sup-a").tick(budget_s=0)

    found = recorded(metric_reader)
    assert report.held - report.swept == 2
    assert sum(p.value for p in found["supervisor.buckets_unfinished"]) == 2
    assert sum(p.value for p in found["supervisor.rows_read"]) == 2
    assert sum(p.value for p in found.get("supervisor.recovered", [])) == 0
    assert [p.value for p in found["supervisor.lag"]] == [1.0]
    assert found["supervisor.tick.duration"][0].count == 1


async def test_each_tick_records_once(store, clock, metric_reader):
    a = supervisor(store, clock, "sup-a")
    for _ in range(3):
        await a.tick()
        clock.advance(PERIOD)
    found = recorded(metric_reader)
    assert sum(p.count for p in found["supervisor.tick.duration"]) == 3
    assert sum(p.value for p in found.get("supervisor.rows_read", [])) == 0


async def test_sweep_tasks_run_in_the_ticks_context() -> None:
    """The tick's span (a context variable) is current in each sweep task, so the commands and
    alerts the sweep sends stay in the tick's trace."""
    import contextvars

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from service.sweep import _gather

    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="none")
    marker.set("tick")
    tracer = TracerProvider().get_tracer("test")

    async def look(_: int) -> tuple[str, object]:
        await asyncio.sleep(0)
        return marker.get(), trace.get_current_span()

    with tracer.start_as_current_span("tick") as tick:
        seen = await _gather(asyncio.Semaphore(2), look, range(4))
    assert [m for m, _ in seen] == ["tick"] * 4
    assert all(span is tick for _, span in seen)
