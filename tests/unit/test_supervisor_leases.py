"""Supervisor bucket leases: :func:`service.leases.plan` and the lease protocol of
``service.sweep.run_tick`` (claim short, extend or give up at the checkpoint) on one
:class:`MemorySupervision`.

Plain examples of ``plan()``, Hypothesis properties of one plan on any roster, and a stateful
test of several Supervisor instances ticking (``run_tick`` on a store with nothing due) against
one roster with a moving fake clock; instances join, die between ticks, die mid-tick (after
their claim) and claim on stale rosters. What is checked:

(a) a write to the roster never moves an unexpired lease from one instance to another, and a
    plan never takes a bucket another instance holds unexpired;
(b) once membership is stable for a few periods (each live instance ticking once per period,
    the schedule the Supervisor runs on), every bucket is held by a live instance, each exactly
    its rank share (sorted ids: the first ``16 % n`` take one more, so shares differ by at most
    one) and a further period changes no holder;
(c) a dead instance's buckets are swept again the first period they are orphans (free and not
    swept for a lease), whoever's share they fall in; on schedule each death delays a bucket's
    next sweep by at most one period: with at most one death, no bucket goes more than two
    periods between sweeps (the ``period + budget + period`` of the recovery bound);
(d) an instance holds (and so sweeps) its buckets oldest checkpoint first, never swept first;
(e) member rows expired ten leases ago are deleted by the holder of bucket 0;
(f) a claim planned on a stale roster raises ConcurrencyConflict and writes nothing, or touched
    only rows that had not changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from adapters.settings import Connection, Settings
from adapters.store.active_index import INDEX_BUCKETS
from adapters.store.rows import ConcurrencyConflict
from adapters.store.supervision import BucketLease, Member, Roster, Sweep
from devstack.memory import MemoryBus, MemoryStore, MemorySupervision
from service.leases import REAP_AFTER_LEASES, REAP_PER_TICK, plan
from service.runtime import Runtime
from service.sweep import run_tick

# A failing stateful example can take minutes to shrink on a loaded machine: that must read as
# the failure it is, not as a pytest-timeout.
pytestmark = [pytest.mark.timeout(600), pytest.mark.anyio]

SETTINGS = Settings(
    queues={},
    service_urls={},
    servicebus=Connection("sb"),
    storage=Connection("st"),
    supervisor_concurrency=1,
)
PERIOD = SETTINGS.supervisor_period
CLAIM = SETTINGS.supervisor_claim
LEASE = SETTINGS.supervisor_lease
T0 = datetime(2026, 1, 1, tzinfo=UTC)
_EPOCH = datetime.min.replace(tzinfo=UTC)
T = TypeVar("T")


# ------------------------------------------------------------------------------- helpers


def sweep_key(lease: BucketLease) -> tuple[bool, datetime, int]:
    """Sweep order as specified: never swept first, then oldest checkpoint, then bucket."""
    return (lease.swept_at is not None, lease.swept_at or _EPOCH, lease.bucket)


def roster_of(
    buckets: dict[int, BucketLease] | None = None, members: Sequence[Member] = ()
) -> Roster:
    rows = {b: BucketLease(b) for b in range(INDEX_BUCKETS)} | (buckets or {})
    return Roster(buckets=tuple(rows[b] for b in range(INDEX_BUCKETS)), members=tuple(members))


def swept(at: datetime) -> dict[int, BucketLease]:
    """Every bucket free and swept at ``at`` (so none is an orphan while ``at`` is recent)."""
    return {b: BucketLease(b, swept_at=at, etag=f"e{b}") for b in range(INDEX_BUCKETS)}


def rank_shares(instances: Sequence[str]) -> dict[str, int]:
    base, extra = divmod(INDEX_BUCKETS, len(instances))
    return {me: base + (i < extra) for i, me in enumerate(sorted(instances))}


async def holders(store: MemorySupervision, now: datetime) -> dict[int, str]:
    """Bucket -> instance holding an unexpired lease on it."""
    return {b.bucket: b.holder for b in (await store.read()).buckets if not b.free(now)}


async def counts(store: MemorySupervision, now: datetime) -> Counter[str]:
    return Counter((await holders(store, now)).values())


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


class Crashed(Exception):
    """The instance was killed during its tick (after its claim)."""


class _Index:
    def __init__(self, index: Any, view: View) -> None:
        self._index, self._view = index, view

    async def due(self, bucket: int, now: datetime, limit: int = 1000) -> Any:
        if self._view.crash:
            raise Crashed(bucket)
        return await self._index.due(bucket, now, limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)


class View:
    """One instance's handle on the shared store; ``crash`` kills its tick after the claim."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.crash = False
        self.index = _Index(store.index, self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class Fleet:
    """Supervisor instances (``run_tick``) on one store and clock, with nothing due."""

    def __init__(self, roster: Callable[[Clock], MemorySupervision] | None = None) -> None:
        self.clock = Clock()
        self.store = MemoryStore(self.clock)
        if roster is not None:
            self.store.supervision = roster(self.clock)
        self.views: dict[str, View] = {}
        self.runtimes: dict[str, Runtime] = {}

    @property
    def roster(self) -> MemorySupervision:
        return self.store.supervision

    def runtime(self, me: str) -> Runtime:
        if me not in self.runtimes:
            self.views[me] = View(self.store)
            self.runtimes[me] = Runtime(
                settings=SETTINGS,
                store=self.views[me],  # type: ignore[arg-type]
                bus=MemoryBus(),  # type: ignore[arg-type]
                workflows={},
                instance_id=me,
                clock=self.clock,
            )
        return self.runtimes[me]

    async def tick(self, me: str) -> int:
        """One whole tick; how many buckets it held."""
        return (await run_tick(self.runtime(me))).held

    async def crash(self, me: str) -> None:
        """A tick killed after its claim: the claim is written, nothing after it."""
        rt = self.runtime(me)
        self.views[me].crash = True
        with contextlib.suppress(Crashed):  # no Crashed: it held nothing, had nothing to do
            await run_tick(rt)

    async def round(
        self, instances: Sequence[str], order: Callable[[list[str]], list[str]]
    ) -> None:
        for me in order(list(instances)):
            await self.tick(me)
        self.clock.now += PERIOD

    async def held(self) -> Counter[str]:
        return await counts(self.roster, self.clock.now)


def in_order(instances: list[str]) -> list[str]:
    return instances


# ------------------------------------------------------------------------ plan: examples


def test_a_lone_instance_takes_every_bucket_claimed_short():
    chosen = plan(roster_of(), "sup-a", T0, CLAIM, LEASE)
    assert [b.bucket for b in chosen.hold] == list(range(INDEX_BUCKETS))
    assert all(b.holder == "sup-a" and b.until == T0 + CLAIM for b in chosen.hold)
    assert all(b.etag is None for b in chosen.hold)  # rows not written yet: created
    assert chosen.release == () and chosen.reap == ()
    assert chosen.member == Member("sup-a", T0 + LEASE, None)
    assert CLAIM < PERIOD < LEASE


def test_shares_are_divided_by_rank_of_instance_id():
    members = [Member(f"sup-{x}", T0 + LEASE, f"m{x}") for x in "abc"]
    roster = roster_of(swept(T0 - timedelta(seconds=1)), members)
    took = {me: plan(roster, me, T0, CLAIM, LEASE).hold for me in ("sup-a", "sup-b", "sup-c")}
    assert {me: len(hold) for me, hold in took.items()} == {"sup-a": 6, "sup-b": 5, "sup-c": 5}
    # each starts after the shares of those ranked before it: on a fresh roster, no overlap
    assert [took[me][0].bucket for me in ("sup-a", "sup-b", "sup-c")] == [0, 6, 11]
    assert len({b.bucket for hold in took.values() for b in hold}) == INDEX_BUCKETS


def test_expired_member_rows_do_not_count():
    members = [
        Member("sup-b", T0 + timedelta(seconds=1), "m1"),  # alive
        Member("sup-c", T0, "m2"),  # expired exactly now
        Member("sup-d", T0 - timedelta(seconds=1), "m3"),
    ]
    roster = roster_of(swept(T0 - timedelta(seconds=1)), members)
    assert len(plan(roster, "sup-a", T0, CLAIM, LEASE).hold) == 8
    assert len(plan(roster_of(swept(T0), members[1:]), "sup-a", T0, CLAIM, LEASE).hold) == 16


def test_free_buckets_are_swept_never_swept_first_then_oldest_checkpoint():
    rows = {
        b: BucketLease(b, swept_at=T0 - timedelta(seconds=10 - b % 5), etag=f"e{b}")
        for b in range(INDEX_BUCKETS)
        if b % 3
    }
    chosen = plan(roster_of(rows), "sup-a", T0, CLAIM, LEASE)
    assert [sweep_key(b) for b in chosen.hold] == sorted(map(sweep_key, chosen.hold))
    assert [b.bucket for b in chosen.hold][:6] == [0, 3, 6, 9, 12, 15]
    assert [b.bucket for b in chosen.hold][6:] == [5, 10, 1, 11, 2, 7, 8, 13, 4, 14]


def test_beyond_its_share_an_instance_keeps_sweeping_and_gives_the_newest_up():
    mine = {
        b: BucketLease(
            b,
            holder="sup-a",
            until=T0 + timedelta(seconds=5),
            swept_at=T0 - timedelta(seconds=b),  # bucket 15 swept longest ago
            swept_by="sup-a",
            lag_s=1.5,
            due_found=b,
            etag=f"e{b}",
        )
        for b in range(INDEX_BUCKETS)
    }
    members = [Member("sup-a", T0 + LEASE, "ma"), Member("sup-b", T0 + LEASE, "mb")]
    chosen = plan(roster_of(mine, members), "sup-a", T0, CLAIM, LEASE)
    # all 16 are swept this tick; the 8 swept most recently are given up when it ends
    assert [b.bucket for b in chosen.hold] == list(range(15, -1, -1))
    assert sorted(b.bucket for b in chosen.release) == list(range(8))
    assert set(chosen.release) <= set(chosen.hold)
    for lease in chosen.hold:
        assert (lease.holder, lease.until, lease.etag) == ("sup-a", T0 + CLAIM, f"e{lease.bucket}")
        old = mine[lease.bucket]
        assert (lease.swept_at, lease.lag_s, lease.due_found) == (
            old.swept_at,
            1.5,
            old.due_found,
        )
    assert chosen.member.etag == "ma"


def test_unexpired_leases_of_others_are_never_taken_expired_ones_are():
    others = {
        b: BucketLease(
            b,
            holder="sup-b",
            until=T0 + timedelta(seconds=1) if b < 8 else T0,  # 8..15 expire exactly now
            swept_at=T0 - timedelta(seconds=60),  # orphans, were they free
            etag=f"e{b}",
        )
        for b in range(INDEX_BUCKETS)
    }
    chosen = plan(roster_of(others), "sup-a", T0, CLAIM, LEASE)
    assert [b.bucket for b in chosen.hold] == list(range(8, 16))


def test_orphans_are_taken_beyond_the_share_recently_swept_free_buckets_are_not():
    others = [Member(f"sup-{x}", T0 + LEASE, f"m{x}") for x in "bcd"]  # four alive: share 4
    rows = swept(T0 - LEASE)  # exactly a lease ago: not orphans yet
    for b in (9, 12):
        rows[b] = dataclasses.replace(rows[b], swept_at=T0 - LEASE - timedelta(microseconds=1))
    rows[13] = BucketLease(13)  # never swept (its row not written yet): an orphan
    for b in range(4):  # its share, held already: no room
        rows[b] = dataclasses.replace(rows[b], holder="sup-a", until=T0 + timedelta(seconds=1))
    chosen = plan(roster_of(rows, others), "sup-a", T0, CLAIM, LEASE)
    assert [b.bucket for b in chosen.hold] == [13, 9, 12, 0, 1, 2, 3]


def test_orphans_taken_beyond_the_share_are_given_up_when_the_tick_ends():
    others = [Member(f"sup-{x}", T0 + LEASE, f"m{x}") for x in "bcd"]
    rows = swept(T0 - timedelta(seconds=1))
    rows[13] = BucketLease(13)
    for b in range(4):
        rows[b] = dataclasses.replace(rows[b], holder="sup-a", until=T0 + timedelta(seconds=1))
    chosen = plan(roster_of(rows, others), "sup-a", T0, CLAIM, LEASE)
    assert 13 in {b.bucket for b in chosen.hold}
    assert [b.bucket for b in chosen.release] == [13]


def test_after_lost_races_a_claim_only_renews():
    rows = swept(T0 - LEASE * 2)  # all orphans
    rows[0] = dataclasses.replace(rows[0], holder="sup-a", until=T0 + timedelta(seconds=3))
    gone = Member("sup-x", T0 - LEASE * (REAP_AFTER_LEASES + 1), "mx")
    chosen = plan(roster_of(rows, [gone]), "sup-a", T0, CLAIM, LEASE, take=False)
    assert [b.bucket for b in chosen.hold] == [0]
    assert chosen.reap == ()
    assert plan(roster_of(rows, [gone]), "sup-a", T0, CLAIM, LEASE).reap == (gone,)


def test_own_expired_lease_is_retaken_like_any_free_bucket():
    rows = swept(T0)
    rows[3] = dataclasses.replace(rows[3], holder="sup-a", until=T0)
    chosen = plan(roster_of(rows), "sup-a", T0, CLAIM, LEASE)
    assert dataclasses.replace(rows[3], until=T0 + CLAIM) in chosen.hold


def test_reap_is_done_by_the_holder_of_bucket_zero_only_and_a_few_at_a_time():
    cutoff = T0 - LEASE * REAP_AFTER_LEASES
    gone = tuple(
        Member(f"sup-old{i:02d}", cutoff - timedelta(seconds=1 + i), f"m{i}") for i in range(25)
    )
    borderline = Member("sup-edge", cutoff, "medge")  # exactly ten leases: kept
    me_old = Member("sup-a", cutoff - timedelta(hours=1), "mine")  # never reaps itself
    roster = roster_of(members=(*gone, borderline, me_old))
    chosen = plan(roster, "sup-a", T0, CLAIM, LEASE)
    assert 0 in {b.bucket for b in chosen.hold}
    assert chosen.reap == gone[:REAP_PER_TICK]
    assert chosen.member.etag == "mine"

    zero = {0: BucketLease(0, holder="sup-b", until=T0 + CLAIM, etag="e0")}
    assert plan(roster_of(zero, roster.members), "sup-a", T0, CLAIM, LEASE).reap == ()


# ------------------------------------------------------------------ run_tick: examples


async def test_five_instances_hold_their_rank_shares():
    fleet = Fleet()
    instances = ["sup-e", "sup-d", "sup-c", "sup-b", "sup-a"]
    for _ in range(5):
        await fleet.round(instances, in_order)
    assert (
        await fleet.held()
        == rank_shares(instances)
        == {
            "sup-a": 4,
            "sup-b": 3,
            "sup-c": 3,
            "sup-d": 3,
            "sup-e": 3,
        }
    )


async def test_a_newcomer_gets_its_share_within_two_periods_and_no_bucket_is_skipped():
    fleet = Fleet()
    await fleet.round(["sup-a"], in_order)
    assert await fleet.held() == {"sup-a": 16}
    await fleet.round(["sup-b", "sup-a"], in_order)  # sup-b: nothing free yet; sup-a gives 8 up
    assert await fleet.held() == {"sup-a": 8}
    start = fleet.clock.now
    await fleet.round(["sup-b", "sup-a"], in_order)
    assert await fleet.held() == {"sup-a": 8, "sup-b": 8}
    roster = await fleet.roster.read()
    assert all(b.swept_at == start for b in roster.buckets)


async def test_a_tick_killed_after_its_claim_frees_its_buckets_for_the_next_tick():
    fleet = Fleet()
    for _ in range(3):
        await fleet.round(["sup-a", "sup-b", "sup-c"], in_order)
    held = await holders(fleet.roster, fleet.clock.now)
    dead = sorted(b for b, holder in held.items() if holder == "sup-c")
    assert dead
    await fleet.tick("sup-a")
    await fleet.tick("sup-b")
    await fleet.crash("sup-c")
    roster = await fleet.roster.read()
    assert all(roster.buckets[b].until == fleet.clock.now + CLAIM for b in dead)
    fleet.clock.now += PERIOD
    start = fleet.clock.now
    await fleet.round(["sup-a", "sup-b"], in_order)
    roster = await fleet.roster.read()
    assert all(roster.buckets[b].swept_at == start for b in dead)


async def test_an_instance_killed_between_ticks_loses_its_buckets_one_period_late():
    fleet = Fleet()
    for _ in range(3):
        await fleet.round(["sup-a", "sup-b", "sup-c"], in_order)
    last = fleet.clock.now - PERIOD  # sup-c's last tick
    held = await holders(fleet.roster, fleet.clock.now)
    dead = sorted(b for b, holder in held.items() if holder == "sup-c")
    await fleet.round(["sup-a", "sup-b"], in_order)  # sup-c's leases still hold
    roster = await fleet.roster.read()
    assert all(roster.buckets[b].swept_at == last for b in dead)
    start = fleet.clock.now
    await fleet.round(["sup-a", "sup-b"], in_order)
    roster = await fleet.roster.read()
    assert all(roster.buckets[b].swept_at == start for b in dead)
    assert start - last == 2 * PERIOD
    await fleet.round(["sup-a", "sup-b"], in_order)
    assert await fleet.held() == {"sup-a": 8, "sup-b": 8}


async def test_a_dead_holders_buckets_are_taken_even_when_a_newcomer_died_meanwhile():
    """A member row that outlives its instance shrinks the others' shares; the orphan rule still
    has the dead holder's buckets swept the first period they are free."""
    fleet = Fleet()
    for _ in range(3):
        await fleet.round(["sup-a", "sup-b", "sup-c"], in_order)
    last = fleet.clock.now - PERIOD
    held = await holders(fleet.roster, fleet.clock.now)
    dead = sorted(b for b, holder in held.items() if holder == "sup-c")
    # sup-d joins, finds nothing free, dies
    await fleet.round(["sup-d", "sup-a", "sup-b"], in_order)
    await fleet.round(["sup-a", "sup-b"], in_order)
    swept_at = {b.bucket: b.swept_at for b in (await fleet.roster.read()).buckets}
    assert all(swept_at[b] == last + 2 * PERIOD for b in dead)


async def test_reaped_member_rows_are_deleted():
    fleet = Fleet()
    await fleet.tick("sup-x")
    await fleet.tick("sup-y")
    fleet.clock.now += LEASE * (REAP_AFTER_LEASES + 1) + timedelta(seconds=1)
    await fleet.tick("sup-a")
    assert [m.instance for m in (await fleet.roster.read()).members] == ["sup-a"]


# -------------------------------------------------------------------- (f) stale rosters


async def test_claims_planned_on_one_stale_roster_the_second_conflicts_and_writes_nothing():
    store = MemorySupervision()
    stale = await store.read()
    first = plan(stale, "sup-a", T0, CLAIM, LEASE)
    second = plan(stale, "sup-b", T0, CLAIM, LEASE)
    await store.claim(first.member, first.hold, (), first.reap)
    before = await store.read()
    with pytest.raises(ConcurrencyConflict):
        await store.claim(second.member, second.hold, (), second.reap)
    assert await store.read() == before
    assert [m.instance for m in (await store.read()).members] == ["sup-a"]


async def test_a_stale_reap_conflicts_and_the_renewal_in_the_same_claim_is_not_written():
    fleet = Fleet()
    await fleet.tick("sup-x")
    now = T0 + LEASE * (REAP_AFTER_LEASES + 1) + timedelta(seconds=1)
    chosen = plan(await fleet.roster.read(), "sup-a", now, CLAIM, LEASE)
    assert [m.instance for m in chosen.reap] == ["sup-x"]
    await fleet.tick("sup-x")  # sup-x's row is written again meanwhile (new ETag)
    before = await fleet.roster.read()
    with pytest.raises(ConcurrencyConflict):
        await fleet.roster.claim(chosen.member, chosen.hold, (), chosen.reap)
    assert await fleet.roster.read() == before


@settings(max_examples=100, deadline=None)
@given(
    warmup=st.lists(
        st.tuples(st.sampled_from(("sup-a", "sup-b", "sup-c")), st.integers(0, 40)), max_size=10
    ),
    racers=st.lists(
        st.sampled_from(("sup-a", "sup-b", "sup-c", "sup-d")), min_size=2, max_size=4, unique=True
    ),
)
async def test_claims_on_one_stale_roster_are_all_or_nothing(
    warmup: list[tuple[str, int]], racers: list[str]
) -> None:
    fleet = Fleet()
    for me, seconds in warmup:
        fleet.clock.now += timedelta(seconds=seconds)
        await fleet.tick(me)
    now = fleet.clock.now
    stale = await fleet.roster.read()
    won: dict[str, set[int]] = {}
    for me in racers:
        chosen = plan(stale, me, now, CLAIM, LEASE)
        before = await fleet.roster.read()
        try:
            await fleet.roster.claim(chosen.member, chosen.hold, (), chosen.reap)
        except ConcurrencyConflict:
            assert await fleet.roster.read() == before
            continue
        touched = {b.bucket for b in chosen.hold}
        assert all(before.buckets[b].etag == stale.buckets[b].etag for b in touched)
        assert not any(touched & other for other in won.values())
        won[me] = touched
    assert won, "the first claim on a fresh read cannot conflict"


# ------------------------------------------------------------------- plan: properties

INSTANCES = ("sup-a", "sup-b", "sup-c", "sup-d")
moments = st.integers(min_value=-400, max_value=60).map(lambda s: T0 + timedelta(seconds=s))
checkpoints = st.none() | st.integers(min_value=0, max_value=6).map(
    lambda s: T0 - timedelta(seconds=5 * s)  # few values: ties are common; some orphans
)


@st.composite
def rosters(draw: st.DrawFn) -> Roster:
    buckets = []
    for b in range(INDEX_BUCKETS):
        if not draw(st.booleans()):
            buckets.append(BucketLease(b))
            continue
        buckets.append(
            BucketLease(
                b,
                holder=draw(st.sampled_from(("", *INSTANCES))),
                until=draw(st.none() | moments),
                swept_at=draw(checkpoints),
                swept_by=draw(st.sampled_from(("", *INSTANCES))),
                lag_s=draw(st.floats(0, 100)),
                due_found=draw(st.integers(0, 5)),
                etag=f"e{b}",
            )
        )
    names = draw(st.lists(st.sampled_from((*INSTANCES, *(f"sup-z{i}" for i in range(30))))))
    members = tuple(
        Member(name, T0 + timedelta(seconds=draw(st.integers(-4000, 60))), f"m-{name}")
        for name in dict.fromkeys(names)
    )
    return Roster(buckets=tuple(buckets), members=members)


@settings(max_examples=300, deadline=None)
@given(roster=rosters(), me=st.sampled_from(INSTANCES), take=st.booleans())
def test_plan_properties(roster: Roster, me: str, take: bool) -> None:
    now = T0
    chosen = plan(roster, me, now, CLAIM, LEASE, take=take)
    by_bucket = {b.bucket: b for b in roster.buckets}
    alive = sorted({m.instance for m in roster.members if m.until > now} | {me})
    share = rank_shares(alive)[me]
    mine = {b.bucket for b in roster.buckets if b.held_by(me, now)}
    free = {b.bucket for b in roster.buckets if b.free(now)}
    orphans = {
        b for b in free if by_bucket[b].swept_at is None or now - by_bucket[b].swept_at > LEASE
    }
    held = [b.bucket for b in chosen.hold]
    taken = set(held) - mine

    assert len(held) == len(set(held))
    assert mine <= set(held)  # what it holds it keeps sweeping this tick
    assert taken <= free  # (a) never a bucket another instance holds unexpired
    if not take:
        assert taken == set() and chosen.reap == ()
    else:
        assert orphans <= taken  # no orphan left behind
        assert len(taken - orphans) <= max(0, share - len(mine))  # the rest: up to its share
        if free - taken:  # took all it had room for
            assert len(taken) >= min(len(free), max(0, share - len(mine)))
    # Beyond its share (the most recently swept of what it held before, and orphans taken past
    # its room), swept now and given up at the end: it keeps exactly what its share allows.
    ordered = [b.bucket for b in sorted((by_bucket[b] for b in mine), key=sweep_key)]
    released = {b.bucket for b in chosen.release}
    kept = set(held) - released
    room = max(0, share - len(mine))
    assert set(ordered[:share]) <= kept and released & mine == set(ordered[share:])
    assert len(kept) == min(len(mine), share) + (min(room, len(free)) if take else 0)
    assert released - mine <= orphans
    assert set(chosen.release) <= set(chosen.hold)
    for lease in chosen.hold:
        read = by_bucket[lease.bucket]
        assert (lease.holder, lease.until) == (me, now + CLAIM)
        assert dataclasses.replace(lease, holder=read.holder, until=read.until) == read
    # (d)
    assert [sweep_key(b) for b in chosen.hold] == sorted(sweep_key(b) for b in chosen.hold)
    # (e)
    cutoff = now - LEASE * REAP_AFTER_LEASES
    old = [m for m in roster.members if m.until < cutoff and m.instance != me]
    assert chosen.reap == (tuple(old[:REAP_PER_TICK]) if take and 0 in held else ())
    assert chosen.member == Member(
        me, now + LEASE, next((m.etag for m in roster.members if m.instance == me), None)
    )


# ---------------------------------------------------------------- many instances, one roster


class Observed(MemorySupervision):
    """The roster, checking every write: (a) no unexpired lease changes hands; (d) the sweep
    order of a claim; (e) what a claim reaps is gone; (f) a conflict writes nothing."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    async def claim(
        self,
        member: Member,
        hold: Sequence[BucketLease],
        release: Sequence[BucketLease],
        reap: Sequence[Member] = (),
    ) -> dict[int, str]:
        before = await self.read()
        try:
            etags = await super().claim(member, hold, release, reap)
        except ConcurrencyConflict:
            assert await self.read() == before, "(f) a conflicting claim wrote something"
            raise
        after = await self.read()
        self._no_takeover(before, after)
        assert [sweep_key(b) for b in hold] == sorted(map(sweep_key, hold)), "(d)"
        assert not {m.instance for m in reap} & {m.instance for m in after.members}, "(e)"
        return etags

    async def checkpoint(
        self, sweeps: Sequence[Sweep], by: str, *, others: Sequence[BucketLease] = ()
    ) -> int:
        before = await self.read()
        written = await super().checkpoint(sweeps, by, others=others)
        self._no_takeover(before, await self.read())
        return written

    def _no_takeover(self, before: Roster, after: Roster) -> None:
        now = self.clock()
        for old, new in zip(before.buckets, after.buckets, strict=True):
            if not old.free(now) and not new.free(now):
                assert new.holder == old.holder, f"(a) bucket {old.bucket}: {old} -> {new}"


class Supervisors(RuleBasedStateMachine):
    """A ``round`` is the Supervisor's schedule: every live instance ticks once (any order) at
    the same ``now``, then a period passes. The rules run the ticks to the end on the machine's
    own event loop, closed in :meth:`teardown`."""

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.fleet = Fleet(Observed)
        self.live: list[str] = []
        self.joined = 0
        self.stale: dict[str, Roster] = {}
        self.stable = 0
        """Rounds in a row with the same members and nothing else in between."""
        self.on_schedule = 0
        """Rounds in a row with nothing but rounds, joins and deaths in between."""
        self.last_holders: dict[int, str] | None = None
        self.deaths: list[datetime] = []

    @property
    def now(self) -> datetime:
        return self.fleet.clock.now

    def run(self, call: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(call)

    def teardown(self) -> None:
        self.runner.close()

    def _join(self) -> None:
        self.joined += 1
        self.live.append(f"sup-{self.joined:02d}")
        self.stable = 0

    @initialize(n=st.integers(1, 4))
    def start(self, n: int) -> None:
        for _ in range(n):
            self._join()

    @precondition(lambda self: len(self.live) < 7)
    @rule()
    def join(self) -> None:
        self._join()

    @precondition(lambda self: len(self.live) > 1)
    @rule(data=st.data(), mid_tick=st.booleans())
    def die(self, data: st.DataObject, mid_tick: bool) -> None:
        me = data.draw(st.sampled_from(self.live))
        if mid_tick:
            self.run(self.fleet.crash(me))
        self.live.remove(me)
        self.stale.pop(me, None)
        self.deaths.append(self.now)
        self.stable = 0

    @rule(data=st.data())
    def off_schedule_tick(self, data: st.DataObject) -> None:
        self.run(self.fleet.tick(data.draw(st.sampled_from(self.live))))
        self.stable = self.on_schedule = 0

    @precondition(lambda self: any(i not in self.stale for i in self.live))
    @rule(data=st.data())
    def read_roster(self, data: st.DataObject) -> None:
        """An instance reads the roster; others may write before it claims."""
        me = data.draw(st.sampled_from([i for i in self.live if i not in self.stale]))
        self.stale[me] = self.run(self.fleet.roster.read())

    @precondition(lambda self: self.stale)
    @rule(data=st.data(), take=st.booleans())
    def claim_on_stale_roster(self, data: st.DataObject, take: bool) -> None:
        me = data.draw(st.sampled_from(sorted(self.stale)))
        roster = self.stale.pop(me)
        chosen = plan(roster, me, self.now, CLAIM, LEASE, take=take)
        before = self.run(self.fleet.roster.read())
        try:
            self.run(self.fleet.roster.claim(chosen.member, chosen.hold, (), chosen.reap))
        except ConcurrencyConflict:
            return
        touched = [b.bucket for b in chosen.hold]
        assert all(before.buckets[b].etag == roster.buckets[b].etag for b in touched), "(f)"
        self.stable = self.on_schedule = 0  # claimed, never closed: a tick that died

    @rule(seconds=st.sampled_from([1, 7, 15, 23, 60, 300]))
    def time_passes(self, seconds: int) -> None:
        self.fleet.clock.now += timedelta(seconds=seconds)
        self.stable = self.on_schedule = 0

    @rule(data=st.data(), n=st.integers(1, 6))
    def rounds(self, data: st.DataObject, n: int) -> None:
        self.stale.clear()  # reads in flight are dropped: their ticks start again
        for _ in range(n):
            self.run(self._round(data))

    async def _round(self, data: st.DataObject) -> None:
        start = self.now
        before = await self.fleet.roster.read()
        orphans = {
            b.bucket
            for b in before.buckets
            if b.free(start) and (b.swept_at is None or start - b.swept_at > LEASE)
        }
        order = data.draw(st.permutations(self.live))
        await self.fleet.round(self.live, lambda _: list(order))
        self.stable += 1
        self.on_schedule += 1
        after = await self.fleet.roster.read()
        swept_at = {b.bucket: b.swept_at for b in after.buckets}
        # (c) orphans are swept the first period they are orphans, whoever's share they fall in
        assert all(swept_at[b] == start for b in orphans), (orphans, swept_at)
        if orphans:
            event("(c) orphans swept")
        # (c) on schedule, a bucket waits one period between sweeps, plus one per death since
        if self.on_schedule >= 3:
            late = {}
            for b, at in swept_at.items():
                deaths = sum(1 for d in self.deaths if at is None or d >= at)
                if at is None or start - at > PERIOD * max(1, deaths):
                    late[b] = (at, deaths)
            assert not late, f"swept too long ago at {start}: {late}"
            event("(c) sweep gap checked")
        # (b) stable membership: rank shares exactly, then no churn
        current = await holders(self.fleet.roster, self.now)
        if self.stable >= 5:
            assert set(current) == set(range(INDEX_BUCKETS)), current
            assert Counter(current.values()) == rank_shares(self.live)
            cutoff = start - LEASE * REAP_AFTER_LEASES
            long_dead = [m for m in before.members if m.until < cutoff]
            if len(long_dead) <= REAP_PER_TICK:
                assert not [m for m in after.members if m.until < cutoff], "(e)"
        if self.stable >= 6:
            assert current == self.last_holders, "holders changed with membership stable"
            event("(b) checked")
        self.last_holders = current

    @invariant()
    def rows_are_the_roster(self) -> None:
        roster = self.run(self.fleet.roster.read())
        assert [b.bucket for b in roster.buckets] == list(range(INDEX_BUCKETS))
        assert len({m.instance for m in roster.members}) == len(roster.members)


Supervisors.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_supervisors = Supervisors.TestCase
