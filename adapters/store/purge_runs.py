"""Keys of the record of purge runs (:mod:`adapters.store.purge_log`; in memory,
:class:`devstack.memory.MemoryPurgeLog`). Pure: no I/O.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from adapters.store.rows import utc

PURGE_PARTITION: Final = "~purge"
MAX_RECENT: Final = 100
_INVERT_MS: Final = 10**13  # past the year 2286 in milliseconds since the epoch


def run_row_key(at: datetime, run_id: str) -> str:
    millis = int(utc(at).timestamp() * 1000)
    return f"{_INVERT_MS - millis:013d}.{run_id}"
