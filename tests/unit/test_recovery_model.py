"""The mass-stall model (benchmarks.recovery_model): its hand-out paces itself as the tick does
(service.hand_out.allowance), its limits are the published ones, and it calibrates on what
benchmarks.mass_stall measured. A model, so these check its arithmetic, not Azure."""

from __future__ import annotations

import pytest

from benchmarks import recovery_model as model
from service import hand_out

PERIOD_S = model.PRODUCTION_PERIOD_S


def test_a_fleet_faster_than_the_hand_out_drains_at_the_pace_the_hand_out_doubles():
    first = 16 * hand_out.first_hand_out(PERIOD_S)  # 3,840 rows at 15 s
    handed = [first * 2**n for n in range(5)]  # the fleet moves on all it is given
    assert sum(handed[:4]) < 100_000 <= sum(handed)
    fast = 1e9
    # the first tick half a period after the stall, then four more a period apart
    assert model.drain_s(100_000, fast, PERIOD_S) == pytest.approx(PERIOD_S / 2 + 4 * PERIOD_S)


def test_a_fleet_slower_than_the_hand_out_drains_at_its_own_rate():
    for rate in (50.0, 180.0, 900.0):
        took = model.drain_s(100_000, rate, PERIOD_S)
        assert 100_000 / rate + PERIOD_S / 2 <= took <= 100_000 / rate + 3 * PERIOD_S


def test_more_instances_never_drain_slower():
    summary = {"1": calibrated_run()}
    calibration = model.calibrate(summary)
    assert calibration is not None
    rows = model.report(calibration, orders=(100_000,))["standard"]
    times = [row["drain_s"]["100000"] for row in rows]
    assert times == sorted(times, reverse=True)
    assert rows[0]["binds"] == model.CPU  # one instance: its core
    assert rows[-1]["binds"] != model.CPU  # a hundred: a published limit


def test_the_limits_are_the_published_ones_per_recovery():
    calibration = model.calibrate({"1": calibrated_run()})
    assert calibration is not None
    found = {limit.name: limit.per_s for limit in model.limits(calibration, 1, PERIOD_S)}
    per_message = hand_out.rows_per_message(PERIOD_S)
    assert found["Table account"] == pytest.approx(20_000 / (2 + 3 / per_message))
    assert found["Service Bus Standard credits"] == pytest.approx(1_000 / (1 + 3 / per_message))
    assert found["Table partition (index buckets)"] == pytest.approx(16 * 2_000 / 3)


def test_no_run_that_recovered_every_order_is_nothing_to_calibrate_on():
    assert model.calibrate({"1": {"runs": 0}}) is None
    assert model.report(None)["calibration"] is None


def calibrated_run() -> dict[str, object]:
    """A mass_stall summary for one host, as it prints it."""
    return {
        "runs": 3,
        "host_cpu_ms_per_recovery": 5.0,
        "recoveries_per_s_per_host": 80.0,
        "operations_per_recovery": {"table.query": 0.2, "servicebus.send": 1.1},
        "tick_s_per_message": 0.01,
    }
