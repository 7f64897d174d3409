"""What one Supervisor tick did: what it logs, records as metrics and returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from opentelemetry import metrics


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


NAMES: Final[frozenset[str]] = frozenset(
    {
        "supervisor.rows_read",
        "supervisor.recovered",
        "supervisor.tick.duration",
        "supervisor.lag",
        "supervisor.buckets_unfinished",
    }
)
"""Every instrument this module records (adapters.metrics.NAMES has the orders' own)."""
ATTRIBUTES: Final[Mapping[str, frozenset[str]]] = {name: frozenset() for name in NAMES}
"""Each instrument's attributes: none (one series per app)."""

meter = metrics.get_meter("orders.supervisor")
_rows_read = meter.create_counter(
    "supervisor.rows_read", unit="{row}", description="Index rows due that the Supervisor read"
)
_recovered = meter.create_counter(
    "supervisor.recovered",
    unit="{order}",
    description="Orders the Supervisor retried, compensated, failed, flushed or reaped",
)
_duration = meter.create_histogram(
    "supervisor.tick.duration", unit="s", description="Duration of one Supervisor tick"
)
_lag = meter.create_gauge(
    "supervisor.lag",
    unit="s",
    description="How long the most overdue order had been due when the tick found it",
)
_unfinished = meter.create_counter(
    "supervisor.buckets_unfinished",
    unit="{bucket}",
    description="Buckets a tick's time budget cut short (swept first next tick)",
)


def record_tick(report: TickReport) -> None:
    _rows_read.add(report.due)
    _recovered.add(report.recovered)
    _duration.record(report.duration_s)
    _lag.set(report.lag_s)
    _unfinished.add(report.held - report.swept)
