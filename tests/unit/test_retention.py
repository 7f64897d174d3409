"""Retention's pure decisions (domain.retention) and the archive's line format
(adapters.archive)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import archive
from adapters.archive import ArchivedOrder
from devstack.memory import MemoryArchive
from domain.events import Context
from domain.lifecycle import submit
from domain.messages import OrderSubmitted
from domain.order import TERMINAL_ALERT_REASONS, Failures, Order, TimelineEntry
from domain.retention import (
    ACK_EVENT,
    MAX_BATCH,
    PURGEABLE_STATES,
    Verdict,
    ack_detail,
    acked_reason,
    delete_plan,
    error_resolved,
    verdict,
)
from domain.states import ProcessState
from domain.workflows import WORKFLOWS, resolve
from tests.support.archive import archived_on

pytestmark = pytest.mark.anyio

NOW = datetime(2025, 9, 1, 3, 0, tzinfo=UTC)
E = ProcessState.ERROR


def entry(seq: int, event: str, from_state, to_state, detail: str = "") -> TimelineEntry:
    return TimelineEntry(seq, NOW, "scheduler-1", event, from_state, to_state, None, 0, detail)


def ack(seq: int, reason: str = "step_declined") -> TimelineEntry:
    return entry(seq, ACK_EVENT, E, E, ack_detail(7, "error", reason))


def an_order(state: ProcessState, updated_at: datetime) -> Order:
    submitted = OrderSubmitted(
        order_id="o-1",
        customer_id="c-1",
        items=[{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 100}],
        currency="EUR",
        submitted_at=updated_at,
    )
    context = Context(workflow=resolve(WORKFLOWS, "order"), now=updated_at, actor="scheduler-1")
    created = submit(submitted, context).order
    assert created is not None
    return dataclasses.replace(created, state=state, updated_at=updated_at)


ERRORED = [
    entry(0, "created", None, ProcessState.PROCESSING),
    entry(1, "error", ProcessState.PROCESSING, E),
]


# --------------------------------------------------------------------- resolved Error


def test_an_error_is_resolved_by_acknowledging_its_terminal_alert_after_it_entered_error():
    assert not error_resolved(ERRORED)
    assert error_resolved([*ERRORED, ack(2)])
    for reason in TERMINAL_ALERT_REASONS:
        assert error_resolved([*ERRORED, ack(2, reason)])
    assert not error_resolved([*ERRORED, ack(2, "duplicate_order_id")]), "another alert"
    assert not error_resolved([*ERRORED, entry(2, ACK_EVENT, E, E, "free text")])


def test_an_acknowledgement_before_the_order_last_entered_error_does_not_count():
    again = [
        *ERRORED,
        ack(2),
        entry(3, "resubmitted", E, ProcessState.PROCESSING),
        entry(4, "error", ProcessState.PROCESSING, E),
    ]
    assert not error_resolved(again)
    assert error_resolved([*again, entry(5, "late_effect", E, E), ack(6)])


def test_ack_detail_round_trips():
    assert acked_reason(ack(3, "failure_threshold")) == "failure_threshold"
    assert acked_reason(entry(3, "note", E, E, ack_detail(1, "error", "cancelled"))) is None


# ------------------------------------------------------------------------------ verdict

ages = st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=400))
states = st.sampled_from(list(ProcessState))


@settings(max_examples=300, deadline=None)
@given(
    state=states,
    age=ages,
    older_than=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=100)),
    acked=st.booleans(),
    index_row=st.booleans(),
    selected=st.sets(st.sampled_from(PURGEABLE_STATES), min_size=1),
)
def test_verdict_purges_exactly_the_old_finished_resolved_orders_that_owe_nothing(
    state, age, older_than, acked, index_row, selected
):
    order = an_order(state, NOW - age)
    timeline = [*ERRORED, ack(2)] if acked else ERRORED
    decided = verdict(
        order, timeline, now=NOW, older_than=older_than, states=selected, index_row=index_row
    )
    purgeable = (
        state in selected
        and age > older_than
        and (state is ProcessState.PROCESSED or acked)
        and not index_row
    )
    assert (decided is Verdict.PURGE) == purgeable
    if state.in_flight:
        assert decided is Verdict.IN_FLIGHT, "never an order in flight, whatever else holds"


# --------------------------------------------------------------------------- delete plan


@settings(max_examples=200, deadline=None)
@given(n=st.integers(min_value=0, max_value=1200), batch=st.integers(min_value=4, max_value=100))
def test_the_delete_plan_covers_every_row_once_in_transactions_that_fit(n, batch):
    others = [f"timeline-{i:08d}" for i in range(n)]
    plan = delete_plan("process", "details", others, batch)

    transactions = [plan.first, *plan.middle] + ([plan.last] if plan.last else [])
    deleted = [row for t in transactions for row in t]
    assert sorted(deleted) == sorted(["process", "details", *others]), "each row exactly once"
    assert plan.first[0] == "process", "the conditional delete decides, first"
    assert plan.atomic == (n + 2 <= batch)
    if plan.atomic:
        assert len(plan.first) <= batch
    else:
        # The first also creates the marker; the last also deletes it.
        assert len(plan.first) + 1 <= batch
        assert all(len(t) <= batch for t in plan.middle)
        assert len(plan.last) + 1 <= batch and plan.last[-1] == "details"


def test_a_three_step_order_is_purged_in_one_transaction():
    plan = delete_plan("process", "details", [f"timeline-{i:08d}" for i in range(12)])
    assert plan.atomic
    two = delete_plan("process", "details", ["t"] * (MAX_BATCH - 1))
    assert not two.atomic and not two.middle, "a first and a last transaction"


# ------------------------------------------------------------------------ archive lines


def archived(order_id: str, seq: int, at: datetime) -> ArchivedOrder:
    order = dataclasses.replace(an_order(ProcessState.PROCESSED, at), timeline_seq=seq)
    order = dataclasses.replace(order, order_id=order_id)
    submitted = OrderSubmitted(
        order_id=order_id,
        customer_id="c-1",
        items=[{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 100}],
        currency="EUR",
        submitted_at=at,
    )
    timeline = tuple(entry(i, "note", None, ProcessState.PROCESSED, 'é\n"x"') for i in range(3))
    digest = submitted.content_hash()
    return ArchivedOrder(order_id, at, "run-1", submitted, digest, order, timeline)


def test_an_archive_line_round_trips_and_is_one_line():
    record = archived("o-1", 2, NOW)
    line = archive.encode(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert line.startswith(b'{"order_id":"o-1",')
    assert archive.decode(line.rstrip(b"\n")) == record


def test_an_archive_line_keeps_the_compensation_and_reads_lines_from_before_it():
    record = archived("o-1", 2, NOW)
    compensated = dataclasses.replace(
        record.process,
        state=ProcessState.ERROR,
        compensation_started_at=NOW - timedelta(hours=1),
        compensation_warned=True,
        steps=tuple(
            dataclasses.replace(step, undo_failures=Failures(on_our_side=2, unanswered=(5,)))
            for step in record.process.steps
        ),
    )
    record = dataclasses.replace(record, process=compensated)
    assert archive.decode(archive.encode(record).rstrip(b"\n")) == record
    older = json.loads(archive.encode(record))
    for name in ("compensation_started_at", "compensation_warned"):
        del older["process"][name]
    for step in older["process"]["steps"]:
        del step["failed"]
    read = archive.decode(json.dumps(older).encode())
    assert read.process.compensation_started_at is None
    assert not read.process.compensation_warned
    assert all(step.undo_failures == Failures() for step in read.process.steps)


def test_unreadable_lines_are_refused_with_the_reason():
    with pytest.raises(archive.ArchiveError, match="unknown archive format"):
        archive.decode(b'{"order_id":"o-1","format":99}')
    with pytest.raises(archive.ArchiveError, match="unreadable"):
        archive.decode(b"not json")


async def test_readers_keep_the_latest_copy_of_each_order():
    store = MemoryArchive()
    day = NOW.date()
    stale = archived("o-1", 2, NOW)
    newer = archived("o-1", 5, NOW + timedelta(hours=1))
    await store.append(day, [stale, archived("o-2", 1, NOW)])
    await store.append(day, [newer])
    await store.append(day, [dataclasses.replace(stale, archived_at=NOW + timedelta(hours=2))])

    assert await archive.find(store, "o-1") == newer
    assert len(await archive.find_all(store, "o-1")) == 3
    assert {r.order_id: r.process.timeline_seq for r in await archived_on(store, day)} == {
        "o-1": 5,
        "o-2": 1,
    }
    assert await archive.find(store, "o-3") is None
    assert await archive.find(store, "o-1", day=day - timedelta(days=1)) is None
