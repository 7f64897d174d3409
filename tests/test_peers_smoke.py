"""benchmarks.peers: its schedule and summaries (fast), and a tiny run end to end (slow): our
side always; the DBOS side only where its environment (.bench/dbos-venv) was made before, as
the benchmark makes it on its first run (it downloads DBOS). No timing assertions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import peers
from tests.support.benchmark_runs import benchmark_report


def plan(**changes: Any) -> peers.Plan:
    base = {
        "orders": 10,
        "paced_orders": 5,
        "workflows": ["single_step", "order"],
        "sides": ["dbos", "ours"],
        "rounds": 2,
        "rate": 0.0,
        "paced": True,
        "hosts": 2,
        "warmup": 0,
        "dbos_concurrency": 32,
        "dbos_polling_s": 0.05,
        "instance_memory_mb": 2048,
        "orders_per_month": 1e7,
    }
    return peers.Plan(**(base | changes))


def result(side: str, workflow: str, per_s: float, **changes: Any) -> peers.RunResult:
    base = {
        "side": side,
        "workflow": workflow,
        "mode": "burst",
        "round": 1,
        "orders": 10,
        "rate": 0.0,
        "finished": 10,
        "failed": 0,
        "seconds": 10 / per_s,
        "workflows_per_s": per_s,
        "latency_s": {"p50": 1.0, "p99": 2.0, "max": 2.0},
        "submit_s": 0.5,
        "cpu_ms": {"hosts": 10.0, "fakes": 1.0} if side == "ours" else {"dbos": 5.0},
        "cpu_ms_engine": 10.0 if side == "ours" else 5.0,
        "load_1m": 1.0,
    }
    return peers.RunResult(**(base | changes))


def test_who_goes_first_alternates_from_slot_to_slot() -> None:
    order = [(r, w, s) for r, w, s in peers.slots(plan())]
    assert order == [
        (1, "single_step", "dbos"),
        (1, "single_step", "ours"),
        (1, "order", "ours"),
        (1, "order", "dbos"),
        (2, "single_step", "dbos"),
        (2, "single_step", "ours"),
        (2, "order", "ours"),
        (2, "order", "dbos"),
    ]


def test_paced_rate_is_given_or_half_the_slower_burst() -> None:
    bursts = [result("dbos", "order", 40.0), result("ours", "order", 16.0)]
    assert peers.paced_rate(plan(rate=7.0), bursts, "order") == 7.0
    assert peers.paced_rate(plan(), bursts, "order") == 8.0


def test_timing_measures_from_first_submission_to_last_completion() -> None:
    measured = peers.timing([(100.0, 100.5), (100.1, 101.0), (100.2, 102.0)])
    assert measured["finished"] == 3 and measured["seconds"] == 2.0
    assert measured["submit_s"] == pytest.approx(0.2)
    assert measured["workflows_per_s"] == 1.5
    assert measured["latency_s"].p50 == pytest.approx(0.9)


def test_summary_gives_ours_over_dbos() -> None:
    runs = [result("dbos", "order", 40.0), result("ours", "order", 20.0)]
    (row,) = peers.summarize(runs, plan(workflows=["order"], rounds=1))
    assert row["ours_over_dbos"]["workflows_per_s"] == 0.5
    assert row["ours_over_dbos"]["cpu_ms_engine"] == 2.0


def run_benchmark(workdir: Path, *args: str) -> dict[str, Any]:
    args = (*args, "--json", "--workdir", str(workdir))
    return benchmark_report("benchmarks.peers", *args, timeout=280)


TINY = ["--orders", "5", "--paced-orders", "5", "--rate", "5", "--warmup", "1"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_our_side_at_a_tiny_size(tmp_path: Path) -> None:
    doc = run_benchmark(tmp_path, "--side", "ours", *TINY)
    runs = doc["runs"]
    assert {(r["workflow"], r["mode"]) for r in runs} == {
        (w, m) for w in ("single_step", "order") for m in ("burst", "paced")
    }
    for run in runs:
        assert run["side"] == "ours" and run["finished"] == run["orders"] == 5
        assert run["failed"] == 0 and run["workflows_per_s"] > 0
        assert {"hosts", "azurite", "broker", "fakes"} <= run["cpu_ms"].keys()
        assert run["executions_per_order"] >= 3
    counted = doc["requests_per_order"]
    for workflow in ("single_step", "order"):
        assert counted[workflow]["table_requests"] > 0
        assert counted[workflow]["servicebus_sends"] > 0
        assert doc["usd_per_million_orders"][workflow]["total"] > 0
    # three remote calls cost more than one
    assert counted["order"]["servicebus_sends"] > counted["single_step"]["servicebus_sends"]
    assert all(row["ours_over_dbos"]["workflows_per_s"] is None for row in doc["summary"])


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(
    peers._dbos_version(peers.DBOS_VENV / "bin" / "python") is None,
    reason="DBOS's environment is not installed (python -m benchmarks.peers makes it)",
)
def test_dbos_side_at_a_tiny_size(tmp_path: Path) -> None:
    doc = run_benchmark(tmp_path, "--side", "dbos", "--workflow", "order", *TINY)
    assert doc["dbos_version"].startswith("3.")
    for run in doc["runs"]:
        assert run["side"] == "dbos" and run["finished"] == run["orders"] == 5
        assert run["failed"] == 0 and run["cpu_ms"]["dbos"] > 0
    assert doc["requests_per_order"] == {}
