"""Following an order until it finishes: `orderctl status ID --watch` and `submit --wait`.

Over the operator operation that waits for an order's next change
(:func:`service.operations.orders.watch_order`, ``GET /api/orders/{id}/watch``): each
call returns once the order has new timeline entries, or after a few seconds without one, and
the next call asks for what came after the last entry seen. No polling loop of its own beyond
that, and nothing is printed twice.

The exit code says how it ended: 0 Processed, 3 Error, 4 still in flight when the timeout ran
out (see :func:`exit_code`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from domain.states import ProcessState
from service.operations.errors import NotFound
from service.operations.models import WatchView

EXIT_PROCESSED: Final = 0
EXIT_ERROR: Final = 3
EXIT_TIMEOUT: Final = 4
WAIT_PER_CALL: Final = 10.0
"""Seconds one call waits for a change (the operation allows up to 60)."""
NOT_YET_PAUSE: Final = 0.5

Watch = Callable[[int, float], Awaitable[WatchView]]
"""``watch(after_seq, wait_s)``: the order's next change (orders.watch_order)."""


@dataclass(frozen=True, slots=True)
class Followed:
    last: WatchView | None
    """The last answer (None: the order never appeared)."""
    timed_out: bool
    waited_s: float


async def follow(
    watch: Watch,
    on_change: Callable[[WatchView], None],
    *,
    timeout: float | None,
    wait_for_creation: bool = False,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Followed:
    """Call ``on_change`` with each change of the order until it is finished, or until
    ``timeout`` seconds have passed (None: no limit). ``wait_for_creation``: an order not there
    yet is waited for (a submission on its way), instead of being an error."""
    started = clock()
    after = -1
    last: WatchView | None = None
    while True:
        remaining = float("inf") if timeout is None else started + timeout - clock()
        if remaining <= 0:
            return Followed(last, True, clock() - started)
        try:
            view = await watch(after, min(WAIT_PER_CALL, remaining))
        except NotFound:
            if not wait_for_creation:
                raise
            await sleep(min(NOT_YET_PAUSE, remaining))
            continue
        if view.changed or last is None:
            on_change(view)
        if view.detail.timeline:
            after = view.detail.timeline[-1].seq
        last = view
        if view.terminal and view.detail.timeline_continuation is None:
            return Followed(view, False, clock() - started)


def exit_code(followed: Followed) -> int:
    if followed.timed_out or followed.last is None:
        return EXIT_TIMEOUT
    state = followed.last.detail.order.state
    return EXIT_ERROR if state == ProcessState.ERROR.value else EXIT_PROCESSED
