"""Reply queues that refused a status update recently, and why: one set per process, held by
its Runtime (:mod:`service.runtime`), consulted by :mod:`service.apply` before it sends."""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import datetime
from typing import Final

from domain.lifecycle import REPLY_RETRY_FIRST

FAILURE_MEMORY: Final = REPLY_RETRY_FIRST
"""How long a process does not try a reply queue that refused: no longer than an order holds
the updates it refused, so their retry finds the queue tried afresh."""
_MAX_REMEMBERED: Final = 1024


class RefusingQueues:
    """Reply queues that refused a status update recently, and why: one process's (its
    Runtime's), bounded; an entry is forgotten :data:`FAILURE_MEMORY` after it was made."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[datetime, str]] = OrderedDict()

    def get(self, queue: str, now: datetime) -> str | None:
        key = queue.casefold()
        with self._lock:
            at, failure = self._entries.get(key, (now, None))
            if now - at > FAILURE_MEMORY:
                del self._entries[key]
                return None
            return failure

    def put(self, queue: str, failure: str, now: datetime) -> None:
        key = queue.casefold()
        with self._lock:
            self._entries[key] = (now, failure)
            self._entries.move_to_end(key)
            while len(self._entries) > _MAX_REMEMBERED:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget them all (an operator after fixing a queue)."""
        with self._lock:
            self._entries.clear()
