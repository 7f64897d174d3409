"""Unit tests run as if the developer's shell pointed orderctl nowhere: remote-mode settings
from the environment would send the CLI's commands to some deployed app. A test that asks for
``spans`` reads the spans it finished, from the process's SDK tracer provider (``provider``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.spans import recording

REMOTE_SETTINGS = ("ORDERCTL_API_URL", "ORDERCTL_FUNCTION_KEY", "ORDERCTL_AUTH", "ORDERCTL_SCOPE")


@pytest.fixture(autouse=True)
def _local_orderctl(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in REMOTE_SETTINGS:
        monkeypatch.delenv(name, raising=False)


_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def provider() -> Iterator[TracerProvider]:
    with recording(_EXPORTER) as installed:
        yield installed


@pytest.fixture
def spans(provider: TracerProvider) -> Iterator[InMemorySpanExporter]:
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()
