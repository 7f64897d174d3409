"""The dead-letter log offline (adapters.store.dead_letter_log's rows, read back into the API's
view by service.operations.dead_letter_log): rows round-trip, and a damaged row or outcome hides
nothing else (the operator still sees every other action)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.store.dead_letter_log import DeadLetterLog, from_entity, to_entity
from service.operations.dead_letter_log import to_view
from service.operations.models import DeadLetterOutcome

pytestmark = pytest.mark.anyio

AT = datetime(2026, 11, 24, 7, 0, tzinfo=UTC)


def outcome(n: int, what: str = "purged") -> DeadLetterOutcome:
    return DeadLetterOutcome(
        sequence_number=n,
        message_id=f"m-{n}",
        order_id=f"o-{n}",
        outcome=what,
        detail="",
        recorded_in_timeline=False,
    )


class OnePage:
    """The part of adapters.tables.Table that DeadLetterLog.recent uses."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def query_entities(self, *_: Any, **__: Any) -> OnePage:
        return self

    async def by_page(self) -> AsyncIterator[list[dict[str, Any]]]:
        yield self.rows


def test_a_row_reads_back_with_its_messages_counted_by_outcome() -> None:
    row = to_entity(
        AT, "ops@x", "purge", "orders", "malformed", [outcome(1), outcome(2, "refused")]
    )
    view = to_view(from_entity(row))
    assert (view.actor, view.action, view.queue, view.reason) == (
        "ops@x", "purge", "orders", "malformed",
    )  # fmt: skip
    assert view.messages == 2 and view.counts == {"purged": 1, "refused": 1}
    assert not view.truncated


@given(st.text(max_size=200))
def test_outcomes_that_do_not_read_are_left_out_and_said(stored: str) -> None:
    row = to_entity(AT, "ops@x", "replay", "orders", "why", [outcome(1)])
    row["Outcomes"] = stored
    view = to_view(from_entity(row))
    if view.messages == 0 and stored not in ("", "[]"):
        assert view.truncated


def test_a_damaged_message_in_the_list_is_left_out_and_the_rest_kept() -> None:
    row = to_entity(AT, "ops@x", "purge", "orders", "why", [outcome(1), outcome(2)])
    row["Outcomes"] = row["Outcomes"][:-1] + ',{"sequence_number":"not a number"},7]'
    view = to_view(from_entity(row))
    assert view.messages == 2 and view.truncated


async def test_a_damaged_row_hides_no_other_action() -> None:
    newer = to_entity(AT, "ops@x", "purge", "orders", "newer", [outcome(1)])
    older = to_entity(AT - timedelta(hours=1), "ops@x", "replay", "orders", "older", [])
    damaged = {"PartitionKey": "~deadletters", "RowKey": "0", "Outcomes": "[]"}  # no At, Actor
    found = await DeadLetterLog(OnePage([newer, damaged, older])).recent(10)  # type: ignore[arg-type]
    assert [a.reason for a in found] == ["newer", "older"]
