"""The broker throughput and history benchmarks run end to end, with small counts, and report
what they claim (no timing assertions: the numbers depend on the machine)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.broker_throughput import QUICK_MESSAGES, SCENARIOS, STORAGES
from tests.support.benchmark_runs import benchmark_report

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick_run() -> dict[str, Any]:
    return benchmark_report("benchmarks.broker_throughput", "--quick", timeout=110)


def test_reports_every_scenario_in_memory_and_on_disk(quick_run: dict[str, Any]) -> None:
    expected = {f"{scenario}-{storage}" for scenario in SCENARIOS for storage in STORAGES}
    assert set(quick_run["results"]) == expected
    assert quick_run["quick"] is True
    assert quick_run["sdk"].startswith("azure-servicebus ")


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("storage", STORAGES)
def test_result_is_consistent(quick_run: dict[str, Any], scenario: str, storage: str) -> None:
    result = quick_run["results"][f"{scenario}-{storage}"]
    assert result["scenario"] == scenario and result["storage"] == storage
    assert result["messages"] == QUICK_MESSAGES[scenario]
    assert result["received"] == result["messages"], "every message came back exactly once"
    assert result["seconds"] > 0
    assert result["msg_per_s"] > 0
    assert result["msg_per_s"] == pytest.approx(result["received"] / result["seconds"], rel=0.01)
    assert result["broker_cpu_s"] >= 0 and result["client_cpu_s"] >= 0
    if scenario == "competing":
        assert result["send_seconds"] > 0


HISTORY_ARGS = ["--orders", "30", "--rate", "15", "--history", "400", "--warmup", "5"]


@pytest.fixture(scope="module")
def history_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("history")
    args = [*HISTORY_ARGS, "--workdir", str(workdir)]
    return benchmark_report("benchmarks.history", *args, timeout=300)


@pytest.mark.timeout(320)
def test_history_runs_the_same_load_before_and_after_the_fill(history_run: dict[str, Any]) -> None:
    assert history_run["history"] == 400 and history_run["orders"] == 30
    assert history_run["fill"]["orders"] == 400
    # single_step: details, process and two timeline rows per finished order
    assert history_run["fill"]["rows"] == 4 * 400
    for phase in ("empty", "full"):
        result = history_run[phase]
        assert result["finished"] == result["orders"] == 30 and result["not_finished"] == 0
        assert result["orders_per_s"] == pytest.approx(30 / result["seconds"], rel=0.05)
        latency = result["latency_s"]
        assert 0 < latency["p50"] <= latency["p99"] <= latency["max"]
        # The hosts counted every order's requests (5 Table requests per single_step order,
        # plus the Supervisor's ticks).
        assert result["operations_per_order"]["table.delete"] >= 1
        assert result["cpu_ms_per_order"]["azurite"] > 0
    ratio = history_run["full"]["orders_per_s"] / history_run["empty"]["orders_per_s"]
    assert history_run["throughput_ratio"] == pytest.approx(ratio, abs=0.001)
    assert history_run["within_10_percent"] is (ratio >= 0.9)


@pytest.mark.timeout(200)
def test_operator_reads_reports_each_time_beside_its_target() -> None:
    args = ["--rounds", "2", "--history", "30"]
    report = benchmark_report("benchmarks.operator_reads", *args, timeout=180)
    dead_letters = report["dead_letters"]
    assert dead_letters["queues"] == 7 and len(dead_letters["warm_s"]) == 2
    assert dead_letters["cold_s"] > 0 and all(t > 0 for t in dead_letters["warm_s"])
    assert report["history"]["orders"] == 30
    assert sum(report["summary"]["table_requests"].values()) == 5
    assert set(report["met"]) == set(report["targets_s"])
    assert report["within_targets"] is all(report["met"].values())
