"""The one-command demo, as a user runs it, under the chaotic fault profile (quick mode).

It starts its own stack (Azurite, broker, fake services, two function hosts as processes),
submits orders, and must end with every order Processed or Error, exactly one terminal alert for
every Error order (and none for the others), no remote effect applied twice for one idempotency
key, no undo that reversed nothing, and no effect of an Error order left in place unless its
compensation is incomplete (which its record and a critical alert say).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from devstack.stack.processes import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]


def test_quick_demo_under_chaos_ends_with_every_order_accounted_for(tmp_path):
    summary_path = tmp_path / "summary.json"
    result = subprocess.run(
        [
            sys.executable, "-m", "orderctl.cli", "demo",
            "--quick", "--profile", "chaotic", "--orders", "24", "--hosts", "2",
            "--timeout", "300", "--workdir", str(tmp_path / "stack"),
            "--json", str(summary_path),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["all_terminal"] is True
    assert summary["processed"] + summary["errors"] == 24
    assert summary["errors_with_one_terminal_alert"] == summary["errors"], summary["examples"]
    assert summary["wrong_terminal_alerts"] == 0, summary["examples"]
    assert summary["one_terminal_alert_per_error"] is True
    assert summary["duplicated_effects"] == 0
    assert summary["undo_without_do"] == 0, summary["examples"]
    assert (
        summary["effects_left_after_compensation"]
        == summary["effects_left_by_incomplete_compensation"]
    ), summary["examples"]
    assert summary["operations_per_order"]["table.get"] > 0
    # How soon the summary follows the last order is reported (a time, so not asserted: over
    # 24 orders a read per order would cost well under a second either way).
    assert summary["summary_delay_s"] is not None and summary["summary_delay_s"] > 0
    assert "summary" in result.stdout
    assert "undo without a do" in result.stdout
    assert "effects left after compensation" in result.stdout
    assert "summary after the last order" in result.stdout
