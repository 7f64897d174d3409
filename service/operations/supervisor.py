"""The Supervisor's progress, from its roster (:mod:`adapters.store.supervision`): how far behind
its sweeps are, who holds each bucket's lease, the backlog of orders due and how fast the app's
instances drain it, and the recovery bound it keeps."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from adapters.settings import Settings
from adapters.store.supervision import Roster
from service.operations.context import OperatorContext
from service.operations.models import BucketView, SupervisorView


async def supervisor(ctx: OperatorContext) -> SupervisorView:
    """The Supervisor's progress from its roster: lag, sweeps, leases, backlog and the bound."""
    now = ctx.rt.clock()
    roster = await ctx.rt.store.supervision.read()
    bound = recovery_bound(ctx.rt.settings)
    return SupervisorView(
        **lag(roster, now, bound).as_dict(),
        bound=bound.as_dict(),
        buckets=[
            BucketView(
                bucket=b.bucket,
                holder=None if b.free(now) else b.holder,
                leased_until=b.until,
                swept_at=b.swept_at,
                swept_by=b.swept_by or None,
                lag_s=b.lag_s,
                due_found=b.due_found,
                dispatched=b.dispatched,
                returned=b.returned,
                drain_rate=b.drain_rate,
                left=b.left,
            )
            for b in roster.buckets
        ],
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
    backlog: int = 0
    """Rows due at the latest tick of each bucket (handled, handed out or left for later)."""
    left: int = 0
    """Of those, rows no tick handled or handed out: they wait for the next."""
    drain_rate: float = 0.0
    """Rows per second the fleet moved on, summed over the buckets' latest measurements."""
    time_to_drain_s: float | None = 0.0
    """``backlog`` at ``drain_rate``; None if rows are due and none was moved on lately."""
    drains_within_period: bool = True
    """Whether the backlog drains within a period at that rate, and no tick left rows for later:
    the recovery bound holds only while it does."""

    def as_dict(self) -> dict[str, Any]:
        oldest = self.oldest_sweep_s
        drain = self.time_to_drain_s
        return {
            "lag_s": round(self.lag_s, 3),
            "oldest_sweep_s": None if oldest is None else round(oldest, 3),
            "unswept_buckets": list(self.unswept),
            "holders": dict(self.holders),
            "backlog": self.backlog,
            "left": self.left,
            "drain_rate": round(self.drain_rate, 3),
            "time_to_drain_s": None if drain is None else round(drain, 3),
            "drains_within_period": self.drains_within_period,
        }


def lag(roster: Roster, now: datetime, bound: RecoveryBound) -> Lag:
    ages = [
        (now - b.swept_at).total_seconds() if b.swept_at is not None else None
        for b in roster.buckets
    ]
    holders = dict(Counter(b.holder for b in roster.buckets if not b.free(now)))
    backlog = drain([(b.due_found, b.left, b.drain_rate) for b in roster.buckets], bound.period_s)
    return Lag(
        lag_s=max((b.lag_s for b in roster.buckets), default=0.0),
        oldest_sweep_s=None if None in ages else max(a for a in ages if a is not None),
        unswept=tuple(
            b.bucket
            for b, age in zip(roster.buckets, ages, strict=True)
            if age is None or age > bound.detection_s
        ),
        holders=holders,
        backlog=backlog.backlog,
        left=backlog.left,
        drain_rate=backlog.rate,
        time_to_drain_s=backlog.time_s,
        drains_within_period=backlog.within_period,
    )


@dataclass(frozen=True, slots=True)
class Drain:
    """How long the Supervisor's backlog takes to drain at the pace the fleet moves rows on."""

    backlog: int
    left: int
    rate: float
    time_s: float | None
    """None: rows are due and none was moved on lately (the fleet's pace is not known)."""
    within_period: bool


def drain(buckets: Sequence[tuple[int, int, float]], period_s: float) -> Drain:
    """From each bucket's (rows due, rows left for later, rows moved on per second): the backlog
    drains within a period if no tick left rows for later and the rows due take at most a
    period at the rate the fleet moved them on."""
    backlog = sum(due for due, _, _ in buckets)
    left = sum(rows for _, rows, _ in buckets)
    rate = sum(r for _, _, r in buckets)
    time_s = 0.0 if backlog == 0 else (backlog / rate if rate > 0 else None)
    within = left == 0 and (time_s is None or time_s <= period_s)
    return Drain(backlog, left, rate, time_s, within)
