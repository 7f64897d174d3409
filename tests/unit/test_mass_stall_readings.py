"""The readings benchmarks.mass_stall takes of a drain: the machine's share of busy cores (what
says the cores limit it) and where a host's sampled time went."""

from __future__ import annotations

import os

import pytest

from benchmarks.mass_stall import machine_cpu, machine_share, profile_summary


def test_the_busy_share_is_of_every_core_and_ours_of_the_wall_time_of_all_cores():
    cores = os.cpu_count() or 1
    before, after = (100.0, 400.0, 10.0), (160.0, 480.0, 20.0)  # busy, total CPU s, monotonic
    share = machine_share(before, after, ours_s=5.0 * cores)
    assert share == {"busy": 0.75, "ours": 0.5}


def test_a_reading_of_the_machine_moves_forward():
    first, second = machine_cpu(), machine_cpu()
    assert 0 <= first[0] <= first[1] and second[1] >= first[1] and second[2] >= first[2]


def test_samples_count_by_the_innermost_frame_of_ours_or_a_librarys():
    raw = "\n".join(
        [
            "main (x.py:1);recover (service/recovery.py:9);send (azure/servicebus/a.py:3) 6",
            "main (x.py:1);decide (domain/lifecycle.py:5) 3",
            "main (x.py:1);sleep (nowhere.py:2) 1",
            "garbage",
        ]
    )
    summary = profile_summary(raw)
    assert summary["samples"] == 10
    assert summary["by_area"] == pytest.approx(
        {"Service Bus SDK": 0.6, "domain": 0.3, "other": 0.1}
    )
    assert profile_summary("") == {"samples": 0}
