"""The time the current invocation has left, which every Table call it makes must respect.

An invocation states how long it may take (:func:`within`: a message handled under its lock,
a Supervisor tick within its claim, a purge run within the Functions timeout, an HTTP request
within the front end's;
:mod:`service.deadlines` says how long each is); the Table client cuts any call still running
when that time is up, its retries and their waits included (:mod:`adapters.tables.pipeline`).
Nothing else bounds a call whole: the read timeout is per read, so a server that sends a byte
now and then holds a call for as long as it likes.

A context variable rather than an argument: the bound reaches the one place that sends without
passing through every store method on the way, and the tasks an invocation starts inherit it
(asyncio copies the context into each task), so a tick's concurrent sweeps share the tick's.
Outside any bound (command-line tools, tests) calls are bounded by the pipeline's own timeouts
only, as before.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_ends_at: ContextVar[float | None] = ContextVar("invocation_deadline", default=None)
"""When the bound ends, on the monotonic clock (``time.monotonic``, asyncio's own)."""


def remaining() -> float | None:
    """Seconds left before the current bound ends (0 or less: it has), or None if none is set."""
    ends_at = _ends_at.get()
    return None if ends_at is None else ends_at - time.monotonic()


@contextmanager
def within(seconds: float, *, detached: bool = False) -> Iterator[None]:
    """Bound what runs inside to ``seconds`` from now, or to the enclosing bound if that ends
    first. ``detached``: a bound of its own whatever encloses it, for work that outlives the
    invocation that started it (a writer task serving every invocation in turn)."""
    ends_at = time.monotonic() + seconds
    enclosing = _ends_at.get()
    if enclosing is not None and not detached:
        ends_at = min(ends_at, enclosing)
    token = _ends_at.set(ends_at)
    try:
        yield
    finally:
        _ends_at.reset(token)
