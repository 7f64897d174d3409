"""What async code waits with, under the names the generated sync code uses (core.primitives).

Hand-written in both forms: ``python -m devstack.unasync`` turns ``core.aio.primitives`` into
``core.primitives`` and leaves the names alone. A lock held across an ``await`` must be this
``Lock``; one never held across an ``await`` may stay a ``threading.Lock`` in both.
"""

from __future__ import annotations

import asyncio

Lock = asyncio.Lock
Semaphore = asyncio.Semaphore
Event = asyncio.Event
sleep = asyncio.sleep
