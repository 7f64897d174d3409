"""What one call to a remote service came to, as the Agent function sees it.

The Agent replies to the Scheduler for each: ``DeadlinePassed`` is reported as a transient
``Failed`` (:func:`service.agent.out_of_time`), which counts only while its attempt is in
flight; after complete-by the Supervisor recovers the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Succeeded:
    """The service applied (or had already applied) the operation; ``result`` is its JSON."""

    result: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1


@dataclass(frozen=True)
class NothingToUndo:
    """An undo whose forward call never took effect at the service.

    The service answered ``{"status": "nothing_to_undo", ...}`` (``result``) and now refuses the
    forward key for ever (see docs/remote-service-contract.md): nothing is left in place.
    """

    result: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1


@dataclass(frozen=True)
class Failed:
    """The call ended without success before complete-by.

    ``transient`` is False for a business refusal (e.g. ``card_declined``, or
    ``undone_before_applied``): retrying the same request cannot help. It is True when retries
    were exhausted: the same request may succeed later.
    """

    code: str
    message: str
    transient: bool
    attempts: int = 0


@dataclass(frozen=True)
class Deferred:
    """The circuit to the service is open: no definitive answer, try again at ``retry_at``.

    Either nothing was sent, or every attempt so far failed transiently and the circuit opened
    meanwhile. Not a failure: an outage delays the step, it does not fail it.
    """

    retry_at: datetime
    attempts: int = 0
    last_error: str | None = None


@dataclass(frozen=True)
class DeadlinePassed:
    """Complete-by or the run budget came (or would come before another attempt could finish).
    ``attempts``: how many calls were made (0: the service was never called)."""

    last_error: str | None = None
    attempts: int = 0


CallOutcome = Succeeded | NothingToUndo | Failed | Deferred | DeadlinePassed
