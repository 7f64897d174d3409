"""Hosts killed at random (SIGKILL) while orders flow through flaky services: the invariants
of DESIGN.md still hold (the chaos run in benchmarks/chaos.py, small)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from devstack.stack.processes import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(480)]


def test_killing_hosts_breaks_no_invariant(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.chaos",
            "--orders",
            "40",
            "--kill-min",
            "6",
            "--kill-max",
            "9",
            "--lock-seconds",
            "20",  # a killed host's messages come back in seconds, not the config's minute
            "--timeout",
            "300",
            "--workdir",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=450,
    )
    report = json.loads(result.stdout)
    assert report["kills"] >= 1, "the run must actually kill hosts"
    assert sum(report["states"].values()) == 40
    assert report["invariants"] == dict.fromkeys(report["invariants"], 0), report["examples"]
    assert report["max_stall_s"] <= report["stall_bound_s"]
    assert report["compensation_incomplete"] == 0, "no fake service refuses an undo"
    for direction in ("forward", "undo"):
        split = report["failed_attempts"][direction]
        assert set(split) <= {"at_service", "on_our_side", "unanswered"}, split
    assert report["failure_threshold_orders"]["total"] >= 0
    assert result.returncode == 0, result.stderr[-2000:]
