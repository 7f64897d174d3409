"""What one Supervisor tick did: what it logs, records as metrics and returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from opentelemetry import metrics


@dataclass
class Outcomes:
    """What became of the rows found due that were looked at: by a tick itself, or by an
    instance that took them from a tick's hand-out (:mod:`service.recovery`)."""

    handled: int = 0
    """Rows due looked at (the rest wait for the next tick, or for a hand-out's message)."""
    retried: int = 0
    compensating: int = 0
    failed: int = 0
    flushed: int = 0
    reaped: int = 0
    conflicts: int = 0
    errors: int = 0
    parked: int = 0
    """Orders of a workflow version this deployment does not carry: alerted, left unchanged."""
    moved_on: int = 0
    """Handed-out rows found moved on already (recovered by an earlier message, or an order
    write moved them): nothing to do."""

    @property
    def recovered(self) -> int:
        return self.retried + self.compensating + self.failed + self.flushed + self.reaped

    def count(self, outcome: str) -> None:
        """One row handled, with ``outcome`` (an attribute's name; "" for none)."""
        self.handled += 1
        if outcome:
            setattr(self, outcome, getattr(self, outcome) + 1)


@dataclass
class TickReport(Outcomes):
    held: int = 0
    """Buckets this instance holds this tick."""
    swept: int = 0
    """Buckets whose rows due were all handled or handed out (checkpointed); the others are
    first next tick."""
    queries: int = 0
    due: int = 0
    handed_out: int = 0
    """Rows handed out to the fleet (service.hand_out), in ``messages`` messages."""
    messages: int = 0
    returned: int = 0
    """Rows of an earlier hand-out found due again: nobody moved them on within its lease."""
    left: int = 0
    """Rows due this tick neither handled nor handed out: its budget ran out, or the fleet's
    pace did not allow more (they are first next tick)."""
    drain_rate: float = 0.0
    """Rows per second the fleet moved on, over the buckets held (service.hand_out.pace)."""
    lag_s: float = 0.0
    """How long the most overdue row had been due when the tick found it."""
    hand_out_s: float = 0.0
    """Of ``duration_s``, the time it took to mark and send what it handed out."""
    duration_s: float = 0.0

    @property
    def time_to_drain_s(self) -> float | None:
        """The rows due at the pace measured; None if rows are due and no pace is known."""
        if not self.due:
            return 0.0
        return self.due / self.drain_rate if self.drain_rate > 0 else None


NAMES: Final[frozenset[str]] = frozenset(
    {
        "supervisor.rows_read",
        "supervisor.recovered",
        "supervisor.tick.duration",
        "supervisor.lag",
        "supervisor.buckets_unfinished",
        "supervisor.handed_out",
        "supervisor.returned",
        "supervisor.backlog",
        "supervisor.drain_rate",
        "supervisor.time_to_drain",
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


_handed_out = meter.create_counter(
    "supervisor.handed_out",
    unit="{row}",
    description="Rows due a tick handed out to the app's instances to recover",
)
_returned = meter.create_counter(
    "supervisor.returned",
    unit="{row}",
    description="Handed-out rows nobody moved on within the hand-out's lease (handed out again)",
)
_backlog = meter.create_gauge(
    "supervisor.backlog", unit="{row}", description="Rows due that the latest tick found"
)
_drain_rate = meter.create_gauge(
    "supervisor.drain_rate",
    unit="{row}/s",
    description="Rows due per second the app's instances moved on, as the latest tick measured",
)
_time_to_drain = meter.create_gauge(
    "supervisor.time_to_drain",
    unit="s",
    description="The rows due that the latest tick found, at the rate they drain",
)


def record_tick(report: TickReport) -> None:
    _rows_read.add(report.due)
    _recovered.add(report.recovered)
    _duration.record(report.duration_s)
    _lag.set(report.lag_s)
    _unfinished.add(report.held - report.swept)
    _handed_out.add(report.handed_out)
    _returned.add(report.returned)
    _backlog.set(report.due)
    _drain_rate.set(report.drain_rate)
    drain = report.time_to_drain_s
    if drain is not None:
        _time_to_drain.set(drain)


def record_recoveries(outcomes: Outcomes) -> None:
    """The orders an instance recovered from a tick's hand-out."""
    _recovered.add(outcomes.recovered)
