"""The broker throughput benchmark runs end to end and reports what it claims (no timing
assertions: the numbers depend on the machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.broker_throughput import QUICK_MESSAGES, SCENARIOS, STORAGES

REPO_ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick_run() -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.broker_throughput", "--quick"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, f"benchmark failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        pytest.fail(f"stdout is not one JSON document ({exc}):\n{proc.stdout[:2000]}")


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
