"""The Supervisor scale benchmark runs with tiny numbers on the in-memory store and reports what
it claims: every order released, the killed instance's buckets taken over within the bound."""

from __future__ import annotations

import json

import pytest

from benchmarks import supervisor_scale

pytestmark = pytest.mark.slow  # a few seconds of wall-clock ticking


def test_two_instances_one_killed_in_memory(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--store=memory",
        "--instances=2",
        "--orders=40",
        "--period=1",
        "--warmup-periods=2",
        "--window-periods=2",
        "--kill",
    ]
    assert supervisor_scale.main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    (run,) = document["runs"]
    assert run["instances"] == 2
    assert run["released"] == run["orders"] == 40
    assert run["latency_s"]["count"] == 40
    kill = run["kill"]
    victim = kill["victim"]
    (survivor,) = set(run["per_instance"]) - {victim}
    assert run["per_instance"][victim]["died_at_s"] is not None
    assert run["roster_at_end"]["holders"] == {survivor: 16}
    assert kill["orders_taken_over"] > 0 and kill["not_released"] == 0
    assert set(kill["taken_over_by"]) == {survivor}
    assert kill["within_bound"], kill


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert supervisor_scale.percentile(values, 0.5) == 50.0
    assert supervisor_scale.percentile(values, 0.95) == 95.0
    assert supervisor_scale.percentile([], 0.5) is None


def test_next_grid_is_strictly_after() -> None:
    assert supervisor_scale.next_grid(10.0, 2.0) == 12.0
    assert supervisor_scale.next_grid(11.9, 2.0) == 12.0
