"""The nemeses beyond a kill, at a small scale: the chaos run (benchmarks/chaos.py) does what
each nemesis says, records it, and every invariant of DESIGN.md still holds. test_chaos.py is
the kill's.

``pause``, ``storage`` and ``broker`` share one run: each stack start, settle and check is paid
once, and each nemesis's own assertions are read off the run's record of what it did
(``nemeses.counts``, ``nemeses.events``). ``skew`` runs alone: it widens the run's recovery and
stall bounds by the spread of the clocks, which would loosen them for the others."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from devstack.faults import clock
from devstack.stack.processes import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


LOCK_S = 20
"""The stack's message locks in these runs: short, so that what waits out a lost lock (a paused
host's messages, a dropped connection's) waits seconds, not the entity config's minute."""


def chaos(tmp_path, nemeses: str, *extra: str, orders: int = 30) -> dict:
    argv = [sys.executable, "-m", "benchmarks.chaos", "--nemesis", nemeses]
    argv += ["--lock-seconds", str(LOCK_S)]
    argv += ["--orders", str(orders), "--timeout", "400", "--workdir", str(tmp_path), *extra]
    result = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=560)
    assert result.stdout, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["nemeses"]["chosen"] == nemeses.split(",")
    assert sum(report["states"].values()) == orders
    assert report["invariants"] == dict.fromkeys(report["invariants"], 0), report["examples"]
    assert result.returncode == 0, result.stderr[-3000:]
    return report


def test_a_paused_host_ambiguous_storage_and_broker_restarts_break_no_invariant(tmp_path):
    rates = "throttle=0.05,timeout=0.01,error=0.03,reset=0.03"
    # 60 orders: long enough for a broker restart, then a connection reset.
    report = chaos(tmp_path, "pause,storage,broker", "--storage-rates", rates, orders=60)
    counts = report["nemeses"]["counts"]
    events = report["nemeses"]["events"]

    # pause: a host paused past its locks and leases, and no host killed.
    assert counts["pauses"] >= 1 and counts["kills"] == 0
    pause = next(e for e in events if e["nemesis"] == "pause")
    assert pause["end_s"] - pause["start_s"] >= counts["pause_s"] > LOCK_S, "past the locks"

    # storage: throttled, and at least one applied write hidden from the host that made it.
    faults = counts["storage_faults"]["faults"]
    assert faults.get("throttle", 0) >= 1, faults
    hidden = sum(faults.get(kind, 0) for kind in ("error_after_apply", "timeout_after_apply"))
    assert hidden + faults.get("reset_after_apply", 0) >= 1, (
        f"no applied write was hidden: {faults}"
    )

    # broker: restarted (a new broker process each time) and its connections dropped.
    assert counts["broker_restarts"] >= 1 and counts["broker_connection_resets"] >= 1, counts
    assert report["locks"]["broker"]["broker_processes"] == counts["broker_restarts"] + 1


@pytest.mark.skipif(
    clock.library() is None, reason=f"datefudge is not installed: {clock.INSTALL_HINT}"
)
def test_hosts_whose_clocks_disagree_by_up_to_the_tolerance_break_no_invariant(tmp_path):
    """The run-level check of the tolerated skew; what fails without the tolerance is shown
    in memory, where the World drifts the Supervisor's clock on every step
    (tests/unit/test_skew_tolerance.py): at this scale an order rarely falls in the window."""
    report = chaos(tmp_path, "skew", "--skew-max", "9")
    skewed = report["nemeses"]["counts"]["skewed_hosts"]
    assert len(skewed) == 2 and all(abs(offset) <= 9 for offset in skewed.values()), skewed
    assert any(offset > 0 for offset in skewed.values()), "one host runs ahead"
    assert any(offset < 0 for offset in skewed.values()), "one host runs behind"
    assert report["early_recoveries"]["count"] == 0, report["early_recoveries"]
