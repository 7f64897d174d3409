"""Following an order until it is done (status --watch, submit --wait), over a fake watch."""

from __future__ import annotations

import pytest

from orderctl.follow import EXIT_ERROR, EXIT_PROCESSED, EXIT_TIMEOUT, exit_code, follow
from service.operations.errors import NotFound
from service.operations.models import WatchView
from tests.unit.cli_views import order_detail

pytestmark = pytest.mark.anyio


def view(state: str, seqs: list[int], *, terminal: bool, more: bool = False) -> WatchView:
    detail = order_detail("x")
    timeline = [detail.timeline[0].model_copy(update={"seq": seq}) for seq in seqs]
    detail = detail.model_copy(
        update={
            "order": detail.order.model_copy(update={"state": state}),
            "timeline": timeline,
            "timeline_continuation": seqs[-1] if more else None,
        }
    )
    return WatchView(changed=bool(seqs), terminal=terminal, detail=detail)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def scripted(answers: list, clock: Clock):
    asked: list[tuple[int, float]] = []

    async def watch(after: int, wait_s: float) -> WatchView:
        asked.append((after, wait_s))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if not answer.changed:
            await clock.sleep(wait_s)
        return answer

    return watch, asked


async def test_each_change_is_shown_once_and_the_next_call_asks_for_what_came_after():
    clock = Clock()
    watch, asked = scripted(
        [
            view("Processing", [0, 1], terminal=False),
            view("Processing", [], terminal=False),
            view("Processed", [2, 3], terminal=True),
        ],
        clock,
    )
    shown: list[list[int]] = []
    followed = await follow(
        watch, lambda v: shown.append([t.seq for t in v.detail.timeline]), timeout=None,
        clock=clock, sleep=clock.sleep,
    )  # fmt: skip
    assert shown == [[0, 1], [2, 3]]
    assert [after for after, _ in asked] == [-1, 1, 1]
    assert exit_code(followed) == EXIT_PROCESSED


async def test_a_long_timeline_is_read_to_its_end_before_stopping():
    clock = Clock()
    watch, asked = scripted(
        [view("Error", [0, 1], terminal=True, more=True), view("Error", [2], terminal=True)],
        clock,
    )
    followed = await follow(watch, lambda v: None, timeout=None, clock=clock, sleep=clock.sleep)
    assert [after for after, _ in asked] == [-1, 1]
    assert exit_code(followed) == EXIT_ERROR


async def test_the_timeout_ends_the_wait_and_says_so():
    clock = Clock()
    watch, asked = scripted([view("Processing", [0], terminal=False)] + [
        view("Processing", [], terminal=False) for _ in range(5)
    ], clock)  # fmt: skip
    followed = await follow(watch, lambda v: None, timeout=25, clock=clock, sleep=clock.sleep)
    assert followed.timed_out and exit_code(followed) == EXIT_TIMEOUT
    assert [round(wait) for _, wait in asked] == [10, 10, 10, 5], "never past the timeout"


async def test_an_order_not_there_yet_is_waited_for_only_when_asked():
    clock = Clock()
    missing = NotFound("order_not_found", "order o-1 does not exist")
    watch, _ = scripted([missing, view("Processed", [0], terminal=True)], clock)
    followed = await follow(
        watch, lambda v: None, timeout=5, wait_for_creation=True, clock=clock, sleep=clock.sleep
    )
    assert exit_code(followed) == EXIT_PROCESSED
    watch, _ = scripted([missing], clock)
    with pytest.raises(NotFound):
        await follow(watch, lambda v: None, timeout=5, clock=clock, sleep=clock.sleep)
    never, _ = scripted([missing] * 20, clock)
    gone = await follow(
        never, lambda v: None, timeout=5, wait_for_creation=True, clock=clock, sleep=clock.sleep
    )
    assert gone.last is None and exit_code(gone) == EXIT_TIMEOUT
