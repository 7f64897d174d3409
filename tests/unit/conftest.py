"""Unit tests run as if the developer's shell pointed orderctl nowhere: remote-mode settings
from the environment would send the CLI's commands to some deployed app.

Fixtures several files here share: ``spans``, the spans a test finished, from the process's SDK
tracer provider (``provider``); ``serve``, scripted HTTP servers on 127.0.0.1 (of
tests/support/scripted_http.py) closed at the test's end; ``certificates``, a TLS authority and
certificates for the servers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.certificates import Certificates, make_certificates
from tests.support.scripted_http import Serve, scripted_servers
from tests.support.spans import recording
from tests.support.supervisor_metrics import metric_reader  # noqa: F401 (a fixture)

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


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    async with scripted_servers() as start:
        yield start


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))
