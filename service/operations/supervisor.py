"""The Supervisor's progress, from its roster (:mod:`adapters.store.supervision`): how far behind
its sweeps are, who holds each bucket's lease, the backlog of orders due and how fast the app's
instances drain it, and the recovery bound it keeps."""

from __future__ import annotations

from adapters.store import supervision
from service.operations.context import OperatorContext
from service.operations.models import BucketView, SupervisorView


async def supervisor(ctx: OperatorContext) -> SupervisorView:
    """The Supervisor's progress from its roster: lag, sweeps, leases, backlog and the bound."""
    now = ctx.rt.clock()
    roster = await ctx.rt.store.supervision.read()
    bound = supervision.recovery_bound(ctx.rt.settings)
    return SupervisorView(
        **supervision.lag(roster, now, bound).as_dict(),
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
