"""The order lifecycle explored by Hypothesis: random interleavings of submissions, agent answers
(success, decline, transient, circuit open, lost, late, duplicated, out of order, an undo
refused), validly signed answers to requests the order never asked for (a do never requested,
an undo never requested, a wrong attempt, a wrong operation, a generation not yet reached),
deadlines, Supervisor ticks, cancels, resubmits, restarts, migrations from order@1 to order@2
(and orders on order@2, whose verify_address has nothing to undo), crashes between the write
and any send, a reply queue that refuses for a while, everything settling before operators act
again, and the agents' host frozen for more deadlines than the failure threshold while orders
compensate, checking the product's promise after every step and once everything has settled:

- no order lost or stuck; every order ends Processed, or Error;
- no effect twice; a Processed order has every step in place;
- an Error order has exactly one alert per entry into Error, and an effect left in place only
  if its service refused the undo or the compensation budget ran out (then only what its
  record and critical alert name); at most one compensation warning per compensation;
- every status update sent, in sequence, none missing, also when the reply queue refused some
  for a while; the last says the state the order ended in, and exactly one says it finished;
- each step's record agrees with what its service was asked and answered, and an answer to a
  request never asked for changes nothing and raises one alert;
- once an order ended, only its settling changes it (and records about it: held status
  updates sent again, whose failure an attempt was);
- with the Supervisor's clock up to the tolerated skew ahead of or behind the others', no order
  is recovered before it is late in real time;
- every step transition is one domain.order.STEP_TRANSITIONS allows (checked at each write;
  that every allowed one is made: test_lifecycle_transitions).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from domain.ids import Operation
from domain.states import ProcessState
from tests.support.world import (
    CLOCK_SKEW,
    FAILURE_THRESHOLD,
    FAULTS,
    LIES,
    Lie,
    World,
    order_id,
)

# pytest-timeout interrupting Hypothesis mid-example would read as a flaky failure; a loaded
# CI machine may take several times the ~20 s this takes alone.
pytestmark = [pytest.mark.timeout(900), pytest.mark.anyio]

MAX_ORDERS = 3
CLOCK_SKEW_S = int(CLOCK_SKEW.total_seconds())
crash = st.none() | st.integers(min_value=0, max_value=4)
T = TypeVar("T")


class Lifecycle(RuleBasedStateMachine):
    """Each rule runs its handler to the end on the machine's own event loop (one per example:
    Hypothesis calls rules synchronously), closed in :meth:`teardown`.

    A rule's call runs as :meth:`asyncio.Runner.run` runs it (a task in the runner's one
    context, to the end), less its SIGINT handler: installing and removing that around each
    of the tens of thousands of calls was about 6 % of the test's CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.context = contextvars.copy_context()
        self.world = World()
        self.submitted = 0

    def run(self, call: Coroutine[Any, Any, T]) -> T:
        loop = self.runner.get_loop()
        return loop.run_until_complete(loop.create_task(call, context=self.context))

    @precondition(lambda self: self.submitted < MAX_ORDERS)
    @rule(crash_after=crash, version=st.sampled_from([None, 2]))
    def submit(self, crash_after: int | None, version: int | None) -> None:
        """A new order, on the current version of its workflow or on version 2 (a step with
        nothing to undo: verify_address)."""
        oid = order_id(self.submitted)
        self.run(self.world.submit(oid, crash_after=crash_after, version=version))
        self.submitted += 1

    @precondition(lambda self: self.submitted > 0)
    @rule(n=st.integers(0, MAX_ORDERS - 1), crash_after=crash)
    def submission_redelivered(self, n: int, crash_after: int | None) -> None:
        self.run(self.world.submit(order_id(n % self.submitted), crash_after=crash_after))

    @precondition(lambda self: self.world.deliverable("agent"))
    @rule(index=st.integers(0, 50), fault=st.sampled_from(FAULTS), keep=st.booleans())
    def agent_request(self, index: int, fault, keep: bool) -> None:  # type: ignore[no-untyped-def]
        ready = self.world.deliverable("agent")
        self.run(self.world.deliver(ready[index % len(ready)], fault, keep=keep))

    @precondition(lambda self: self.world.parked)
    @rule(index=st.integers(0, 50))
    def late_request_lands(self, index: int) -> None:
        self.run(self.world.land_late(index))

    @precondition(lambda self: self.submitted > 0)
    @rule(
        n=st.integers(0, MAX_ORDERS - 1),
        step=st.integers(0, 2),
        operation=st.sampled_from(["do", "undo"]),
        newer=st.booleans(),
        attempt=st.integers(0, 50),
        lie=st.sampled_from(LIES),
    )
    def answer_never_asked(
        self, n: int, step: int, operation: Operation, newer: bool, attempt: int, lie: Lie
    ) -> None:
        self.run(
            self.world.answer_unasked(
                order_id(n % self.submitted),
                step=step,
                operation=operation,
                newer=newer,
                attempt=attempt,
                lie=lie,
            )
        )

    @precondition(lambda self: self.world.deliverable("responses"))
    @rule(index=st.integers(0, 50), crash_after=crash, keep=st.booleans())
    def reply(self, index: int, crash_after: int | None, keep: bool) -> None:
        ready = self.world.deliverable("responses")
        self.run(self.world.deliver(ready[index % len(ready)], crash_after=crash_after, keep=keep))

    @precondition(lambda self: self.world.deliverable("commands"))
    @rule(index=st.integers(0, 50), crash_after=crash, keep=st.booleans())
    def command(self, index: int, crash_after: int | None, keep: bool) -> None:
        ready = self.world.deliverable("commands")
        self.run(self.world.deliver(ready[index % len(ready)], crash_after=crash_after, keep=keep))

    @rule(crash_after=crash)
    def supervisor_tick(self, crash_after: int | None) -> None:
        self.run(self.world.tick(crash_after))

    @rule(seconds=st.sampled_from([1, 5, 31, 85, 130, 400]))
    def time_passes(self, seconds: int) -> None:
        self.world.advance(seconds)

    @rule(offset=st.integers(-CLOCK_SKEW_S, CLOCK_SKEW_S))
    def supervisor_clock_drifts(self, offset: int) -> None:
        """The Supervisor's host clock runs ahead of or behind the others', within the skew the
        app tolerates: it must recover no order early (World.tick checks) nor any later than
        its deadline plus the tolerance (the recovery bound)."""
        self.world.supervisor_offset = timedelta(seconds=offset)

    @rule(refusing=st.booleans())
    def reply_queue(self, refusing: bool) -> None:
        """The submitters' queue goes away (or is disabled, or closed to the app), or is back."""
        self.world.replies.refusing = refusing

    @precondition(lambda self: self.world.compensating())
    @rule(deadlines=st.integers(min_value=FAILURE_THRESHOLD, max_value=16))
    def no_host_answers_while_compensating(self, deadlines: int) -> None:
        """Undo attempts time out of our own making, at least as often as the failure
        threshold allows a step to fail; sometimes for longer than the compensation budget."""
        self.run(self.world.hosts_silent(deadlines))

    @precondition(lambda self: self.submitted > 0)
    @rule(n=st.integers(0, MAX_ORDERS - 1), crash_after=crash)
    def cancel(self, n: int, crash_after: int | None) -> None:
        self.run(self.world.cancel(order_id(n % self.submitted), crash_after))

    @precondition(
        lambda self: any(o.state is ProcessState.ERROR for o in self.world.store.orders())
    )
    @rule(n=st.integers(0, MAX_ORDERS - 1), crash_after=crash)
    def resubmit(self, n: int, crash_after: int | None) -> None:
        errored = [o for o in self.world.store.orders() if o.state is ProcessState.ERROR]
        self.run(self.world.resubmit(errored[n % len(errored)].order_id, crash_after))

    @precondition(
        lambda self: any(o.state is ProcessState.ERROR for o in self.world.store.orders())
    )
    @rule(n=st.integers(0, MAX_ORDERS - 1), step=st.integers(0, 3), crash_after=crash)
    def restart(self, n: int, step: int, crash_after: int | None) -> None:
        errored = [o for o in self.world.store.orders() if o.state is ProcessState.ERROR]
        order = errored[n % len(errored)]
        name = order.steps[step % len(order.steps)].name
        self.run(self.world.restart(order.order_id, name, crash_after))

    @precondition(lambda self: self.submitted > 0)
    @rule(crash_after=crash)
    def migrate(self, crash_after: int | None) -> None:
        """An operator moves the orders in flight on order@1 that may move onto order@2."""
        self.run(self.world.migrate(crash_after))

    @precondition(lambda self: self.submitted > 0)
    @rule()
    def everything_settles(self) -> None:
        """Every message is delivered, without faults, until every order has ended; what the
        operators do next meets orders that ended every way."""
        self.run(self.world.drain())

    @invariant()
    def safe(self) -> None:
        self.run(self.world.check_safety())

    def teardown(self) -> None:
        try:
            self.run(self.world.drain())
            self.run(self.world.check_final())
        finally:
            self.runner.close()


