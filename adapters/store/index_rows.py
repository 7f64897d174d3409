"""Keys and row types of the order indexes: the active-order index
(:mod:`adapters.store.active_index`)
and the Error index (:mod:`adapters.store.error_index`). Pure: no I/O.

The index modules import them back, so ``adapters.store.active_index.index_partition`` and
``adapters.store.error_index.ErrorRow`` keep working.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

INDEX_BUCKETS: Final = 16
DEFAULT_GRACE: Final = timedelta(minutes=15)


def index_partition(order_id: str) -> str:
    return bucket_partition(zlib.crc32(order_id.encode("ascii")) % INDEX_BUCKETS)


def bucket_partition(bucket: int) -> str:
    return f"a{bucket:02d}"


def index_row_key(order_id: str, generation: int) -> str:
    return f"{order_id}.{generation}"


@dataclass(frozen=True, slots=True)
class ErrorRow:
    order_id: str
    generation: int
    written_at: datetime
    row_key: str
    etag: str


@dataclass(frozen=True, slots=True)
class ErrorRowPage:
    rows: tuple[ErrorRow, ...]
    last_key: str | None
    """RowKey to continue after (None: the index ended with this page)."""
