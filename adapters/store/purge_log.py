"""The record of purge runs, so that operators can find later what was purged, when and by whom.

One row per run that changed something or was asked for by an operator (dry runs included), in
one partition of the orders table (no extra table to deploy): PartitionKey ``~purge`` (no order
id starts with ``~``, see :mod:`domain.ids`), RowKey ``<inverted milliseconds>.<run id>`` so a
query of the partition lists the newest first, with ``At`` and ``Report`` (the run's counts as
JSON). One row a day for the timer: the partition grows by a few hundred rows a year.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from azure.data.tables import UpdateMode

from adapters.store.rows import CorruptOrderState, newest_first_key, utc
from adapters.tables import Table


class PurgeLog:
    """Rows of the ``~purge`` partition (Table store)."""

    def __init__(self, table: Table) -> None:
        self._table = table

    async def record(self, run_id: str, at: datetime, report: Mapping[str, Any]) -> None:
        await self._table.upsert_entity(
            {
                "PartitionKey": PURGE_PARTITION,
                "RowKey": newest_first_key(at, run_id),
                "At": utc(at),
                "Report": json.dumps(report, separators=(",", ":"), default=str),
            },
            mode=UpdateMode.REPLACE,
        )

    async def recent(self, limit: int = 20) -> list[dict[str, Any]]:
        """The reports of the latest ``limit`` runs, newest first (one request)."""
        if not 1 <= limit <= MAX_RECENT:
            raise ValueError(f"limit must be from 1 to {MAX_RECENT}")
        query = self._table.query_entities(
            "PartitionKey eq @pk", parameters={"pk": PURGE_PARTITION}, results_per_page=limit
        )
        reports = []
        async for entity in query:
            try:
                reports.append(json.loads(entity["Report"]))
            except (KeyError, ValueError) as exc:
                raise CorruptOrderState(
                    f"purge record {entity.get('RowKey')} is unreadable: {exc!r}"
                ) from None
            if len(reports) >= limit:
                break
        return reports


PURGE_PARTITION: Final = "~purge"
MAX_RECENT: Final = 100
