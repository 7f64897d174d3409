"""What sync code waits with: the twins of core.aio.primitives' names (see that module)."""

from __future__ import annotations

import threading
import time

Lock = threading.Lock
Semaphore = threading.Semaphore
Event = threading.Event
sleep = time.sleep
