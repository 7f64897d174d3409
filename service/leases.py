"""Which buckets this Supervisor instance sweeps this tick: a pure function of the roster.

Rules (:mod:`adapters.store.supervision` holds the rows):

- The instances alive are those whose member row has not expired, plus this one. The buckets
  are divided as evenly as they go, by rank of instance id.
- An instance keeps and sweeps what it holds; what it holds beyond its share it gives up when
  the tick ends (swept, so a newcomer that takes it next tick leaves no gap). It takes free
  buckets (never leased, or lease expired: a holder that died releases its buckets by expiry)
  until it has its share, starting at a place in the list that depends on its rank (instances
  reading one roster at once do not all race for the same rows), and any free bucket nobody
  swept for a lease (an orphan), so a bucket is never left unswept because an instance counted
  in the shares died.
- It sweeps what it holds oldest checkpoint first, so a bucket a tick did not finish (its
  checkpoint stays old) is first next tick, whoever holds it then.
- Member rows long expired (instances that died) are deleted by whoever holds bucket 0, a few
  per tick.

Leases: a tick claims its buckets for ``claim`` (the tick's budget plus half the slack to the
next tick, under one period) and, when it ends, extends them to ``lease`` (one and a half
periods) from the claim. A holder killed mid-tick therefore frees its buckets before the next
tick, and one killed between ticks by the tick after that: either way one period late.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta

from adapters.store.supervision import BucketLease, Member, Roster

REAP_AFTER_LEASES = 10
"""A member row expired this many leases ago belongs to an instance that is gone."""
REAP_PER_TICK = 20
_NEVER = datetime.min.replace(tzinfo=None)


@dataclass(frozen=True, slots=True)
class Plan:
    member: Member
    hold: tuple[BucketLease, ...]
    """What this instance claims and sweeps this tick, oldest checkpoint first."""
    release: tuple[BucketLease, ...]
    """Held beyond its share: swept this tick, given up when the tick ends."""
    reap: tuple[Member, ...]


def plan(
    roster: Roster, me: str, now: datetime, claim: timedelta, lease: timedelta, *, take: bool = True
) -> Plan:
    """``claim``: how long the lease is claimed for at the start of a tick (less than a period:
    a tick that dies mid-way frees its buckets for the next tick); ``lease``: how long a tick
    that ends extends it for (:func:`service.sweep.run_tick`). ``take=False`` only renews
    what this instance holds (after lost races: a renewal cannot collide)."""
    mine = sorted((b for b in roster.buckets if b.held_by(me, now)), key=_oldest_first)
    # Buckets divided as evenly as they go: the first ``buckets % alive`` instances (by id)
    # take one more.
    alive = sorted({m.instance for m in roster.members if m.until > now} | {me})
    rank = alive.index(me)
    base, extra = divmod(len(roster.buckets), len(alive))
    share = base + (1 if rank < extra else 0)
    taken: list[BucketLease] = []
    orphans: list[BucketLease] = []
    if take:
        free = sorted((b for b in roster.buckets if b.free(now)), key=_oldest_first)
        room = max(0, share - len(mine))
        # Instances reading one roster at the same moment start at different places in it:
        # each after the shares of the instances ranked before it.
        offset = (rank * base + min(rank, extra)) % len(free) if free else 0
        rotated = free[offset:] + free[:offset]
        taken = rotated[:room]
        # Beyond its share, an instance also takes a free bucket nobody has swept for a lease:
        # an orphan the others did not take (one counted in the shares may have died). It gives
        # the surplus up when the tick ends.
        orphans = [b for b in rotated[room:] if b.swept_at is None or now - b.swept_at > lease]
    surplus = {b.bucket for b in [*mine[share:], *orphans]}
    hold = sorted(
        (dataclasses.replace(b, holder=me, until=now + claim) for b in [*mine, *taken, *orphans]),
        key=_oldest_first,
    )
    reap: tuple[Member, ...] = ()
    if any(b.bucket == 0 for b in hold):
        cutoff = now - lease * REAP_AFTER_LEASES
        reap = tuple(m for m in roster.members if m.until < cutoff and m.instance != me)
        reap = reap[:REAP_PER_TICK]
    etag = next((m.etag for m in roster.members if m.instance == me), None)
    return Plan(
        member=Member(instance=me, until=now + lease, etag=etag),
        hold=tuple(hold),
        release=tuple(b for b in hold if b.bucket in surplus),
        reap=reap if take else (),
    )


def _oldest_first(lease: BucketLease) -> tuple[bool, datetime, int]:
    swept = lease.swept_at
    return (swept is not None, swept.replace(tzinfo=None) if swept else _NEVER, lease.bucket)
