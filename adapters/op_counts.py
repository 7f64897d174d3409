"""Exact counts of the storage requests and Service Bus operations this process makes.

Storage requests are counted per HTTP attempt, retries included: Table requests by the Table
client's request hook (adapters.tables), blob requests by the SDK pipeline's
`raw_request_hook`. (aiohttp itself sends an idempotent request once more, unseen by either,
when the connection it went out on closes before the answer.) Service Bus has no HTTP
pipeline; its operations are counted where the app calls the SDK: each send here, each receive
and settlement in the hosts that drive triggers. Benchmarks and the demo divide these by the
orders processed.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any


class OperationCounts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self._counts[kind] += n

    def request_hook(self, service: str) -> Callable[[Any], None]:
        """A hook counting `<service>.<method>` per HTTP request: given adapters.tables'
        ``Sent``, or azure-core's pipeline request (its ``raw_request_hook``)."""

        def hook(request: Any) -> None:
            sent = getattr(request, "http_request", request)
            self.add(f"{service}.{sent.method.lower()}")

        return hook

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(sorted(self._counts.items()))

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


COUNTS = OperationCounts()
"""The process-wide counter every client built by adapters.clients reports to."""
