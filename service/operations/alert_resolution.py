"""Whether an alert still calls for an operator, derived when alerts are listed from the state
and timeline of the order it names: nothing is written when an order recovers, so the hot path
pays nothing for it.

- An alert that names no order is ``open`` until it is acknowledged (removed).
- The order no longer exists (purged): ``order_gone``.
- The order is Processed now: ``resolved`` (resubmitted or restarted, and it finished). So is a
  warning that the order has been compensating long, once it no longer compensates (its end
  raised a terminal alert of its own when it ended in Error).
- A terminal alert (the one an order raises on entering Error) whose order is in flight again:
  ``retrying``; whose order is in Error again after a resubmit or restart that followed the
  alert: ``superseded`` (the new failure raised its own alert).
- Otherwise ``open``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from domain.order import COMPENSATION_DELAYED, TERMINAL_ALERT_REASONS, Order, TimelineEntry
from domain.states import ProcessState
from service.operations.models import Resolution

RETRIES: Final = frozenset({"resubmitted", "restarted", "compensation_resumed"})
"""Timeline events that put an Error order back in flight."""
STILL_OPEN: Final = frozenset({"open", "retrying"})


def needs_timeline(alert: Mapping[str, Any], order: Order | None) -> int | None:
    """The timeline position after which :func:`resolution` must see the events (None: it
    needs none): only for a terminal alert whose order is in Error and has moved since."""
    seq = alert.get("timeline_seq")
    if (
        order is None
        or order.state is not ProcessState.ERROR
        or alert.get("reason") not in TERMINAL_ALERT_REASONS
        or not isinstance(seq, int)
        or order.timeline_seq <= seq
    ):
        return None
    return seq


def resolution(
    alert: Mapping[str, Any], order: Order | None, later: Iterable[TimelineEntry] = ()
) -> Resolution:
    """``later``: the order's timeline entries after :func:`needs_timeline`'s position."""
    if not isinstance(alert.get("order_id"), str):
        return "open"
    if order is None:
        return "order_gone"
    if order.state is ProcessState.PROCESSED:
        return "resolved"
    if alert.get("reason") == COMPENSATION_DELAYED:
        return "open" if order.state is ProcessState.COMPENSATING else "resolved"
    if alert.get("reason") not in TERMINAL_ALERT_REASONS:
        return "open"
    if order.state.in_flight:
        return "retrying"
    if any(entry.event in RETRIES for entry in later):
        return "superseded"
    return "open"
