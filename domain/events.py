"""What a decision on an order is given and what it returns: the pattern's events, the
:class:`Context`, the :class:`Decision`.

:func:`domain.lifecycle.decide` decides on the events here; an operator's actions are decided
apart (:mod:`domain.operator_actions`), on the same context, into the same kind of decision.
The shell (:mod:`service.apply`) builds the context and carries the decision out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from domain.messages import AgentResponse, SchedulerCommand
from domain.order import Order, Outgoing, TimelineEntry
from domain.workflows import Workflow

DEFAULT_STALE_AFTER: Final = timedelta(minutes=2)
DEFAULT_FLUSH_GRACE: Final = timedelta(seconds=10)
DEFAULT_SKEW: Final = timedelta(seconds=10)
"""How far two hosts' clocks may disagree by default (``CLOCK_SKEW_TOLERANCE_SECONDS``)."""
DEFAULT_COMPENSATION_BUDGET: Final = timedelta(hours=6)
DEFAULT_COMPENSATION_WARN_AFTER: Final = timedelta(minutes=10)


@dataclass(frozen=True, slots=True)
class Context:
    """What a decision may know besides the order and the event.

    ``actor``: who acts (LockedBy of a claim, the timeline's actor). ``jitter``: a number in
    [0, 1) the shell drew, spreading retry delays. ``stale_after``: how long a released order
    may wait past its retry time before the Supervisor releases it again (a failure); after
    half of it, the Supervisor resends what the order owes (no failure). ``flush_grace``: how
    long a finished order's writer has to send its outbox before the Supervisor does it.
    ``compensation_budget``: how long, from when compensation starts, a failed undo is
    retried; ``compensation_warn_after``: when a compensation still going on raises a warning.
    ``skew``: how far two hosts' clocks may disagree. A time another host stamped (a
    CompleteBy, a retry time, an update) is acted on only once ``now`` is past it by more than
    this, so a Supervisor whose clock runs ahead never recovers an order early.
    """

    workflow: Workflow
    now: datetime
    actor: str
    jitter: float = 0.5
    stale_after: timedelta = DEFAULT_STALE_AFTER
    flush_grace: timedelta = DEFAULT_FLUSH_GRACE
    compensation_budget: timedelta = DEFAULT_COMPENSATION_BUDGET
    compensation_warn_after: timedelta = DEFAULT_COMPENSATION_WARN_AFTER
    skew: timedelta = timedelta(0)


@dataclass(frozen=True, slots=True)
class Decision:
    """``order``: the record to write (None: write nothing). ``send``: the messages to send,
    in order, after the write. ``finished``: once sent, the order owes nothing any more (the
    shell removes its active-index row). ``entry``: the timeline row the write adds."""

    order: Order | None
    send: tuple[Outgoing, ...]
    entry: TimelineEntry | None = None
    finished: bool = False
    note: str = ""


@dataclass(frozen=True, slots=True)
class Replied:
    """``caused_by``: which message brought the reply (:meth:`service.inbound.Delivery.cause`);
    it names the alerts deciding on it raises (None: they are named by their text)."""

    response: AgentResponse
    caused_by: str | None = None


@dataclass(frozen=True, slots=True)
class RetryDue:
    command: SchedulerCommand


@dataclass(frozen=True, slots=True)
class Resent:
    """The submission of an existing order came again (a redelivery after a crash)."""


@dataclass(frozen=True, slots=True)
class Swept:
    """The Supervisor looked at the order."""


@dataclass(frozen=True, slots=True)
class RepliesRefused:
    """The submitter's queue refused status update ``sequence``: it does not exist, is disabled,
    or the app may not send to it (``failure`` says which). ``sent``: the MessageIds of what
    the same send had sent before it, in the order's outbox order. A queue that might take it
    on a second try (a timeout, a busy broker) is not a refusal: that send fails, is made again."""

    sequence: int
    failure: str
    sent: frozenset[str] = frozenset()


Event = Replied | RetryDue | Resent | Swept | RepliesRefused
"""What happens to an order in the pattern's own course (an operator's actions are apart:
:data:`domain.operator_actions.Action`)."""