Lifecycle.TestCase.settings = settings(
    max_examples=int(os.environ.get("LIFECYCLE_EXAMPLES", "1000")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_lifecycle = Lifecycle.TestCase


async def test_an_undo_that_lands_after_the_order_ended_settles_it():
    """The exploration rarely ends a compensation incomplete (no undo may answer for the whole
    compensation budget); here it does, and the undo that hung lands after the end."""
    world = World()
    oid = order_id(0)
    await world.submit(oid, reply_to=None)
    for fault in ("ok", "decline"):  # reserve_inventory took effect, charge_payment declined
        await world.deliver(world.deliverable("agent")[0], fault)
        await world.deliver(world.deliverable("responses")[0])
    await world.deliver(world.deliverable("agent")[0], "late")  # the release hangs...
    await world.hosts_silent(16)  # ...and no retry of it is answered until the budget is spent
    assert await world.budget_spent(oid)
    ended = await world.store.load(oid)
    assert ended.state is ProcessState.ERROR and ended.settling
    error = (await world.store.get_timeline(oid))[-1]
    assert error.detail.endswith("; settling: an answer may still change reserve_inventory")

    await world.land_late(0)  # the release took effect after all
    await world.deliver(world.deliverable("responses")[0])
    settled = await world.store.load(oid)
    assert not settled.settling
    last = (await world.store.get_timeline(oid))[-1]
    assert (last.event, last.detail) == (
        "settled",
        "reserve_inventory: Compensated (after the end; nothing is open now)",
    )
    await world.check_final()


async def test_a_refused_undo_leaves_the_earlier_steps_for_the_operator():
    """Found by the exploration: cancelled while the charge was in flight, the charge then
    landing, and its refund refused. Compensation ends there (the operator decides what next):
    the reservation, which it had not reached, stays in place with the charge."""
    world = World()
    oid = order_id(0)
    await world.submit(oid, reply_to=None)
    await world.deliver(world.deliverable("agent")[0], "ok")  # reserve_inventory took effect
    await world.deliver(world.deliverable("responses")[0])
    await world.cancel(oid)
    await world.deliver(world.deliverable("agent")[0], "ok")  # the charge lands after all
    await world.deliver(world.deliverable("agent")[0], "refuse_undo")  # its refund is refused
    await world.drain()
    ended = await world.store.load(oid)
    assert ended.state is ProcessState.ERROR
    assert "undo of charge_payment refused" in (ended.last_error or "")
    assert "steps left to undo: charge_payment (refund at payment), reserve_inventory" in (
        ended.last_error or ""
    )
    await world.check_final()
