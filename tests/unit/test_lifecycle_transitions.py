"""Every transition an order and a step may make is made by the stateful lifecycle test, and
no other (as Temporal's core keeps a test that its state machines' transitions are covered).

What may follow what is the domain's: :data:`domain.states.ALLOWED_TRANSITIONS` for an order's
ProcessState, :data:`domain.order.STEP_TRANSITIONS` for a step's StepState. The world's store
notes what each write made (:func:`tests.support.world.moves`), and refuses, at the write, a
step transition the table does not allow (the lifecycle itself refuses an order transition), so
the random exploration of test_lifecycle_stateful checks the "no other" half on every run.

The "every" half must not depend on chance: Hypothesis draws its interleavings at random, and
some transitions need a long, particular one (a decline that overtakes the undo sent for its
step, then that undo retried). So it is checked on explicit examples of the same state machine:
tours, each a sequence of its rules run as Hypothesis runs them (a rule whose precondition does
not hold is skipped; the invariants after each rule; the teardown's drain and final checks at
the end). A tour that no longer makes what it was written for fails this test, naming the
transitions no tour made, and any tour step that could not run (a rule removed or renamed).
"""

from __future__ import annotations

from typing import Any

import pytest

from domain.order import STEP_TRANSITIONS
from domain.states import ALLOWED_TRANSITIONS
from tests.support.world import Move
from tests.unit.test_lifecycle_stateful import Lifecycle

pytestmark = pytest.mark.timeout(300)

ALLOWED: frozenset[Move] = frozenset(
    {("order", old.value, new.value) for old, news in ALLOWED_TRANSITIONS.items() for new in news}
    | {("step", old.value, new.value) for old, news in STEP_TRANSITIONS.items() for new in news}
)

Step = tuple[str, dict[str, object]]
"""One rule of :class:`Lifecycle` and what it is called with."""


def submit(version: int | None = None) -> Step:
    return "submit", {"crash_after": None, "version": version}


def agent(fault: str = "ok", *, index: int = 0, keep: bool = False) -> Step:
    """The agents take up the ``index``-th deliverable request (oldest first)."""
    return "agent_request", {"index": index, "fault": fault, "keep": keep}


def reply(index: int = 0) -> Step:
    return "reply", {"index": index, "crash_after": None, "keep": False}


def command() -> Step:
    return "command", {"index": 0, "crash_after": None, "keep": False}


def owed() -> Step:
    """The pattern app takes the newest command: what an operator's action just wrote asks it to
    send (the operations app sends nothing else: service.handover)."""
    return "command", {"index": -1, "crash_after": None, "keep": False}


def tick(*, hands_out: bool = False) -> Step:
    """A tick; ``hands_out``: it hands the rows due out (DueRows) instead of handling them."""
    return "supervisor_tick", {"crash_after": None, "hands_out": hands_out}


def wait(seconds: int) -> Step:
    return "time_passes", {"seconds": seconds}


def lands() -> Step:
    return "late_request_lands", {"index": 0}


def cancel() -> Step:
    return "cancel", {"n": 0, "crash_after": None}


def resubmit() -> Step:
    return "resubmit", {"n": 0, "crash_after": None}


def restart(step: int) -> Step:
    return "restart", {"n": 0, "step": step, "crash_after": None}


def ok_through(steps: int) -> list[Step]:
    """The first ``steps`` requests of the order succeed, each answered at once."""
    return [move for _ in range(steps) for move in (agent(), reply())]


