"""Pure parts of the operator listing: reading filters, matching orders, cursors, the Processed
query, and deriving whether an alert is resolved."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from domain.events import Context
from domain.lifecycle import submit
from domain.messages import OrderSubmitted
from domain.order import Order, TimelineEntry
from domain.states import ProcessState
from domain.workflows import ORDER_WORKFLOW, WORKFLOWS
from service.listing import (
    InvalidCursor,
    OrderFilter,
    _history_query,
    _resume_at,
    decode_cursor,
    decode_sorted_cursor,
    encode_cursor,
    encode_sorted_cursor,
)
from service.operations import filters
from service.operations.alert_resolution import needs_timeline, resolution
from service.operations.errors import InvalidRequest

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)


def order(**changes) -> Order:
    submitted = OrderSubmitted(
        order_id="o-abc",
        customer_id="c-1",
        items=[{"sku": "SKU-1", "quantity": 1, "unit_price_cents": 100}],
        currency="EUR",
    )
    made = submit(submitted, Context(workflow=ORDER_WORKFLOW, now=T0, actor="s:a")).order
    assert made is not None
    return replace(made, **changes)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200), ("7d", 604800), (" 3H ", 10800)],
)
def test_ages_are_read_in_seconds_minutes_hours_or_days(text, seconds):
    assert filters.age_of(text, "older_than") == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["0", "-5m", "yesterday", "1.5h", "2w", "3651d", "1e3"])
def test_an_age_that_is_not_one_says_how_to_write_it(text):
    with pytest.raises(InvalidRequest, match="is not an age like 90s, 15m, 2h or 7d") as refused:
        filters.age_of(text, "older_than")
    assert refused.value.code == "invalid_age"


def test_criteria_turn_ages_into_creation_times_and_check_the_step():
    chosen = filters.criteria(
        now=T0, workflows=WORKFLOWS, step="charge_payment", older_than="1h", text="Card"
    )
    assert chosen.where == OrderFilter(
        step="charge_payment", created_before=T0 - timedelta(hours=1), text="Card"
    )
    assert chosen.shown == {"step": "charge_payment", "older_than": "1h", "text": "Card"}
    with pytest.raises(InvalidRequest, match="no workflow has a step 'teleport'"):
        filters.criteria(now=T0, workflows=WORKFLOWS, step="teleport")
    with pytest.raises(InvalidRequest, match="select nothing"):
        filters.criteria(now=T0, workflows=WORKFLOWS, older_than="2h", newer_than="1h")
    assert filters.criteria(now=T0, workflows=WORKFLOWS).where.empty


def test_a_filter_matches_step_age_and_text_in_id_error_or_reason():
    o = order(last_error="Payment DECLINED: card_declined", compensation_reason=None)
    assert OrderFilter().matches(o)
    assert OrderFilter(step="reserve_inventory").matches(o)
    assert not OrderFilter(step="charge_payment").matches(o)
    assert OrderFilter(created_before=T0 + timedelta(seconds=1)).matches(o)
    assert not OrderFilter(created_before=T0).matches(o)
    assert OrderFilter(created_after=T0 - timedelta(seconds=1)).matches(o)
    assert not OrderFilter(created_after=T0).matches(o)
    assert OrderFilter(text="declined").matches(o)
    assert OrderFilter(text="O-AB").matches(o)
    assert not OrderFilter(text="refund").matches(o)
    assert OrderFilter(text="operator:ann").matches(
        replace(o, compensation_reason="by operator:ann")
    )


def test_cursors_are_refused_for_another_state_or_sort():
    index = encode_cursor(ProcessState.ERROR, ("~error", "o-1.1"))
    assert decode_cursor(index, ProcessState.ERROR) == ("~error", "o-1.1")
    sorted_ = encode_sorted_cursor(ProcessState.ERROR, "-created", ("2026", "o-1"))
    assert decode_sorted_cursor(sorted_, ProcessState.ERROR, "-created") == ("2026", "o-1")
    for bad in (
        lambda: decode_cursor(index, ProcessState.PENDING),
        lambda: decode_cursor(sorted_, ProcessState.ERROR),
        lambda: decode_sorted_cursor(sorted_, ProcessState.ERROR, "created"),
        lambda: decode_sorted_cursor(index, ProcessState.ERROR, "-created"),
        lambda: decode_cursor("not-a-cursor!", ProcessState.ERROR),
    ):
        with pytest.raises(InvalidCursor):
            bad()


def test_the_processed_query_filters_on_the_server_and_goes_on_after_the_last_row():
    where = OrderFilter(step="create_shipment", created_before=T0, text="ignored server side")
    condition, parameters = _history_query(ProcessState.PROCESSED, where, ("o-5", "process"))
    assert condition == (
        "RowKey eq @row and ProcessState eq @state and CurrentStep eq @step and "
        "CreatedAt lt @before and PartitionKey gt @after"
    )
    assert parameters == {
        "row": "process", "state": "Processed", "step": "create_shipment", "before": T0,
        "after": "o-5",
    }  # fmt: skip
    # The service stopped before o-7's process row: go on at o-7, included.
    assert _resume_at({"PartitionKey": "o-7", "RowKey": "details"}) == ("o-7", "")
    assert "PartitionKey ge @after" in _history_query(ProcessState.PROCESSED, where, ("o-7", ""))[0]
    # ...or after it: go on with the next partition.
    assert _resume_at({"PartitionKey": "o-7", "RowKey": "timeline-00000001"}) == ("o-7", "process")


# -------------------------------------------------------------------------------- alerts


def terminal_alert(seq: int = 3, reason: str = "step_declined") -> dict:
    return {"order_id": "o-abc", "reason": reason, "timeline_seq": seq}


def entry(event: str, seq: int) -> TimelineEntry:
    return TimelineEntry(seq, T0, "operator:ann", event, None, ProcessState.PENDING, None, 0, "")


def test_an_alert_is_resolved_once_its_order_is_processed():
    assert resolution(terminal_alert(), order(state=ProcessState.PROCESSED)) == "resolved"


def test_an_alert_is_retrying_while_its_resubmitted_order_is_in_flight():
    assert resolution(terminal_alert(), order(state=ProcessState.PENDING)) == "retrying"


def test_an_alert_whose_order_failed_again_after_a_retry_is_superseded():
    errored = order(state=ProcessState.ERROR, timeline_seq=7)
    alert = terminal_alert(seq=3)
    assert needs_timeline(alert, errored) == 3
    later = [entry("resubmitted", 4), entry("error", 7)]
    assert resolution(alert, errored, later) == "superseded"
    acknowledged_only = [entry("alert_acknowledged", 4)]
    assert resolution(alert, errored, acknowledged_only) == "open"


def test_other_alerts_are_open_until_their_order_is_processed_or_gone():
    still = order(state=ProcessState.ERROR, timeline_seq=3)
    assert needs_timeline(terminal_alert(seq=3), still) is None, "nothing happened since"
    assert resolution(terminal_alert(seq=3), still) == "open"
    assert resolution({"reason": "untrusted_message", "order_id": None}, None) == "open"
    assert resolution(terminal_alert(), None) == "order_gone"
    bad_message = {"order_id": "o-abc", "reason": "bad_message"}
    assert resolution(bad_message, order(state=ProcessState.PENDING)) == "open"
    assert resolution(bad_message, order(state=ProcessState.PROCESSED)) == "resolved"


def test_a_long_compensation_warning_is_open_while_the_order_compensates():
    warning = {"order_id": "o-abc", "reason": "compensation_delayed", "timeline_seq": 5}
    assert resolution(warning, order(state=ProcessState.COMPENSATING)) == "open"
    assert needs_timeline(warning, order(state=ProcessState.ERROR, timeline_seq=9)) is None
    # Ended: in Error it raised its terminal alert, which stands on its own.
    assert resolution(warning, order(state=ProcessState.ERROR)) == "resolved"
    assert resolution(warning, order(state=ProcessState.PENDING)) == "resolved"
