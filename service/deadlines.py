"""How long each kind of invocation may take, stated for the Table calls it makes
(:mod:`adapters.deadline`: the Table client cuts a call still running when its bound is up).

- A message (the Scheduler's queues, the agents'): the Functions host renews its lock for
  ``maxAutoLockRenewalDuration`` (host.json: five minutes) from when it hands it over. The
  handler's calls end :data:`SETTLE_MARGIN` before that, so the message is still locked when
  it is completed or abandoned. An agent's call to its remote service has a tighter bound of
  its own, the step's run budget (at most 270 s: ``adapters.settings.MAX_RUN_BUDGET``).
- A Supervisor tick: its buckets are claimed for ``supervisor_claim`` from its start (the
  tick's budget plus half the slack to the next tick); its calls end then, before another
  instance may take the buckets over and before the next tick is due; but never sooner than
  :data:`TICK_FLOOR`, which only a schedule of a few seconds (tests, the local stack) reaches:
  a loaded machine's ordinary calls take that long, and a tick that runs over its claim is
  still safe (every write it makes is ETag-conditional), only late.
- A purge run: its budget, when it has one, plus :data:`PURGE_GRACE` to finish the orders it
  has begun and record the run (the timer's run: within the Functions timeout).
- An HTTP request of the operations app: Azure's front end gives up on an HTTP-triggered
  function after :data:`HTTP_TIMEOUT` (230 s), whatever the Functions timeout; its calls end
  :data:`ANSWER_MARGIN` before that, so the caller still gets an answer, which says the
  request ran out of time.

A call cut by its bound fails as a lost answer does (a write: ``adapters.tables.OutcomeUnknown``)
and what it may have written is settled by reading if time is left, else by the redelivery,
the next tick or the next run: never guessed.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Final

from adapters import deadline
from adapters.settings import Settings

MESSAGE_LOCK_RENEWAL: Final = timedelta(minutes=5)
"""host.json's ``serviceBus.maxAutoLockRenewalDuration`` (a unit test keeps the two equal)."""
SETTLE_MARGIN: Final = timedelta(seconds=15)
"""Left, at the end of a message's lock, to complete or abandon it."""
TICK_FLOOR: Final = timedelta(seconds=10)
"""The shortest bound a tick gets (the default schedule's claim is 13.125 s)."""
PURGE_GRACE: Final = timedelta(minutes=1)
HTTP_TIMEOUT: Final = timedelta(seconds=230)
"""How long Azure's load balancer waits for an HTTP-triggered function's response."""
ANSWER_MARGIN: Final = timedelta(seconds=15)
"""Left, at the end of an HTTP request's time, to answer it."""


def message() -> AbstractContextManager[None]:
    """The bound of a Service Bus-triggered handler, entered as it starts."""
    return deadline.within((MESSAGE_LOCK_RENEWAL - SETTLE_MARGIN).total_seconds())


def tick(settings: Settings, budget_s: float) -> AbstractContextManager[None]:
    """The bound of a Supervisor tick whose budget is ``budget_s`` (:func:`tick_seconds`)."""
    return deadline.within(tick_seconds(settings, budget_s))


def tick_seconds(settings: Settings, budget_s: float) -> float:
    """How long a tick whose budget is ``budget_s`` may make Table calls: its claim, or its
    budget plus the claim's slack when a caller gives it a longer budget than the settings';
    at least :data:`TICK_FLOOR`."""
    claim = settings.supervisor_claim.total_seconds()
    slack = claim - settings.supervisor_budget.total_seconds()
    return max(claim, budget_s + slack, TICK_FLOOR.total_seconds())


def http_request() -> AbstractContextManager[None]:
    """The bound of an HTTP request, entered as the operations app takes it."""
    return deadline.within((HTTP_TIMEOUT - ANSWER_MARGIN).total_seconds())


def purge(budget: timedelta | None) -> AbstractContextManager[None]:
    """The bound of a purge run with ``budget`` (None: no bound but the pipeline's own)."""
    if budget is None:
        return nullcontext()
    return deadline.within((budget + PURGE_GRACE).total_seconds())
