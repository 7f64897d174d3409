"""The Supervisor's roster store: :class:`SupervisionTable` on Azurite (a fresh table per test)
and :class:`MemorySupervision` keep the same contract.

- ``read`` of an empty roster: 16 free buckets, no ETags, no members;
- ``claim`` creates the rows, renews and releases leases, deletes reaped member rows and returns
  the written buckets' ETags, all or nothing: one stale row (bucket or reaped member) and
  nothing is written, the claimant's member row included;
- ``checkpoint`` records ``swept_at`` / ``swept_by`` / ``lag_s`` / ``due_found`` (and writes
  ``others`` as given: leases extended or given up) on condition of the claim's ETag, and skips
  a bucket whose row changed since, writing the rest;
- datetimes come back as the same instants, in UTC.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from adapters.settings import Connection, Settings
from adapters.store.active_index import INDEX_BUCKETS
from adapters.store.rows import ConcurrencyConflict
from adapters.store.supervision import BucketLease, Member, Roster, SupervisionTable, Sweep
from adapters.tables import TableService
from devstack.memory import MemorySupervision
from domain.ids import InvalidId
from service.leases import REAP_AFTER_LEASES, plan
from tests.support.storage_faults import through_proxy

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

_SETTINGS = Settings(
    queues={}, service_urls={}, servicebus=Connection("sb"), storage=Connection("st")
)
CLAIM = _SETTINGS.supervisor_claim
LEASE = _SETTINGS.supervisor_lease
T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)

Store = SupervisionTable | MemorySupervision


@pytest.fixture
async def supervision_table(azurite: Any, unique_name: Any) -> AsyncIterator[SupervisionTable]:
    name = unique_name("supervision")
    service = TableService.from_connection_string(azurite.connection_string)
    await service.create_table_if_not_exists(name)
    table = service.get_table_client(name)
    yield SupervisionTable(table)
    await service.delete_table(name)
    await table.close()
    await service.close()


@pytest.fixture(params=["memory", "table"])
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "memory":
        return MemorySupervision()
    return request.getfixturevalue("supervision_table")  # type: ignore[no-any-return]


def lease(
    bucket: int, holder: str = "sup-a", etag: str | None = None, until: datetime = T0 + CLAIM
) -> BucketLease:
    return BucketLease(bucket, holder=holder, until=until, etag=etag)


def member(instance: str = "sup-a", until: datetime = T0 + LEASE) -> Member:
    return Member(instance, until)


def members(roster: Roster) -> dict[str, datetime]:
    return {m.instance: m.until for m in roster.members}


async def claim_all(store: Store, holder: str = "sup-a") -> dict[int, BucketLease]:
    """``holder`` claims every bucket of an empty roster; the leases with their ETags."""
    etags = await store.claim(member(holder), [lease(b, holder) for b in range(INDEX_BUCKETS)], [])
    return {b: lease(b, holder, etags[b]) for b in range(INDEX_BUCKETS)}


# ----------------------------------------------------------------------------------- read


async def test_an_empty_roster_is_sixteen_free_buckets(store: Store):
    roster = await store.read()
    assert roster.members == ()
    assert roster.buckets == tuple(BucketLease(b) for b in range(INDEX_BUCKETS))
    assert all(b.free(T0) and b.etag is None for b in roster.buckets)


# ---------------------------------------------------------------------------------- claim


async def test_a_claim_planned_on_an_empty_roster_creates_the_bucket_and_member_rows(store: Store):
    chosen = plan(await store.read(), "sup-a", T0, CLAIM, LEASE)
    etags = await store.claim(chosen.member, chosen.hold, (), chosen.reap)

    roster = await store.read()
    assert set(etags) == set(range(INDEX_BUCKETS))
    assert members(roster) == {"sup-a": T0 + LEASE}
    assert all(m.etag for m in roster.members)
    for b in roster.buckets:
        assert (b.holder, b.until, b.etag) == ("sup-a", T0 + CLAIM, etags[b.bucket])
        assert b.held_by("sup-a", T0) and not b.free(T0)
        assert (b.swept_at, b.swept_by, b.lag_s, b.due_found) == (None, "", 0.0, 0)


async def test_renewing_and_releasing_with_the_etags_the_claim_returned(store: Store):
    held = await claim_all(store)
    later = T0 + timedelta(seconds=15)
    renew = [dataclasses.replace(held[b], until=later + CLAIM) for b in range(8)]
    give_up = [dataclasses.replace(held[b], holder="", until=later) for b in range(8, 16)]

    etags = await store.claim(member(until=later + LEASE), renew, give_up)

    roster = await store.read()
    assert set(etags) == set(range(INDEX_BUCKETS))  # released rows are written too
    assert members(roster) == {"sup-a": later + LEASE}
    for b in roster.buckets:
        assert b.etag == etags[b.bucket] != held[b.bucket].etag
        if b.bucket < 8:
            assert b.held_by("sup-a", later)
        else:
            assert (b.holder, b.until) == ("", later) and b.free(later)


async def test_a_claim_on_a_stale_roster_conflicts_and_writes_nothing(store: Store):
    stale = await store.read()
    first = plan(stale, "sup-a", T0, CLAIM, LEASE)
    await store.claim(first.member, first.hold, (), first.reap)
    before = await store.read()

    second = plan(stale, "sup-b", T0, CLAIM, LEASE)  # creates rows that now exist
    with pytest.raises(ConcurrencyConflict):
        await store.claim(second.member, second.hold, (), second.reap)

    assert await store.read() == before
    assert members(await store.read()) == {"sup-a": T0 + LEASE}


async def test_one_stale_bucket_fails_the_whole_claim_member_row_included(store: Store):
    etags = await store.claim(member(), [lease(b) for b in range(8)], [])
    before = await store.read()

    fresh = [lease(b, "sup-b") for b in range(8, INDEX_BUCKETS)]  # rows not written yet
    taken = lease(3, "sup-b")  # read before sup-a created it: stale
    with pytest.raises(ConcurrencyConflict):
        await store.claim(member("sup-b"), [*fresh, taken], [])
    assert await store.read() == before

    renewed = lease(0, etag=etags[0])
    await store.claim(member(), [renewed], [])
    before = await store.read()
    with pytest.raises(ConcurrencyConflict):
        # bucket 1's ETag is current; bucket 0's was spent by the claim above
        await store.claim(member("sup-c"), [lease(1, etag=etags[1])], [renewed])
    assert await store.read() == before
    assert "sup-c" not in members(await store.read())


async def test_a_stale_release_fails_the_claim(store: Store):
    etags = await store.claim(member(), [lease(0)], [])
    await store.claim(member(), [lease(0, etag=etags[0])], [])
    before = await store.read()
    gone = BucketLease(0, holder="", until=T0, etag=etags[0])  # the first claim's ETag
    with pytest.raises(ConcurrencyConflict):
        await store.claim(member(until=T0 + LEASE * 2), [], [gone])
    assert await store.read() == before


async def test_reap_deletes_member_rows_and_a_stale_reap_fails_the_claim(store: Store):
    await store.claim(member("sup-x", T0), [], [])
    await store.claim(member("sup-y", T0), [], [])
    later = T0 + LEASE * (REAP_AFTER_LEASES + 1)

    chosen = plan(await store.read(), "sup-a", later, CLAIM, LEASE)
    assert {m.instance for m in chosen.reap} == {"sup-x", "sup-y"}
    await store.claim(member("sup-y", T0), [], [])  # sup-y's row is written again (new ETag)
    before = await store.read()
    with pytest.raises(ConcurrencyConflict):
        await store.claim(chosen.member, chosen.hold, (), chosen.reap)
    assert await store.read() == before

    chosen = plan(await store.read(), "sup-a", later, CLAIM, LEASE)
    await store.claim(chosen.member, chosen.hold, (), chosen.reap)
    assert members(await store.read()) == {"sup-a": later + LEASE}


async def test_reaping_a_row_already_gone_fails_the_claim(store: Store):
    await store.claim(member("sup-x", T0), [], [])
    (row,) = (await store.read()).members
    await store.claim(member(), [], [], [row])
    with pytest.raises(ConcurrencyConflict):
        await store.claim(member(), [lease(0)], [], [row])
    assert (await store.read()).buckets[0].etag is None


async def test_an_invalid_instance_id_is_refused_before_anything_is_written(store: Store):
    with pytest.raises(InvalidId):
        await store.claim(member("sup a/../x"), [lease(0)], [])
    assert (await store.read()).buckets[0].etag is None
    assert (await store.read()).members == ()


# ----------------------------------------------------------------------------- checkpoint


async def test_checkpoint_records_the_sweeps_and_writes_the_other_leases(store: Store):
    held = await claim_all(store)
    at = T0 + timedelta(seconds=3, microseconds=654321)
    extended = dataclasses.replace(held[7], until=T0 + LEASE)
    given_up = dataclasses.replace(held[9], holder="", until=at)
    sweeps = [
        Sweep(dataclasses.replace(held[2], until=T0 + LEASE), at, 12.3456789, 7),
        Sweep(held[5], at, 0.0, 0),
    ]

    assert await store.checkpoint(sweeps, "sup-a", others=[extended, given_up]) == 4

    roster = await store.read()
    two, five, seven, nine = (roster.buckets[b] for b in (2, 5, 7, 9))
    assert (two.swept_at, two.swept_by, two.lag_s, two.due_found) == (at, "sup-a", 12.346, 7)
    assert (five.swept_at, five.swept_by, five.lag_s, five.due_found) == (at, "sup-a", 0.0, 0)
    assert (two.holder, two.until) == ("sup-a", T0 + LEASE)
    assert (five.holder, five.until) == ("sup-a", T0 + CLAIM)
    assert (seven.holder, seven.until, seven.swept_at) == ("sup-a", T0 + LEASE, None)
    assert (nine.holder, nine.until) == ("", at) and nine.free(at)
    for b in (2, 5, 7, 9):
        assert roster.buckets[b].etag != held[b].etag  # a checkpoint is a write
    assert roster.buckets[3] == held[3]

    # the next claim carries the checkpoint over
    renewed = dataclasses.replace(two, until=T0 + timedelta(seconds=15) + CLAIM)
    await store.claim(member(), [renewed], [])
    assert ((await store.read()).buckets[2].swept_at, (await store.read()).buckets[2].lag_s) == (
        at,
        12.346,
    )


async def test_checkpoint_skips_a_bucket_whose_row_changed_since_the_claim(store: Store):
    held = await claim_all(store)
    later = T0 + CLAIM  # sup-a's claims expired; sup-b takes some over before sup-a ends
    etags = await store.claim(
        member("sup-b", later + LEASE), [lease(b, "sup-b", held[b].etag) for b in (1, 4)], []
    )
    before = await store.read()

    late = [Sweep(held[b], later, 1.0, 1) for b in (1, 4)]
    assert await store.checkpoint(late, "sup-a", others=[held[1]]) == 0
    assert await store.read() == before

    # some still current: those are written, the others keep their new holder's record
    sweeps = [Sweep(held[1], later, 0, 0), Sweep(held[6], later, 2.0, 3)]
    assert await store.checkpoint(sweeps, "sup-a", others=[held[4], held[8]]) == 2
    after = await store.read()
    assert (after.buckets[6].swept_at, after.buckets[6].swept_by) == (later, "sup-a")
    assert after.buckets[8].etag != before.buckets[8].etag
    assert after.buckets[1] == before.buckets[1] and after.buckets[1].etag == etags[1]
    assert after.buckets[4] == before.buckets[4]


async def test_a_checkpoint_spends_the_claims_etag(store: Store):
    held = await claim_all(store)
    assert await store.checkpoint([Sweep(held[0], T0, 0, 0)], "sup-a") == 1
    assert await store.checkpoint([Sweep(held[0], T0 + timedelta(seconds=1), 0, 0)], "sup-a") == 0
    assert await store.checkpoint([], "sup-a", others=[held[0]]) == 0
    assert (await store.read()).buckets[0].swept_at == T0


async def test_an_empty_checkpoint_writes_nothing(store: Store):
    held = await claim_all(store)
    before = await store.read()
    assert await store.checkpoint([], "sup-a") == 0
    assert await store.read() == before
    assert before.buckets[0].etag == held[0].etag


# ------------------------------------------------------------------------------ datetimes


async def test_datetimes_round_trip_as_the_same_instants_in_utc(store: Store):
    until = datetime(2026, 3, 1, 12, 0, 22, 999999, tzinfo=UTC)
    swept = datetime(2026, 3, 1, 12, 0, 1, 1, tzinfo=UTC)
    etags = await store.claim(Member("sup-a", until), [BucketLease(9, "sup-a", until)], [])
    await store.checkpoint([Sweep(BucketLease(9, "sup-a", until, etag=etags[9]), swept, 0, 0)], "a")

    roster = await store.read()
    nine = roster.buckets[9]
    assert (nine.until, nine.swept_at, roster.members[0].until) == (until, swept, until)
    for value in (nine.until, nine.swept_at, roster.members[0].until):
        assert value is not None and value.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "store",
    [
        "memory",
        "table",
    ],
    indirect=True,
)
async def test_datetimes_in_another_zone_come_back_in_utc(store: Store):
    paris = timezone(timedelta(hours=2))
    until = datetime(2026, 3, 1, 14, 0, 22, 500000, tzinfo=paris)
    etags = await store.claim(Member("sup-a", until), [BucketLease(1, "sup-a", until)], [])
    await store.checkpoint([Sweep(BucketLease(1, "sup-a", until, etag=etags[1]), until, 0, 0)], "a")
    roster = await store.read()
    expected = datetime(2026, 3, 1, 12, 0, 22, 500000, tzinfo=UTC)
    for value in (roster.buckets[1].until, roster.buckets[1].swept_at, roster.members[0].until):
        assert value == expected
        assert value is not None and value.tzinfo == UTC


# ------------------------------------------------------- writes whose outcome is unknown
# Through the storage fault proxy, in front of Azurite (tests.support.storage_faults): a write
# whose answer is lost, or whose resend is refused because the first landed, is read back. The
# rows it wrote carry its WriteId: they are ours if they say so.


@pytest.fixture
async def faulty(azurite: Any, supervision_table: SupervisionTable) -> AsyncIterator[Any]:
    """The proxy, and the roster of ``supervision_table`` through it."""
    name = supervision_table._table.table_name
    async with through_proxy(azurite, hold_s=2.0, read_timeout=0.5) as (proxy, service):
        yield proxy, SupervisionTable(service.get_table_client(name))


async def test_a_lease_write_resent_after_a_read_timeout_is_not_reported_lost(
    supervision_table: SupervisionTable, faulty: Any
):
    """sup-b took bucket 1 over, so sup-a's checkpoint goes row by row. Its PUT of bucket 2
    lands, but the answer does not come within the read timeout; azure-core sends the PUT
    again, and the service refuses the resend (412: the row changed, by the first)."""
    proxy, through = faulty
    held = await claim_all(supervision_table)
    await supervision_table.claim(member("sup-b"), [lease(1, "sup-b", held[1].etag)], [])
    proxy.arm("timeout_after_apply", method="PUT", path="bucket-02")

    sweeps = [Sweep(held[1], T0, 0.0, 0), Sweep(held[2], T0, 1.5, 4)]
    assert await through.checkpoint(sweeps, "sup-a") == 1, "bucket 2 written, bucket 1 not"

    assert proxy.faults == {"timeout_after_apply": 1}
    roster = await supervision_table.read()
    two = roster.buckets[2]
    assert (two.holder, two.swept_at, two.swept_by, two.due_found) == ("sup-a", T0, "sup-a", 4)
    assert roster.buckets[1].holder == "sup-b"


async def test_a_claim_applied_then_reset_before_its_answer_is_read_back(
    supervision_table: SupervisionTable, faulty: Any
):
    proxy, through = faulty
    proxy.arm("reset_after_apply", method="POST", path="$batch")
    etags = await through.claim(member(), [lease(b) for b in (3, 4)], [])
    assert proxy.faults == {"reset_after_apply": 1}
    roster = await supervision_table.read()
    assert etags == {b: roster.buckets[b].etag for b in (3, 4)}
    assert roster.buckets[3].held_by("sup-a", T0) and members(roster) == {"sup-a": T0 + LEASE}


async def test_a_claim_whose_answer_was_lost_before_it_landed_conflicts(
    supervision_table: SupervisionTable, faulty: Any
):
    proxy, through = faulty
    proxy.arm("reset_before_forward", method="POST", path="$batch")
    with pytest.raises(ConcurrencyConflict, match="the claim's answer was lost"):
        await through.claim(member(), [lease(3)], [])
    assert (await supervision_table.read()).members == (), "nothing landed: plan again"


async def test_a_checkpoint_applied_then_reset_before_its_answer_is_read_back(
    supervision_table: SupervisionTable, faulty: Any
):
    proxy, through = faulty
    held = await claim_all(supervision_table)
    proxy.arm("reset_after_apply", method="POST", path="$batch")
    sweeps = [Sweep(held[b], T0, 0.25, 1) for b in (5, 6)]
    assert await through.checkpoint(sweeps, "sup-a") == 2
    assert proxy.faults == {"reset_after_apply": 1}
    roster = await supervision_table.read()
    assert [roster.buckets[b].swept_by for b in (5, 6)] == ["sup-a", "sup-a"]