TOURS: dict[str, list[Step]] = {
    "every step succeeds": [submit(), *ok_through(3)],
    "a decline undoes the step before it, and a resubmit redoes both": [
        submit(),
        *ok_through(1),
        agent("decline"),
        reply(),
        *ok_through(1),  # the reservation released
        resubmit(),
        owed(),
    ],
    "the first step declined leaves nothing to undo": [submit(), agent("decline"), reply()],
    "a retried step goes stale, is cancelled while it waits, and resubmitted": [
        submit(),
        agent("transient"),
        reply(),  # released
        wait(5),
        command(),  # claimed again
        agent("transient"),
        reply(),  # released again; its retry command is lost in the wait
        wait(400),
        tick(),  # stale: released once more, a failure on our side
        cancel(),
        owed(),
        agent(),  # its undo: nothing to undo
        reply(),
        resubmit(),
        owed(),
    ],
    "a released last step lands late and finishes the order": [
        submit(),
        *ok_through(2),
        agent("late"),
        wait(130),
        tick(),  # past its deadline: released, its retry not yet claimed
        lands(),
        reply(),
    ],
    "a step past its deadline is handed out to the fleet, which releases it": [
        submit(),
        *ok_through(1),
        agent("late"),
        wait(130),
        tick(hands_out=True),  # the row handed out (DueRows on the commands queue)...
        owed(),  # ...and recovered by whichever instance takes it: released
        lands(),
        reply(),
    ],
    "a first step released past its deadline, declined after all": [
        submit(),
        agent("decline"),  # its answer waits in the queue...
        wait(130),
        tick(),  # ...past the deadline: released
        reply(),
    ],
    "a refused undo ends compensation; a resubmit resumes it": [
        submit(),
        *ok_through(1),
        cancel(),  # while the charge is still queued: its undo follows it
        owed(),
        agent(),  # the charge takes effect
        agent("refuse_undo"),  # its refund is refused
        reply(),  # the charge: it took effect after the cancel
        reply(),  # the refusal: compensation incomplete
        resubmit(),  # the refund and the release are still to do
        owed(),
    ],
    "an undo that hangs past the compensation budget lands after the end": [
        submit(),
        *ok_through(1),
        agent("decline"),
        reply(),  # the charge declined: the reservation to release
        agent("late"),  # the release hangs...
        ("no_host_answers_while_compensating", {"deadlines": 16}),  # ...past the budget
        lands(),  # it took effect after all
        reply(),  # the order, ended, settles
    ],
    "a decline overtakes the undo sent for its step; the undo is retried": [
        submit(),
        cancel(),  # the reservation's undo follows it
        owed(),
        agent("decline"),  # the reservation declined
        agent("transient"),  # its undo failed
        reply(),  # the decline
        reply(),  # the undo's failure: released
        wait(5),
        command(),  # the undo sent again, for a Failed step
        agent(),
        reply(),  # nothing to undo
    ],
    "an undo answered before the step's own success": [
        submit(),
        cancel(),
        owed(),
        agent(),  # the reservation takes effect
        agent(),  # and is released
        reply(index=1),  # the release answered first
    ],
    "order@2: a restart redoes the step that has no undo": [
        submit(version=2),
        *ok_through(3),  # reserve, charge, verify the address
        agent("decline"),
        reply(),  # the shipment declined
        *ok_through(2),  # the charge voided, the reservation released
        restart(2),
        owed(),
    ],
    "order@2: cancelled while verifying the address, then resubmitted": [
        submit(version=2),
        *ok_through(2),
        cancel(),  # verify_address in flight has no undo: left Running
        owed(),
        agent(index=1),  # the charge voided
        reply(),
        agent(index=1),  # the reservation released
        reply(),
        resubmit(),
        owed(),
    ],
}


def run_tour(steps: list[Step]) -> tuple[set[Move], list[str]]:
    """Run ``steps`` on a new :class:`Lifecycle` as Hypothesis would; what the writes made, and
    the steps that could not run."""
    machine = Lifecycle()
    rules: dict[str, Any] = {r.function.__name__: r for r in machine.rules}  # hypothesis' Rule
    not_run: list[str] = []
    try:
        for name, arguments in steps:
            rule = rules.get(name)
            if rule is None:
                not_run.append(f"{name}: not a rule of the stateful test")
                continue
            if not all(holds(machine) for holds in rule.preconditions):
                not_run.append(f"{name}({arguments}): its precondition does not hold")
                continue
            rule.function(machine, **arguments)
            for invariant in machine.invariants:
                if all(holds(machine) for holds in invariant.preconditions):
                    invariant.function(machine)
    finally:
        machine.teardown()
    return machine.world.store.moves, not_run


def test_the_stateful_test_makes_every_allowed_transition():
    made: set[Move] = set()
    not_run: list[str] = []
    for name, steps in TOURS.items():
        moves, skipped = run_tour(steps)
        made |= moves
        not_run += [f"{name}: {step}" for step in skipped]
    missing = sorted(ALLOWED - made)
    assert not missing, (
        "never made by the stateful test: "
        + "; ".join(f"{kind} {old} -> {new}" for kind, old, new in missing)
        + "".join(f"\n  tour step not run: {note}" for note in not_run)
    )
    assert made <= ALLOWED, f"not allowed, yet made: {sorted(made - ALLOWED)}"
