"""The dead-letter log: every replay and purge an operator ran, who ran it, why, and what became
of each message, including messages that name no order (or none that can be trusted), whose
action no order timeline can hold.

One row per action that was not a dry run, in a partition of the orders table (no extra table
to deploy, like the purge log, :mod:`adapters.store.purge_log`): PartitionKey ``~deadletters``
(no order id starts with ``~``, see :mod:`domain.ids`), RowKey ``<inverted milliseconds>.<action
id>`` so a query of the partition lists the newest first, with ``At``, ``Actor``, ``Action``,
``Queue``, ``Reason`` and ``Outcomes`` (JSON: sequence number, message id, order id, outcome). A
few rows a day at most: operators act by hand.

The operator use cases write and read it (:mod:`service.operations.dead_letter_log`), through the
app's Table client like every other row store.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Protocol

from azure.data.tables import UpdateMode

from adapters.store.rows import newest_first_key, utc
from adapters.tables import Table

log = logging.getLogger("adapters.store.dead_letter_log")

PARTITION: Final = "~deadletters"
MAX_RECENT: Final = 100
MAX_OUTCOMES_CHARS: Final = 30_000
"""Table Storage holds 32 K characters in a string property: a longer list is cut, and says so."""


class Outcome(Protocol):
    """What the log keeps of each message an action settled (or refused)."""

    @property
    def sequence_number(self) -> int: ...
    @property
    def message_id(self) -> str | None: ...
    @property
    def order_id(self) -> str | None: ...
    @property
    def outcome(self) -> str: ...


_OUTCOME_FIELDS: Final = ("sequence_number", "message_id", "order_id", "outcome")


@dataclass(frozen=True, slots=True)
class LoggedAction:
    at: datetime
    actor: str
    action: str
    queue: str
    reason: str
    outcomes: list[dict[str, Any]]
    truncated: bool


def to_entity(
    at: datetime,
    actor: str,
    action: str,
    queue: str,
    reason: str,
    outcomes: Sequence[Outcome],
) -> dict[str, Any]:
    listed = [{name: getattr(o, name) for name in _OUTCOME_FIELDS} for o in outcomes]
    text = json.dumps(listed, separators=(",", ":"))
    truncated = False
    while len(text) > MAX_OUTCOMES_CHARS and listed:
        listed = listed[: len(listed) // 2]
        text = json.dumps(listed, separators=(",", ":"))
        truncated = True
    return {
        "PartitionKey": PARTITION,
        "RowKey": newest_first_key(at, uuid.uuid4().hex[:12]),
        "At": utc(at),
        "Actor": actor,
        "Action": action,
        "Queue": queue,
        "Reason": reason,
        "Outcomes": text,
        "Truncated": truncated,
    }


def from_entity(entity: dict[str, Any]) -> LoggedAction:
    """A stored row; raises KeyError, TypeError or ValueError when its columns are not there.
    A list of outcomes that does not read is left out and the action says ``truncated``."""
    try:
        outcomes = json.loads(str(entity.get("Outcomes") or "[]"))
    except ValueError:
        outcomes = None
    readable = isinstance(outcomes, list)
    return LoggedAction(
        at=utc(entity["At"]),
        actor=str(entity["Actor"]),
        action=str(entity["Action"]),
        queue=str(entity["Queue"]),
        reason=str(entity.get("Reason") or ""),
        outcomes=outcomes if readable else [],
        truncated=bool(entity.get("Truncated")) or not readable,
    )


class DeadLetterLog:
    """The ``~deadletters`` partition of the orders table."""

    def __init__(self, table: Table) -> None:
        self._table = table

    async def record(self, entity: dict[str, Any]) -> None:
        await self._table.upsert_entity(entity, mode=UpdateMode.REPLACE)

    async def recent(self, limit: int = 20) -> list[LoggedAction]:
        """The newest ``limit`` actions first (at most ``MAX_RECENT``)."""
        limit = max(1, min(limit, MAX_RECENT))
        pages = self._table.query_entities(
            "PartitionKey eq @pk", parameters={"pk": PARTITION}, results_per_page=limit
        ).by_page()
        found: list[LoggedAction] = []
        async for page in pages:
            for entity in page:
                try:
                    found.append(from_entity(entity))
                except (KeyError, TypeError, ValueError):  # one damaged row hides no other
                    log.warning("dead-letter log row %r is damaged; left out", entity.get("RowKey"))
            break
        return found[:limit]
