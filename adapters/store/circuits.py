"""The agents' circuit breakers as each process writes them: one row per agent and instance.

A breaker lives in one process (:mod:`service.circuit`); on each transition that process writes
its breaker's state here, best effort, so the dashboard can show every instance's breakers
(:mod:`adapters.store.circuit_overview` reads them). The rows live in the ``circuits``
partition of the supervision table (SUPERVISION_TABLE): the Supervisor reads and writes only its
own ``supervisor`` partition (one query by PartitionKey, writes by key:
:mod:`adapters.store.supervision`), so the two never meet in a query or a batch, and a partition
of its own keeps the breakers' writes out of the roster's throughput.

Row: PartitionKey ``circuits``, RowKey ``<agent>:<instance>``; ``Agent``, ``Instance``,
``State`` (closed, open, half_open), ``Since`` (when it entered that state),
``ConsecutiveFailures``, ``RetryAt`` (open only: when it admits a trial call) and
``UpdatedAt``.
"""

from __future__ import annotations

import enum
import os
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from azure.data.tables import UpdateMode

from adapters.store.rows import utc
from adapters.tables import Table
from domain import ids

PARTITION: Final = "circuits"


class CircuitState(enum.StrEnum):
    """A breaker's state (:class:`service.circuit.CircuitBreaker` is in one of these)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class CircuitRow:
    agent: str
    instance: str
    state: CircuitState
    since: datetime
    consecutive_failures: int
    retry_at: datetime | None
    updated_at: datetime
    etag: str | None = None

    def __post_init__(self) -> None:
        ids.validate_name(self.agent, "agent")
        ids.validate_instance_id(self.instance)
        if self.consecutive_failures < 0:
            raise ValueError(
                f"consecutive_failures must be 0 or more, got {self.consecutive_failures}"
            )

    @property
    def row_key(self) -> str:
        return row_key(self.agent, self.instance)


def row_key(agent: str, instance: str) -> str:
    """``<agent>:<instance>``: both validated (an agent name has no ``:``, so it splits back)."""
    return f"{ids.validate_name(agent, 'agent')}:{ids.validate_instance_id(instance)}"


def instance_id(environ: dict[str, str] | None = None) -> str:
    """Which instance of the app this process is: ``WEBSITE_INSTANCE_ID`` in Azure (one per
    worker VM, stable while it runs), else host name and process id."""
    env = os.environ if environ is None else environ
    given = "".join(c for c in env.get("WEBSITE_INSTANCE_ID", "") if c.isalnum())[:128]
    if given:
        return given
    host = "".join(c for c in socket.gethostname() if c.isalnum() or c in "-.")[:100]
    return ids.validate_instance_id(f"{host.strip('-.') or 'host'}.{os.getpid()}")


# ------------------------------------------------------------------------------- codec


def to_entity(row: CircuitRow) -> dict[str, Any]:
    entity: dict[str, Any] = {
        "PartitionKey": PARTITION,
        "RowKey": row.row_key,
        "Agent": row.agent,
        "Instance": row.instance,
        "State": row.state.value,
        "Since": utc(row.since),
        "ConsecutiveFailures": int(row.consecutive_failures),
        "UpdatedAt": utc(row.updated_at),
    }
    if row.retry_at is not None:
        entity["RetryAt"] = utc(row.retry_at)
    return entity


# ------------------------------------------------------------------------------- store


class CircuitTable:
    """The circuits partition of the supervision table, as a breaker's process writes it."""

    def __init__(self, table: Table) -> None:
        self.table = table

    async def record(self, row: CircuitRow) -> None:
        """Write ``row`` over whatever this agent and instance wrote before."""
        await self.table.upsert_entity(to_entity(row), mode=UpdateMode.REPLACE)
