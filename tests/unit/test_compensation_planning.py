"""Compensation planning, status sequences, listing cursors and step-update merging (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core.order_listing import InvalidCursor, decode_cursor, encode_cursor
from core.state_models import ProcessRecord, StepRecord, StepUpdate
from core.state_store import _merge_step_updates
from core.states import ProcessState, StepState
from core.workflows import ORDER_WORKFLOW
from scheduler.compensation import left_to_undo, plan
from scheduler.status import SLOTS, Status, _update

T0 = datetime(2025, 5, 6, 7, 8, 9, tzinfo=UTC)


def step(index: int, state: StepState) -> StepRecord:
    return StepRecord(
        name=ORDER_WORKFLOW.steps[index].name,
        index=index,
        state=state,
        attempt=1,
        result=None,
        error_code=None,
        error_message=None,
        completed_at=None,
        compensated_at=None,
    )


def names(steps) -> list[str]:
    return [s.name for s in steps]


def test_plan_undoes_completed_steps_latest_first_plus_the_step_in_flight():
    steps = [step(0, StepState.SUCCEEDED), step(1, StepState.SUCCEEDED), step(2, StepState.FAILED)]
    assert names(plan(ORDER_WORKFLOW, steps)) == ["charge_payment", "reserve_inventory"]
    in_flight = [
        step(0, StepState.SUCCEEDED),
        step(1, StepState.PENDING),
        step(2, StepState.PENDING),
    ]
    assert names(plan(ORDER_WORKFLOW, in_flight, ["charge_payment"])) == [
        "charge_payment",
        "reserve_inventory",
    ]
    assert plan(ORDER_WORKFLOW, [step(0, StepState.FAILED)]) == []


def test_left_to_undo_is_what_is_still_marked_latest_first():
    steps = [
        step(0, StepState.COMPENSATING),
        step(1, StepState.COMPENSATED),
        step(2, StepState.COMPENSATING),
    ]
    assert names(left_to_undo(ORDER_WORKFLOW, steps)) == ["create_shipment", "reserve_inventory"]


def process(seq: int) -> ProcessRecord:
    return ProcessRecord(
        order_id="o-1",
        workflow="order",
        state=ProcessState.PROCESSING,
        locked_by="s-1",
        complete_by=T0,
        failure_count=0,
        attempt=2,
        generation=1,
        current_step="charge_payment",
        current_operation="do",
        reply_to="replies",
        last_error=None,
        next_attempt_at=None,
        created_at=T0,
        updated_at=T0,
        timeline_seq=seq,
        write_id="w",
        etag="e",
    )


def test_status_sequences_grow_with_the_timeline_and_never_collide():
    first = [_update(process(3), k, Status("step_completed")).sequence for k in range(SLOTS)]
    later = _update(process(4), 0, Status("step_started")).sequence
    assert first == sorted(first) and len(set(first)) == SLOTS and later > first[-1]


def test_listing_cursors_round_trip_and_refuse_anything_else():
    cursor = encode_cursor(ProcessState.ERROR, ("~error", "o-1.1"))
    assert decode_cursor(cursor, ProcessState.ERROR) == ("~error", "o-1.1")
    for bad in ("", "%%%", "bm90IGpzb24", encode_cursor(ProcessState.PENDING, ("a01", "x.1"))):
        with pytest.raises(InvalidCursor):
            decode_cursor(bad, ProcessState.ERROR)


def test_updates_of_one_step_merge_into_one_write():
    reply = StepUpdate(step="charge_payment", attempt=4, state=StepState.SUCCEEDED, result={"a": 1})
    mark = StepUpdate(step="charge_payment", attempt=None, state=StepState.COMPENSATING)
    other = StepUpdate(step="reserve_inventory", attempt=None, state=StepState.COMPENSATING)
    merged = _merge_step_updates([reply], [mark, other])
    assert [u.step for u in merged] == ["charge_payment", "reserve_inventory"]
    assert (merged[0].state, merged[0].attempt, merged[0].result) == (
        StepState.COMPENSATING,
        4,
        {"a": 1},
    )
    entity = merged[0].to_entity("o-1", 1, T0)
    assert entity["State"] == "Compensating" and "CompletedAt" in entity
    assert "Attempt" not in other.to_entity("o-1", 0, T0)


def test_a_reset_step_update_is_a_fresh_pending_row():
    entity = StepUpdate(step="reserve_inventory", attempt=None, state=None, reset=True).to_entity(
        "o-1", 0, T0
    )
    assert (entity["State"], entity["Attempt"], entity["RowKey"]) == (
        "Pending",
        0,
        "step-00-reserve_inventory",
    )
