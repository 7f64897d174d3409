"""Which workflow versions the stored orders still need, and whether a package may drop one.

An order runs the workflow version it started on until it ends (:mod:`domain.workflows`): orders
in flight need their version to take every next step, and orders in Error need it so that an
operator can resubmit or cancel them. A deployment that stops carrying such a version parks
those orders (:func:`service.apply.park`); :func:`check` finds that out before the deploy.

Reading the versions in use costs one request per 1,000 rows of the active-order index, and
the Error listing of :mod:`service.listing` (one point read per order in Error: the Error
index does not record the version): a deploy-time cost that follows the orders in flight and
in Error, never history.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from domain.states import ProcessState
from domain.workflows import Workflow, parse_ref, workflow_ref
from service.listing import MAX_LIMIT, list_orders

if TYPE_CHECKING:
    from adapters.store.records import OrderRecords


@dataclass(frozen=True, slots=True)
class VersionUse:
    """How many orders need one workflow version (``order@1``)."""

    ref: str
    in_flight: int = 0
    in_error: int = 0

    @property
    def orders(self) -> int:
        return self.in_flight + self.in_error


def canonical(ref: str) -> str:
    """``order`` (stored before versions) -> ``order@1``; ``order@2`` stays."""
    return workflow_ref(*parse_ref(ref))


def tally(in_flight: Iterable[str], in_error: Iterable[str]) -> dict[str, VersionUse]:
    """Count the workflow references of the orders in flight and of the orders in Error."""
    counts: dict[str, list[int]] = {}
    for ref in in_flight:
        counts.setdefault(canonical(ref), [0, 0])[0] += 1
    for ref in in_error:
        counts.setdefault(canonical(ref), [0, 0])[1] += 1
    return {ref: VersionUse(ref, *pair) for ref, pair in sorted(counts.items())}


def missing(in_use: Mapping[str, VersionUse], carried: Iterable[str]) -> list[VersionUse]:
    """The versions orders still need that a package carrying ``carried`` lacks."""
    have = {canonical(ref) for ref in carried}
    return [use for ref, use in in_use.items() if ref not in have and use.orders]


def check(in_use: Mapping[str, VersionUse], carried: Iterable[str]) -> tuple[bool, str]:
    """Whether a package carrying ``carried`` may be deployed over these orders, and why."""
    carried = sorted(carried)
    lacking = missing(in_use, carried)
    if not lacking:
        needed = ", ".join(f"{u.ref} ({u.orders})" for u in in_use.values()) or "none"
        return True, f"ok: the package carries every version orders need ({needed})"
    named = "; ".join(f"{u.ref}: {u.in_flight} in flight, {u.in_error} in Error" for u in lacking)
    return False, (
        f"refused: the package drops workflow versions that orders still need ({named}). "
        f"It carries {', '.join(carried)}. Keep those versions in domain/workflows.py until "
        "their orders have finished (and Error orders are resolved), or migrate the orders "
        "in flight (docs/versioning.md)."
    )


async def versions_in_use(store: OrderRecords) -> dict[str, VersionUse]:
    """Read the active-order index and the Error index (see the module docstring for cost)."""
    flight = [row.workflow async for row in store.all_active()]
    errors: list[str] = []
    cursor: str | None = None
    while True:
        page = await list_orders(store, ProcessState.ERROR, limit=MAX_LIMIT, cursor=cursor)
        errors += [order.workflow for order in page.orders]
        cursor = page.cursor
        if cursor is None:
            return tally(flight, errors)


def diff(old: Workflow, new: Workflow) -> list[str]:
    """What changed from ``old`` to ``new``, one line per change, in step order."""
    changes: list[str] = []
    before = {s.name: s for s in old.steps}
    after = {s.name: s for s in new.steps}
    for step in new.steps:
        if step.name not in before:
            position = new.index_of(step.name)
            where = f"after {new.steps[position - 1].name}" if position else "first"
            changes.append(f"+ {step.name} ({step.agent}.{step.operation}), {where}")
    for step in old.steps:
        if step.name not in after:
            changes.append(f"- {step.name} ({step.agent}.{step.operation})")
            continue
        other = after[step.name]
        for field in ("agent", "operation", "undo_operation", "complete_by_budget"):
            was, now = getattr(step, field), getattr(other, field)
            if was != now:
                changes.append(f"~ {step.name}: {field} {was} -> {now}")
    kept = [s for s in old.step_names if s in after]
    if kept != [s for s in new.step_names if s in before]:
        changes.append("~ the steps both versions have are in another order")
    if (old.retry, old.failure_threshold) != (new.retry, new.failure_threshold):
        changes.append("~ retry policy or failure threshold")
    return changes
