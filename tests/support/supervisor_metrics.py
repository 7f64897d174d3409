"""What ``service.sweep_report`` records during a test: the ``metric_reader`` fixture (registered
in tests/unit/conftest.py) and :func:`recorded`.

One module, imported under one name: the provider it installs globally is remembered once per
process, whichever test file asks first.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import Counter as SdkCounter
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader

import service.sweep_report as supervisor_metrics

_INSTALLED: InMemoryMetricReader | None = None


def _reader() -> InMemoryMetricReader:
    return InMemoryMetricReader(
        preferred_temporality={
            SdkCounter: AggregationTemporality.DELTA,
            SdkHistogram: AggregationTemporality.DELTA,
        }
    )


def _instruments() -> dict[str, tuple[str, str]]:
    """Every instrument of service.sweep_report: its attribute -> (kind, name)."""
    kinds = ((metrics.Counter, "counter"), (metrics.Histogram, "histogram"),
             (metrics._Gauge, "gauge"))  # fmt: skip
    found = {
        attribute: (kind, value._name)
        for attribute, value in vars(supervisor_metrics).items()
        for cls, kind in kinds
        if isinstance(value, cls)
    }
    assert {name for _, name in found.values()} == supervisor_metrics.NAMES, found
    return found


@pytest.fixture
def metric_reader(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemoryMetricReader]:
    """What ``service.sweep_report`` records during the test (counters as deltas).

    The module's meter comes from the global proxy, so installing an SDK provider globally
    (once per process: it cannot be replaced) makes its instruments record there. If another
    test installed a different provider first, the module's instruments are swapped for ones
    of a private provider for this test only.
    """
    global _INSTALLED
    if _INSTALLED is None:
        reader = _reader()
        provider = MeterProvider(metric_readers=[reader])
        metrics.set_meter_provider(provider)  # refused (a warning) if one is installed
        if metrics.get_meter_provider() is provider:
            _INSTALLED = reader
        else:
            provider.shutdown()
    if _INSTALLED is not None:
        _INSTALLED.get_metrics_data()  # drop what earlier tests recorded
        yield _INSTALLED
        return
    reader = _reader()
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("orders.supervisor")
    for attribute, (kind, name) in _instruments().items():
        monkeypatch.setattr(supervisor_metrics, attribute, getattr(meter, f"create_{kind}")(name))
    yield reader
    provider.shutdown()


def recorded(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """The data points recorded on the Supervisor's meter, by instrument name."""
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            if scope.scope.name != "orders.supervisor":
                continue
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found
