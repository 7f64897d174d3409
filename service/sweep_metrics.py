"""The Supervisor's tick metrics, through the OpenTelemetry metrics API.

Exported to Application Insights (customMetrics) when telemetry is configured
(:mod:`adapters.telemetry`); a no-op otherwise. ``supervisor.lag`` is what infra/ alerts on: how
long the most overdue order had been due when a tick found it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from opentelemetry import metrics

from service.sweep_report import TickReport

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
