"""The chaos run's status check (benchmarks.chaos.status_problem): what a submitter is owed."""

from __future__ import annotations

from benchmarks.chaos import status_problem
from domain.states import ProcessState

PROCESSED = [(0, "Pending"), (1, "Processing"), (2, "Processing"), (3, "Processed")]


def test_every_update_in_order_one_finishing_and_the_last_saying_the_end_state_passes():
    assert status_problem(PROCESSED, 4, ProcessState.PROCESSED) is None


def test_a_missing_or_late_update_fails():
    assert "received [0, 1, 3]" in status_problem(
        [PROCESSED[0], PROCESSED[1], PROCESSED[3]], 4, ProcessState.PROCESSED
    )
    assert status_problem([PROCESSED[1], PROCESSED[0], *PROCESSED[2:]], 4, ProcessState.PROCESSED)


def test_a_last_update_that_is_not_the_end_state_fails():
    assert "the last says Processing" in status_problem(PROCESSED[:3], 3, ProcessState.PROCESSED)


def test_two_updates_that_say_the_order_finished_fail():
    twice = [*PROCESSED[:2], (2, "Processed"), (3, "Processed")]  # the last step's, then its own
    assert "updates [2, 3] say the order finished" in status_problem(
        twice, 4, ProcessState.PROCESSED
    )
