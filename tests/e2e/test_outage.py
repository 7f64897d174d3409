"""A remote service down while orders wait on it: once it is back every order ends Processed,
none fails (an open circuit defers a step without counting a failure; benchmarks/outage.py,
small)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from devstack.stack.processes import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]


def test_an_outage_delays_orders_but_fails_none(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.outage",
            "--orders",
            "40",
            "--outage-seconds",
            "15",
            "--timeout",
            "240",
            "--workdir",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    report = json.loads(result.stdout)
    assert report["states"] == {"Processed": 40}, report["examples"]
    assert report["invariants"] == dict.fromkeys(report["invariants"], 0), report["examples"]
    assert result.returncode == 0, result.stderr[-2000:]
