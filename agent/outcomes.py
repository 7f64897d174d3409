"""What one call to a remote service came to, as the Agent function sees it.

The Agent replies to the Scheduler for ``Succeeded`` and ``Failed``. For ``DeadlinePassed`` it
sends nothing: after complete-by the agent stops and the Supervisor recovers the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Succeeded:
    """The service applied (or had already applied) the operation; ``result`` is its JSON."""

    result: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1


@dataclass(frozen=True)
class Failed:
    """The call ended without success before complete-by.

    ``transient`` is False for a business refusal (e.g. ``card_declined``): retrying the same
    request cannot help. It is True when retries were exhausted or the circuit was open: the
    same request may succeed later.
    """

    code: str
    message: str
    transient: bool
    attempts: int = 0


@dataclass(frozen=True)
class DeadlinePassed:
    """Complete-by came (or would come before another attempt could finish): reply nothing."""

    last_error: str | None = None
    attempts: int = 0


CallOutcome = Succeeded | Failed | DeadlinePassed
