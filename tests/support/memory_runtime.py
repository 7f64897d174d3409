"""A Runtime on the in-memory store and bus of :mod:`devstack.memory`, for unit tests of the
service layer: every send, status replies included, goes to the one bus the test reads, and the
jitter is seeded."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime

from adapters.settings import Settings
from devstack.memory import MemoryBus
from service.runtime import Runtime


def memory_runtime(
    settings: Settings,
    store: object,
    bus: MemoryBus,
    instance_id: str,
    clock: Callable[[], datetime],
) -> Runtime:
    """``store``: a MemoryStore, or a test's spy around one."""
    rt = Runtime(
        settings=settings,
        store=store,  # type: ignore[arg-type]
        bus=bus,  # type: ignore[arg-type]
        workflows=settings.workflows(),
        instance_id=instance_id,
        clock=clock,
        rng=random.Random(0),
    )
    rt._status_bus = bus  # type: ignore[assignment]
    return rt
