"""The Supervisor instances' roster: bucket leases, members, sweeps, and what they say.

The model of the ``supervision`` table's rows (:mod:`adapters.store.supervision` reads and writes
them,
and its module docstring describes them; :class:`devstack.memory.MemorySupervision` keeps them in
memory), the recovery bound and the Supervisor's lag. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from adapters.settings import Settings
from adapters.store.index_rows import INDEX_BUCKETS
from adapters.store.rows import etag_of, utc
from domain import ids

PARTITION: Final = "supervisor"
_BUCKET_PREFIX: Final = "bucket-"
_MEMBER_PREFIX: Final = "member-"


@dataclass(frozen=True, slots=True)
class BucketLease:
    bucket: int
    holder: str = ""
    until: datetime | None = None
    swept_at: datetime | None = None
    swept_by: str = ""
    lag_s: float = 0.0
    due_found: int = 0
    etag: str | None = None
    """None: the row does not exist yet (a claim creates it)."""

    def held_by(self, instance: str, now: datetime) -> bool:
        return self.holder == instance and self.until is not None and self.until > now

    def free(self, now: datetime) -> bool:
        return not self.holder or self.until is None or self.until <= now


@dataclass(frozen=True, slots=True)
class Member:
    instance: str
    until: datetime
    etag: str | None = None


@dataclass(frozen=True, slots=True)
class Roster:
    buckets: tuple[BucketLease, ...]
    """One per bucket, in bucket order; rows not written yet appear free with no ETag."""
    members: tuple[Member, ...]


@dataclass(frozen=True, slots=True)
class Sweep:
    """A bucket swept to the end: every row due at ``at`` was handled."""

    lease: BucketLease
    at: datetime
    lag_s: float
    due_found: int


def bucket_row_key(bucket: int) -> str:
    return f"{_BUCKET_PREFIX}{bucket:02d}"


def member_row_key(instance: str) -> str:
    return _MEMBER_PREFIX + ids.validate_instance_id(instance)


def roster_from_entities(entities: Sequence[dict[str, Any]]) -> Roster:
    buckets = {b: BucketLease(bucket=b) for b in range(INDEX_BUCKETS)}
    members = []
    for entity in entities:
        key = str(entity["RowKey"])
        if key.startswith(_BUCKET_PREFIX):
            bucket = int(key.removeprefix(_BUCKET_PREFIX))
            if bucket in buckets:
                buckets[bucket] = _lease_from_entity(bucket, entity)
        elif key.startswith(_MEMBER_PREFIX):
            members.append(
                Member(
                    instance=key.removeprefix(_MEMBER_PREFIX),
                    until=utc(entity["Until"]),
                    etag=etag_of(entity),
                )
            )
    return Roster(buckets=tuple(buckets.values()), members=tuple(members))


def _lease_from_entity(bucket: int, entity: dict[str, Any]) -> BucketLease:
    def when(name: str) -> datetime | None:
        value = entity.get(name)
        return utc(value) if isinstance(value, datetime) else None

    return BucketLease(
        bucket=bucket,
        holder=str(entity.get("Holder") or ""),
        until=when("LeasedUntil"),
        swept_at=when("SweptAt"),
        swept_by=str(entity.get("SweptBy") or ""),
        lag_s=float(entity.get("LagSeconds") or 0.0),
        due_found=int(entity.get("DueFound") or 0),
        etag=etag_of(entity),
    )


def swept_lease(sweep: Sweep, by: str) -> BucketLease:
    """``sweep``'s lease with its checkpoint: swept at ``sweep.at`` by ``by``."""
    return dataclasses.replace(
        sweep.lease,
        swept_at=sweep.at,
        swept_by=by,
        lag_s=round(sweep.lag_s, 3),
        due_found=sweep.due_found,
    )


@dataclass(frozen=True, slots=True)
class RecoveryBound:
    """The worst case, in seconds, from an order's due time to the Supervisor acting on it.

    - The index row is due no later than the order (:mod:`adapters.store.active_index`).
    - Its bucket's holder sweeps it at the next tick, at most one ``period`` later, and handles
      it within the tick's ``budget`` while the rows due per tick fit in the budget.
    - A holder that died leaves its leases to expire (``lease`` = 1.5 periods after its last
      renewal); with ticks on one schedule the next instance takes the bucket one period later
      than the holder would have swept it: one more ``period``.

    ``detection_s = period + budget + period + skew``: the Supervisor acts on a deadline
    another host's clock stamped only once its own clock is past it by the tolerated clock skew
    (``CLOCK_SKEW_TOLERANCE_SECONDS``). An order's longest wait between two timeline
    entries (``stall_s``) adds the longest it may wait on purpose before it is due: a step's
    CompleteBy budget (its queue budget plus its run budget), or a retry delay plus the stale
    time after which a released order with no progress is due. (A deferral waits for the
    service's ``retry_at`` by design; that wait comes on top, as the service asked.)
    """

    period_s: float
    budget_s: float
    lease_s: float
    skew_s: float
    detection_s: float
    step_budget_s: float
    retry_cap_s: float
    stale_s: float
    stall_s: float

    def as_dict(self) -> dict[str, float]:
        return {name: round(getattr(self, name), 3) for name in self.__slots__}


def recovery_bound(settings: Settings) -> RecoveryBound:
    period = settings.supervisor_period.total_seconds()
    budget = settings.supervisor_budget.total_seconds()
    skew = settings.clock_skew.total_seconds()
    detection = period + budget + period + skew
    flows = settings.workflows().values()
    step_budget = max(s.deadline_budget.total_seconds() for f in flows for s in f.steps)
    retry_cap = max(f.retry.cap.total_seconds() for f in flows)
    stale = settings.pending_stale_after.total_seconds()
    return RecoveryBound(
        period_s=period,
        budget_s=budget,
        lease_s=settings.supervisor_lease.total_seconds(),
        skew_s=skew,
        detection_s=detection,
        step_budget_s=step_budget,
        retry_cap_s=retry_cap,
        stale_s=stale,
        stall_s=max(step_budget, retry_cap + stale) + detection,
    )


@dataclass(frozen=True, slots=True)
class Lag:
    """What the roster says about the Supervisor's progress, for operators (API, orderctl)."""

    lag_s: float
    """The most overdue order the latest sweep of each bucket found, in seconds overdue."""
    oldest_sweep_s: float | None
    """Seconds since the least recently swept bucket was swept; None if one never was."""
    unswept: tuple[int, ...]
    """Buckets never swept, or not swept for longer than the detection bound."""
    holders: dict[str, int]
    """Instance → buckets it holds now."""

    def as_dict(self) -> dict[str, Any]:
        oldest = self.oldest_sweep_s
        return {
            "lag_s": round(self.lag_s, 3),
            "oldest_sweep_s": None if oldest is None else round(oldest, 3),
            "unswept_buckets": list(self.unswept),
            "holders": dict(self.holders),
        }


def lag(roster: Roster, now: datetime, bound: RecoveryBound) -> Lag:
    ages = [
        (now - b.swept_at).total_seconds() if b.swept_at is not None else None
        for b in roster.buckets
    ]
    holders: dict[str, int] = {}
    for b in roster.buckets:
        if not b.free(now):
            holders[b.holder] = holders.get(b.holder, 0) + 1
    return Lag(
        lag_s=max((b.lag_s for b in roster.buckets), default=0.0),
        oldest_sweep_s=None if None in ages else max(a for a in ages if a is not None),
        unswept=tuple(
            b.bucket
            for b, age in zip(roster.buckets, ages, strict=True)
            if age is None or age > bound.detection_s
        ),
        holders=holders,
    )
