"""Which buckets this Supervisor instance sweeps this tick: a pure function of the roster.

Rules (:mod:`core.supervision` holds the rows):

- The instances alive are those whose member row has not expired, plus this one. Each takes a
  fair share, ``ceil(buckets / alive)``.
- An instance keeps the buckets it holds, up to its share, and gives up the rest (a newcomer
  then takes them at its next tick). It takes free buckets (never leased, or lease expired: a
  holder that died releases its buckets by expiry) until it has its share, those swept longest
  ago first.
- It sweeps what it holds oldest checkpoint first, so a bucket a tick did not finish (its
  checkpoint stays old) is first next tick, whoever holds it then.
- Member rows long expired (instances that died) are deleted by whoever holds bucket 0, a few
  per tick.

A lease lasts ``lease`` (one and a half Supervisor periods): the holder renews it every tick, so
with ticks on the same schedule an instance killed mid-tick delays its buckets by one period.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from core.supervision import BucketLease, Member, Roster

REAP_AFTER_LEASES = 10
"""A member row expired this many leases ago belongs to an instance that is gone."""
REAP_PER_TICK = 20
_NEVER = datetime.min.replace(tzinfo=None)


@dataclass(frozen=True, slots=True)
class Plan:
    member: Member
    hold: tuple[BucketLease, ...]
    """What this instance holds after the claim, in sweep order (oldest checkpoint first)."""
    release: tuple[BucketLease, ...]
    reap: tuple[Member, ...]

    @property
    def changes(self) -> bool:
        return bool(self.hold or self.release or self.reap)


def plan(roster: Roster, me: str, now: datetime, lease: timedelta) -> Plan:
    until = now + lease
    alive = {m.instance for m in roster.members if m.until > now} | {me}
    share = math.ceil(len(roster.buckets) / len(alive))
    mine = sorted((b for b in roster.buckets if b.held_by(me, now)), key=_oldest_first)
    keep, release = mine[:share], mine[share:]
    free = sorted((b for b in roster.buckets if b.free(now)), key=_oldest_first)
    take = free[: max(0, share - len(keep))]
    hold = sorted(
        (dataclasses.replace(b, holder=me, until=until) for b in [*keep, *take]),
        key=_oldest_first,
    )
    released = tuple(dataclasses.replace(b, holder="", until=now) for b in release)
    reap: tuple[Member, ...] = ()
    if any(b.bucket == 0 for b in hold):
        cutoff = now - lease * REAP_AFTER_LEASES
        reap = tuple(m for m in roster.members if m.until < cutoff and m.instance != me)[
            :REAP_PER_TICK
        ]
    return Plan(
        member=Member(instance=me, until=until, etag=_etag_of(roster, me)),
        hold=tuple(hold),
        release=released,
        reap=reap,
    )


def _oldest_first(lease: BucketLease) -> tuple[bool, datetime, int]:
    swept = lease.swept_at
    return (swept is not None, swept.replace(tzinfo=None) if swept else _NEVER, lease.bucket)


def _etag_of(roster: Roster, me: str) -> str | None:
    return next((m.etag for m in roster.members if m.instance == me), None)
