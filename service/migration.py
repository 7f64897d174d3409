"""Moving the orders in flight on one workflow version to another (docs/versioning.md).

An order moves only if the new version keeps the old one's steps, up to and including the step
the order has reached, exactly (same agent, operation and undo): then nothing it did, and
nothing in flight, changes meaning, and the rest of its way follows the new version
(:meth:`domain.workflows.Workflow.migration_problem`, decided per order by the operator action
``Migrate`` (:mod:`domain.operator_actions`), one ETag-conditional write, recorded in its
timeline). Others are refused
with the reason, and stay on their version. A dry run (the default) writes nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from adapters.store.rows import ActiveRow
from domain.events import Context, Decision
from domain.operator_actions import Migrate, Refused, act
from domain.order import Order
from domain.workflows import UnknownWorkflow
from service import apply
from service.runtime import Runtime
from service.versions import canonical


@dataclass
class MigrationReport:
    from_ref: str
    to_ref: str
    dry_run: bool
    examined: int = 0
    migrated: int = 0
    """Orders moved (in a dry run: that would move)."""
    refused: Counter[str] = field(default_factory=Counter)
    """Orders left on their version, by reason."""


async def migrate(
    rt: Runtime, from_ref: str, to_ref: str, *, actor: str, reason: str, dry_run: bool = True
) -> MigrationReport:
    """Walk the active-order index (one request per 1,000 rows) and move each order of
    ``from_ref`` that may move (one point read each, and one write each unless ``dry_run``)."""
    try:
        source, target = rt.workflow(from_ref), rt.workflow(to_ref)
    except UnknownWorkflow as missing:
        raise ValueError(str(missing)) from None
    report = MigrationReport(source.ref, target.ref, dry_run)
    event = Migrate(target, actor, reason)
    async for row in rt.store.all_active():
        if canonical(row.workflow) == source.ref:
            await _one(rt, row, event, report)
    return report


async def _one(rt: Runtime, row: ActiveRow, event: Migrate, report: MigrationReport) -> None:
    order = await rt.store.find(row.order_id)
    if order is None or order.generation != row.generation:
        return
    if canonical(order.workflow) != report.from_ref:
        return
    report.examined += 1

    async def deciding(loaded: Order, ctx: Context) -> Decision:
        return act(loaded, event, ctx)

    try:
        if report.dry_run:
            act(order, event, apply.context(rt, order.workflow, event.actor))
        else:
            span = "operator_migrate"
            await apply.handle_with(rt, row.order_id, deciding, actor=event.actor, span=span)
    except Refused as refused:
        report.refused[refused.message.split(": ", 1)[-1]] += 1
    except (apply.Busy, apply.Parked) as busy:
        report.refused[str(busy)] += 1
    else:
        report.migrated += 1
