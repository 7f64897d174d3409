"""The agents' circuit breakers as the operators see them (the dashboard): every instance's rows
(:mod:`adapters.store.circuits`), read back, and what they say per agent.

What a row says now (:func:`effective_state`): a breaker turns half-open lazily, on the first
call after ``RetryAt``, and writes only then. So an open row past ``RetryAt`` means "the next
call is a trial" (half-open, as the breaker itself would report), and a row still open or
half-open ``STALE_GRACE`` after that says nothing current: no call came (that instance has no
traffic for that service) or the instance is gone. Such a row is shown as stale and does not
count towards the agent's state. A closed row stays true until the next transition however old
it is; rows not written for ``DROP_AFTER`` (an instance long gone, mostly) are left out and
deleted by the reader, a few per read.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from adapters.store.active_index import delete_unchanged
from adapters.store.circuits import PARTITION, CircuitRow, CircuitState, CircuitTable
from adapters.store.rows import utc

STALE_GRACE: Final = timedelta(minutes=5)
"""How long past its ``RetryAt`` (open) or its last write (half-open) a row is believed: longer
than a step's run budget, so a trial call in flight is not taken for silence."""
DROP_AFTER: Final = timedelta(hours=24)
REAP_PER_READ: Final = 20
READ_PAGE: Final = 1000
MAX_READ_PAGES: Final = 5


class Shown(enum.StrEnum):
    """What the overview shows for a row or an agent."""

    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"
    STALE = "stale"


_SEVERITY: Final = {Shown.CLOSED: 0, Shown.HALF_OPEN: 1, Shown.OPEN: 2}


_SEVERITY: Final = {Shown.CLOSED: 0, Shown.HALF_OPEN: 1, Shown.OPEN: 2}


class BadCircuitRow(ValueError):
    """A row of the circuits partition that this code cannot read; the message says which."""


def from_entity(entity: dict[str, Any], etag: str | None = None) -> CircuitRow:
    key = str(entity.get("RowKey", ""))
    try:
        retry_at = entity.get("RetryAt")
        return CircuitRow(
            agent=str(entity["Agent"]),
            instance=str(entity["Instance"]),
            state=CircuitState(str(entity["State"])),
            since=utc(entity["Since"]),
            consecutive_failures=int(entity.get("ConsecutiveFailures") or 0),
            retry_at=utc(retry_at) if isinstance(retry_at, datetime) else None,
            updated_at=utc(entity["UpdatedAt"]),
            etag=etag,
        )
    except (KeyError, ValueError, TypeError, AttributeError) as error:
        raise BadCircuitRow(f"circuit row {key!r} is unreadable: {error}") from error


@dataclass(frozen=True, slots=True)
class CircuitRead:
    rows: tuple[CircuitRow, ...]
    unreadable: int
    """Rows skipped because they could not be decoded (logged by the caller)."""
    partial: bool
    """More rows than ``MAX_READ_PAGES`` pages: the rest were not read."""
    requests: int


class CircuitRows(CircuitTable):
    """The circuits partition, read back (the dashboard)."""

    async def read(self) -> CircuitRead:
        pages = self.table.query_entities(
            "PartitionKey eq @pk", parameters={"pk": PARTITION}, results_per_page=READ_PAGE
        ).by_page()
        rows: list[CircuitRow] = []
        unreadable = requests = 0
        async for page in pages:
            requests += 1
            for entity in page:
                try:
                    rows.append(from_entity(entity, entity.metadata.get("etag")))
                except BadCircuitRow:
                    unreadable += 1
            if requests >= MAX_READ_PAGES:
                break
        partial = pages.continuation_token is not None
        return CircuitRead(tuple(rows), unreadable, partial, requests)

    async def reap(self, rows: Iterable[CircuitRow]) -> int:
        """Delete ``rows`` unless rewritten since they were read (ETag); how many went."""
        deleted = 0
        for row in rows:  # one rewritten since it was read is current again
            if row.etag is not None:
                deleted += await delete_unchanged(self.table, PARTITION, row.row_key, row.etag)
        return deleted


# ------------------------------------------------------------------------ the overview


def effective_state(row: CircuitRow, now: datetime) -> Shown:
    """What ``row`` says at ``now`` (see the module docstring)."""
    if row.state is CircuitState.CLOSED:
        return Shown.CLOSED
    if row.state is CircuitState.OPEN:
        retry_at = row.retry_at or row.since
        if now < retry_at:
            return Shown.OPEN
        return Shown.HALF_OPEN if now < retry_at + STALE_GRACE else Shown.STALE
    return Shown.HALF_OPEN if now < row.updated_at + STALE_GRACE else Shown.STALE


def expired(row: CircuitRow, now: datetime) -> bool:
    """Not written for ``DROP_AFTER``: left out of the overview and deleted."""
    return now - row.updated_at > DROP_AFTER


@dataclass(frozen=True, slots=True)
class AgentCircuit:
    agent: str
    state: Shown | None
    """The worst state of the instances that report a current one; None: no instance has
    reported a transition (breakers start closed and write only when they change)."""
    since: datetime | None
    """When the first instance now in that state entered it."""
    instances: int
    """Instances reporting a current state."""
    by_state: dict[str, int]
    stale: int
    retry_at: datetime | None
    """Open: when the first of the open instances admits a trial call."""
    consecutive_failures: int
    """The most among the instances in the worst state."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "state": None if self.state is None else self.state.value,
            "since": _iso(self.since),
            "instances": self.instances,
            "by_state": dict(self.by_state),
            "stale": self.stale,
            "retry_at": _iso(self.retry_at),
            "consecutive_failures": self.consecutive_failures,
        }


def overview(
    rows: Sequence[CircuitRow], now: datetime, agents: Sequence[str]
) -> list[AgentCircuit]:
    """One entry per agent of ``agents`` (then any other agent a row names), worst state first
    among the instances whose rows are current; expired rows are left out."""
    names = list(agents) + sorted({r.agent for r in rows} - set(agents))
    result = []
    for agent in names:
        mine = [r for r in rows if r.agent == agent and not expired(r, now)]
        shown = [(r, effective_state(r, now)) for r in mine]
        current = [(r, s) for r, s in shown if s is not Shown.STALE]
        by_state = dict(Counter(state.value for _, state in current))
        worst = max((s for _, s in current), key=_SEVERITY.__getitem__, default=None)
        in_worst = [r for r, s in current if s is worst]
        since = min((r.since for r in in_worst), default=None)
        retry_at = (
            min((r.retry_at for r in in_worst if r.retry_at is not None), default=None)
            if worst is Shown.OPEN
            else None
        )
        result.append(
            AgentCircuit(
                agent=agent,
                state=worst,
                since=since,
                instances=len(current),
                by_state=by_state,
                stale=len(shown) - len(current),
                retry_at=retry_at,
                consecutive_failures=max((r.consecutive_failures for r in in_worst), default=0),
            )
        )
    return result


def _iso(value: datetime | None) -> str | None:
    return None if value is None else utc(value).isoformat().replace("+00:00", "Z")
