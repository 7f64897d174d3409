"""The tolerated clock skew (``CLOCK_SKEW_TOLERANCE_SECONDS``): a time one host stamped is acted
on by another only once the other's clock is past it by more than the tolerance, so a host whose
clock runs ahead by up to that much never recovers an order early, and the recovery bound counts
the wait. (Bucket leases need no tolerance: a Supervisor that takes a bucket early because its
clock runs ahead only sweeps beside the holder, and every recovery is a write conditional on the
order's ETag, so one of two recovers an order, never both.)

What failed before it (the chaos run's ``skew`` nemesis, hosts 8 s ahead and 9 s behind): a
Supervisor ahead of the host that released an order found it "Pending with no progress" 17 s
early and released it again, a failure that did not happen."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from adapters.settings import CLOCK_SKEW_SETTING, Settings, SettingsError
from domain.events import DEFAULT_FLUSH_GRACE, DEFAULT_STALE_AFTER, Replied, Swept
from domain.lifecycle import decide, due_at
from service.operations.supervisor import recovery_bound
from tests.support.world import World, order_id
from tests.unit.test_lifecycle import T0, answer, apply, ctx, new_order, request_of
from tests.unit.test_settings import env
from tests.unit.test_supervisor_leases import SETTINGS

SKEW = timedelta(seconds=10)
pytestmark = pytest.mark.anyio


def sweep_at(order, at: float, skew: timedelta = SKEW):  # type: ignore[no-untyped-def]
    return decide(order, Swept(), replace(ctx(at, actor="supervisor:s"), skew=skew))


def test_an_order_in_flight_is_recovered_only_past_its_deadline_and_the_skew():
    order = new_order()
    assert order.complete_by is not None
    deadline = (order.complete_by - T0).total_seconds()
    ahead = sweep_at(order, deadline + 9)  # a Supervisor 9 s ahead: not late in real time
    assert ahead.order is None and ahead.note == "in flight, within its deadline"
    late = sweep_at(order, deadline + 11)
    assert late.entry is not None and late.entry.event == "released"
    assert sweep_at(order, deadline + 1, skew=timedelta(0)).entry is not None  # no tolerance


def test_a_released_order_is_stale_only_past_its_stale_time_and_the_skew():
    order = new_order()
    released = apply(order, decide(order, Replied(answer(request_of(order), "transient")), ctx(1)))
    assert released.next_attempt_at is not None
    since = (released.next_attempt_at - T0).total_seconds()
    stale = DEFAULT_STALE_AFTER.total_seconds()
    waiting = sweep_at(released, since + stale / 2 + 9)
    assert waiting.send == () and waiting.note == "waiting for its retry"
    overdue = sweep_at(released, since + stale + 9)  # resent, not counted as a failure
    assert overdue.order is None and overdue.send
    assert sweep_at(released, since + stale + 11).entry is not None


def test_the_index_row_is_due_when_the_supervisor_may_act():
    order = new_order()
    assert order.complete_by is not None
    assert due_at(order, DEFAULT_STALE_AFTER, DEFAULT_FLUSH_GRACE, SKEW) == (
        order.complete_by + SKEW
    )


def test_the_recovery_bound_counts_the_skew():
    tolerant = replace(SETTINGS, clock_skew=SKEW)
    strict = replace(SETTINGS, clock_skew=timedelta(0))
    assert recovery_bound(tolerant).detection_s == recovery_bound(strict).detection_s + 10
    assert recovery_bound(tolerant).skew_s == 10


def test_the_tolerance_is_a_setting_and_a_clock_too_far_off_is_refused():
    assert Settings.from_env(env(**{CLOCK_SKEW_SETTING: None})).clock_skew == SKEW
    assert Settings.from_env(env(**{CLOCK_SKEW_SETTING: "2.5"})).clock_skew == timedelta(
        seconds=2.5
    )
    assert Settings.from_env(env(**{CLOCK_SKEW_SETTING: "0"})).clock_skew == timedelta(0)
    with pytest.raises(SettingsError, match=r"CLOCK_SKEW_TOLERANCE_SECONDS must be at most 300"):
        Settings.from_env(env(**{CLOCK_SKEW_SETTING: "301"}))
    with pytest.raises(SettingsError, match=r"CLOCK_SKEW_TOLERANCE_SECONDS must be zero or more"):
        Settings.from_env(env(**{CLOCK_SKEW_SETTING: "-1"}))


async def test_a_supervisor_whose_clock_runs_ahead_recovers_nothing_early():
    """The world's Supervisor, 8 s ahead, ticks 5 s before the order's deadline (3 s past it on
    its own clock): it must leave the order alone, and recover it once it is late for real."""
    world = World()
    await world.submit(order_id(0))
    order = await world.store.load(order_id(0))
    assert order.complete_by is not None
    world.supervisor_offset = timedelta(seconds=8)
    world.now = order.complete_by - timedelta(seconds=5)
    await world.tick()
    assert (await world.store.load(order_id(0))).timeline_seq == order.timeline_seq
    world.now = order.complete_by + timedelta(seconds=3)  # 11 s past it on the Supervisor's
    await world.tick()
    assert (await world.store.load(order_id(0))).failure_count == 1
