"""Running a benchmark as its user does (``python -m benchmarks.<name> ...`` from the repository
root) and reading the one JSON document it prints: for smoke tests of the benchmarks."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from devstack.stack.processes import REPO_ROOT


def benchmark_report(module: str, *args: str, timeout: float) -> dict[str, Any]:
    """The report of ``python -m module args``; the test fails, with the benchmark's stderr,
    when it exits with an error, and with its stdout when that is not one JSON document."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"benchmark failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        pytest.fail(f"stdout is not one JSON document ({exc}):\n{proc.stdout[:2000]}")
