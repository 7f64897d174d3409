"""Simulated cold starts: the first call of a function waits as if its instance were allocated.

On Flex Consumption each Service Bus function scales to zero on its own, and the first message
after an idle spell waits for an instance to be allocated and the app imported. The local host
is always warm, so it can add that wait: ``DEVHOST_COLD_START_SECONDS`` lists
``<function>:<seconds>`` pairs separated by commas (``*:<seconds>`` for every function not
named), e.g. ``payment_agent:8,scheduler_replies:3``. The first invocation of each named
function waits that long before it runs, and any invocation arriving meanwhile waits with it
(the instance is not up yet); later ones run at once. Unset or empty: no cold starts.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Mapping

from devstack.host.settings import HostConfigError

COLD_START_SETTING = "DEVHOST_COLD_START_SECONDS"
MAX_COLD_START_S = 600.0
log = logging.getLogger("devstack.host.cold_start")


def parse_cold_starts(text: str, functions: Collection[str]) -> dict[str, float]:
    """Seconds of first-call delay per function name, from the setting's text."""
    delays: dict[str, float] = {}
    default: float | None = None
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, raw = entry.rpartition(":")
        name = name.strip()
        try:
            seconds = float(raw)
        except ValueError:
            seconds = math.nan
        if not sep or not name or not (0 <= seconds <= MAX_COLD_START_S):
            raise HostConfigError(
                f"{COLD_START_SETTING}: {entry!r} must be <function>:<seconds> with 0 to "
                f"{MAX_COLD_START_S:g} seconds (or *:<seconds> for every function), e.g. "
                "payment_agent:8,scheduler_replies:3"
            )
        if name == "*":
            default = seconds
        elif name not in functions:
            raise HostConfigError(
                f"{COLD_START_SETTING}: no function is named {name!r}; the app has "
                f"{', '.join(sorted(functions))}"
            )
        else:
            delays[name] = seconds
    if default is not None:
        delays = {name: delays.get(name, default) for name in functions}
    return {name: seconds for name, seconds in delays.items() if seconds > 0}


class ColdStarts:
    """The first-call delay of each function, paid once per host (one instance per function)."""

    def __init__(
        self, delays: Mapping[str, float], sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self._pending = dict(delays)
        self._locks = {name: threading.Lock() for name in delays}
        self._sleep = sleep

    def applies(self, function: str) -> bool:
        """Whether ``function`` has a cold start (paid or not): only then may :meth:`wait` block."""
        return function in self._locks

    def wait(self, function: str) -> float:
        """Pay ``function``'s cold start if it has not been paid; the seconds waited here."""
        lock = self._locks.get(function)
        if lock is None:
            return 0.0
        started = time.monotonic()
        with lock:  # callers arriving while the instance "starts" wait for it too
            delay = self._pending.pop(function, 0.0)
            if delay:
                log.info("%s: cold start, first call waits %.1f s", function, delay)
                self._sleep(delay)
        return time.monotonic() - started

    @property
    def pending(self) -> dict[str, float]:
        return dict(self._pending)
