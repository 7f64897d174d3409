"""Run a process with its wall clock offset (a skewed host), the process none the wiser.

Debian's ``datefudge`` preloads a library that shifts what ``time()``, ``gettimeofday()`` and
``clock_gettime(CLOCK_REALTIME)`` return by ``-DATEFUDGE`` seconds, and leaves the monotonic
clock alone, so ``time.sleep``, ``threading.Event.wait`` and ``asyncio.sleep`` wait as long as
they should. libfaketime (Debian's ``faketime``) is not usable with Python 3.11 here: it shifts
the monotonic clock too (``Event.wait`` never returns), and with that turned off ``time.sleep``
fails with EINVAL. tests/integration/test_clock_skew.py checks the shim in a throwaway
interpreter before anything relies on it.
"""

from __future__ import annotations

import glob
from collections.abc import Mapping

LIBRARY_PATTERN = "/usr/lib/*/datefudge/datefudge.so"
INSTALL_HINT = "install Debian's datefudge (scripts/bootstrap does, as root)"


class ClockShimMissing(RuntimeError):
    """Skewing a clock needs datefudge's library; the message says how to get it."""


def library() -> str | None:
    """The datefudge preload library, or None when it is not installed."""
    found = sorted(glob.glob(LIBRARY_PATTERN))
    return found[0] if found else None


def skewed_environment(env: Mapping[str, str], offset_s: int) -> dict[str, str]:
    """``env`` for a process whose wall clock runs ``offset_s`` seconds ahead (negative:
    behind) of this machine's. Whole seconds: datefudge takes no fraction."""
    shim = library()
    if shim is None:
        raise ClockShimMissing(f"skewing a host's clock needs datefudge: {INSTALL_HINT}")
    preload = ":".join(filter(None, (shim, env.get("LD_PRELOAD", ""))))
    return {**env, "LD_PRELOAD": preload, "DATEFUDGE": str(-offset_s)}
