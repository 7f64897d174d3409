"""What one Supervisor tick did: what it logs, records as metrics and returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TickReport:
    held: int = 0
    """Buckets this instance holds this tick."""
    swept: int = 0
    """Buckets swept to the end (checkpointed); the others are first next tick."""
    queries: int = 0
    due: int = 0
    handled: int = 0
    """Rows due that this tick handled within its budget (the rest are first next tick)."""
    retried: int = 0
    compensating: int = 0
    failed: int = 0
    flushed: int = 0
    reaped: int = 0
    conflicts: int = 0
    errors: int = 0
    parked: int = 0
    """Orders of a workflow version this deployment does not carry: alerted, left unchanged."""
    lag_s: float = 0.0
    """How long the most overdue row had been due when the tick found it."""
    duration_s: float = 0.0

    @property
    def recovered(self) -> int:
        return self.retried + self.compensating + self.failed + self.flushed + self.reaped
