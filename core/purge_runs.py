"""Keys of the record of purge runs (:mod:`core.purge_log`), and that record in memory.

Pure, and imported by both the async :mod:`core.purge_log` and its generated sync twin, so
each name here has one identity; :mod:`core.purge_log` imports them back
(``core.purge_log.MemoryPurgeLog`` keeps working).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from core.state_models import utc

PURGE_PARTITION: Final = "~purge"
MAX_RECENT: Final = 100
_INVERT_MS: Final = 10**13  # past the year 2286 in milliseconds since the epoch


def run_row_key(at: datetime, run_id: str) -> str:
    millis = int(utc(at).timestamp() * 1000)
    return f"{_INVERT_MS - millis:013d}.{run_id}"


class MemoryPurgeLog:
    """:class:`core.purge_log.PurgeLog` in memory (core.memory's store uses it)."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[str, Any]] = {}

    def record(self, run_id: str, at: datetime, report: Mapping[str, Any]) -> None:
        self._rows[run_row_key(at, run_id)] = json.loads(json.dumps(report, default=str))

    def recent(self, limit: int = 20) -> list[dict[str, Any]]:
        if not 1 <= limit <= MAX_RECENT:
            raise ValueError(f"limit must be from 1 to {MAX_RECENT}")
        return [self._rows[key] for key in sorted(self._rows)[:limit]]
