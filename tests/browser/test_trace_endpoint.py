"""GET /api/dashboard/orders/{id}/trace called through the operations app's HTTP function, as
the Functions worker would: the id validated
first, the spans of the TELEMETRY_DIR files as trees when the setting is there, and where to
look (Application Insights) when it is not. No browser and no services here."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import azure.functions as func
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from adapters import trace_files
from dashboard import traces
from tests.support.operations import OperationsApp, loaded

pytestmark = pytest.mark.anyio

ORIGIN = trace.SpanContext(
    0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=True,
    trace_flags=trace.TraceFlags(1),
)  # fmt: skip


@pytest.fixture(scope="module")
def ops() -> Iterator[OperationsApp]:
    with loaded() as app:
        yield app


async def call(ops: OperationsApp, order_id: str) -> func.HttpResponse:
    encoded = quote(order_id, safe="")
    return await ops.request("GET", f"http://localhost/api/dashboard/orders/{encoded}/trace")


def write_spans(directory: Path, order_id: str, *, pid: int = 1) -> None:
    """intake, an agent under it, and a Supervisor recovery, through the app's exporter; and a
    span of another order."""
    provider = TracerProvider()
    path = directory / trace_files.file_name("spans", "host", pid)
    provider.add_span_processor(
        SimpleSpanProcessor(trace_files.FileSpanExporter(path, "host", pid))
    )
    tracer = provider.get_tracer("orders")
    ids = {"order.id": order_id}
    with trace.use_span(trace.NonRecordingSpan(ORIGIN)):
        with tracer.start_as_current_span("scheduler_intake", attributes=ids):
            with tracer.start_as_current_span("inventory_agent", attributes=ids):
                pass
            with tracer.start_as_current_span("supervisor_recover", attributes=ids):
                pass
    with tracer.start_as_current_span("scheduler_intake", attributes={"order.id": "other"}):
        pass
    provider.shutdown()


@pytest.mark.parametrize(
    ("bad", "status", "code"),
    [
        (" o-1", 400, "invalid_order_id"),
        ("<script>", 400, "invalid_order_id"),
        ("x" * 500, 400, "invalid_order_id"),
        # Not one path segment: no route takes it (the worker's ASGI bridge decodes %2F).
        ("", 404, "not_found"),
        ("o/1", 404, "not_found"),
    ],
)
async def test_a_bad_order_id_is_refused_before_anything_is_read(
    bad, status, code, monkeypatch, tmp_path, ops
):
    monkeypatch.setenv("TELEMETRY_DIR", str(tmp_path / "never-created"))
    response = await call(ops, bad)
    assert response.status_code == status
    assert json.loads(response.get_body())["error"]["code"] == code
    assert not (tmp_path / "never-created").exists()


async def test_without_telemetry_files_it_says_where_to_look(monkeypatch, ops):
    monkeypatch.delenv("TELEMETRY_DIR", raising=False)
    response = await call(ops, "o-1")
    body = json.loads(response.get_body())
    assert response.status_code == 200
    assert body["local"] is False and body["traces"] == []
    assert "Application Insights" in body["hint"] and "Transaction search" in body["hint"]


async def test_with_telemetry_files_it_returns_the_orders_span_tree(monkeypatch, tmp_path, ops):
    write_spans(tmp_path, "o-1")
    monkeypatch.setenv("TELEMETRY_DIR", str(tmp_path))
    response = await call(ops, "o-1")
    assert response.status_code == 200 and response.headers["Cache-Control"] == "no-store"
    body = json.loads(response.get_body())
    assert body["local"] is True and body["span_count"] == 3 and not body["truncated"]
    (found,) = body["traces"]
    assert found["trace_id"] == f"{ORIGIN.trace_id:032x}" and found["why"] is None
    (root,) = found["spans"]
    assert root["name"] == "scheduler_intake" and root["orphan"] is True  # parent: the client
    assert [c["name"] for c in root["children"]] == ["inventory_agent", "supervisor_recover"]
    assert all(c["offset_ms"] >= 0 and c["duration_ms"] >= 0 for c in root["children"])
    assert root["attributes"] == {"order.id": "o-1"}


async def test_an_order_without_spans_yet_says_so(monkeypatch, tmp_path, ops):
    monkeypatch.setenv("TELEMETRY_DIR", str(tmp_path / "not-yet"))
    body = json.loads((await call(ops, "o-1")).get_body())
    assert body["local"] is True and body["traces"] == [] and "--telemetry" in body["hint"]


def test_at_most_max_spans_are_returned(monkeypatch, tmp_path):
    for pid in range(3):
        write_spans(tmp_path, "o-1", pid=pid)
    monkeypatch.setattr(traces, "MAX_SPANS", 4)
    body = traces.order_trace("o-1", tmp_path)
    assert body["span_count"] == 9 and body["truncated"] is True

    def count(spans: list) -> int:
        return sum(1 + count(s["children"]) for s in spans)

    assert sum(count(t["spans"]) for t in body["traces"]) == 4
    assert body["traces"][0]["why"] is None
