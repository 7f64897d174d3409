"""The order lifecycle explored by Hypothesis: random interleavings of submissions, agent answers
(success, decline, transient, circuit open, lost, late, duplicated, out of order, an undo
refused), deadlines, Supervisor ticks, cancels, resubmits, crashes between the write and any
send, and the agents' host frozen for more deadlines than the failure threshold while orders
compensate, checking the product's promise after every step and once everything has settled:

- no order lost or stuck; every order ends Processed, or Error;
- no effect twice; a Processed order has every step in place;
- an Error order has exactly one alert per entry into Error, and an effect left in place only
  if its service refused the undo or the compensation budget ran out (then only what its
  record and critical alert name); at most one compensation warning per compensation;
- every status update sent, in sequence, none missing.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from core.states import ProcessState
from tests.support.world import FAILURE_THRESHOLD, FAULTS, World, order_id

# pytest-timeout interrupting Hypothesis mid-example would read as a flaky failure; a loaded
# CI machine may take several times the ~20 s this takes alone.
pytestmark = pytest.mark.timeout(900)

MAX_ORDERS = 3
crash = st.none() | st.integers(min_value=0, max_value=4)


class Lifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World()
        self.submitted = 0

    @precondition(lambda self: self.submitted < MAX_ORDERS)
    @rule(crash_after=crash)
    def submit(self, crash_after: int | None) -> None:
        self.world.submit(order_id(self.submitted), crash_after=crash_after)
        self.submitted += 1

    @precondition(lambda self: self.submitted > 0)
    @rule(n=st.integers(0, MAX_ORDERS - 1), crash_after=crash)
    def submission_redelivered(self, n: int, crash_after: int | None) -> None:
        self.world.submit(order_id(n % self.submitted), crash_after=crash_after)

    @precondition(lambda self: self.world.deliverable("agent"))
    @rule(index=st.integers(0, 50), fault=st.sampled_from(FAULTS), keep=st.booleans())
    def agent_request(self, index: int, fault, keep: bool) -> None:  # type: ignore[no-untyped-def]
        ready = self.world.deliverable("agent")
        self.world.deliver(ready[index % len(ready)], fault, keep=keep)

    @precondition(lambda self: self.world.parked)
    @rule(index=st.integers(0, 50))
    def late_request_lands(self, index: int) -> None:
        self.world.land_late(index)

    @precondition(lambda self: self.world.deliverable("responses"))
    @rule(index=st.integers(0, 50), crash_after=crash, keep=st.booleans())
    def reply(self, index: int, crash_after: int | None, keep: bool) -> None:
        ready = self.world.deliverable("responses")
        self.world.deliver(ready[index % len(ready)], crash_after=crash_after, keep=keep)

    @precondition(lambda self: self.world.deliverable("commands"))
    @rule(index=st.integers(0, 50), crash_after=crash, keep=st.booleans())
    def command(self, index: int, crash_after: int | None, keep: bool) -> None:
        ready = self.world.deliverable("commands")
        self.world.deliver(ready[index % len(ready)], crash_after=crash_after, keep=keep)

    @rule(crash_after=crash)
    def supervisor_tick(self, crash_after: int | None) -> None:
        self.world.tick(crash_after)

    @rule(seconds=st.sampled_from([1, 5, 31, 130]))
    def time_passes(self, seconds: int) -> None:
        self.world.advance(seconds)

    @precondition(lambda self: self.world.compensating())
    @rule(deadlines=st.integers(min_value=FAILURE_THRESHOLD, max_value=16))
    def no_host_answers_while_compensating(self, deadlines: int) -> None:
        """Undo attempts time out of our own making, at least as often as the failure
        threshold allows a step to fail; sometimes for longer than the compensation budget."""
        self.world.hosts_silent(deadlines)

    @precondition(lambda self: self.submitted > 0)
    @rule(n=st.integers(0, MAX_ORDERS - 1), crash_after=crash)
    def cancel(self, n: int, crash_after: int | None) -> None:
        self.world.cancel(order_id(n % self.submitted), crash_after)

    @precondition(
        lambda self: any(o.state is ProcessState.ERROR for o in self.world.store.orders())
    )
    @rule(n=st.integers(0, MAX_ORDERS - 1), crash_after=crash)
    def resubmit(self, n: int, crash_after: int | None) -> None:
        errored = [o for o in self.world.store.orders() if o.state is ProcessState.ERROR]
        self.world.resubmit(errored[n % len(errored)].order_id, crash_after)

    @invariant()
    def safe(self) -> None:
        self.world.check_safety()

    def teardown(self) -> None:
        self.world.drain()
        self.world.check_final()


Lifecycle.TestCase.settings = settings(
    max_examples=int(os.environ.get("LIFECYCLE_EXAMPLES", "1000")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_lifecycle = Lifecycle.TestCase
