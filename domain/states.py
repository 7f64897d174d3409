"""The states an order moves through (its steps' states, and which may follow which:
:class:`domain.order.StepState`, :data:`domain.order.STEP_TRANSITIONS`)."""

from __future__ import annotations

from enum import StrEnum
from types import MappingProxyType
from typing import Final


class ProcessState(StrEnum):
    """ProcessState of an order (the pattern's field, plus Compensating for undo in progress)."""

    PENDING = "Pending"
    PROCESSING = "Processing"
    COMPENSATING = "Compensating"
    PROCESSED = "Processed"
    ERROR = "Error"

    @property
    def terminal(self) -> bool:
        """The order has ended: the app sends no more requests for it on its own. Its record
        may still change while it is *settling* (:attr:`domain.order.Order.settling`)."""
        return self in (ProcessState.PROCESSED, ProcessState.ERROR)

    @property
    def in_flight(self) -> bool:
        return not self.terminal


_P = ProcessState
# Which ProcessState may follow which (domain.lifecycle checks every write against it).
# Self-transitions are real: Processing -> Processing dispatches the next step, Pending ->
# Pending is a Supervisor bump of a stale Pending order, Compensating -> Compensating moves to
# the next undo. An ended order changes on its own only while it is settling: an Error order
# records an answer to a request it sent whose outcome its record still leaves open (Error ->
# Error; domain.lifecycle refuses the write once the order is settled). A Processed order is
# settled when it ends (every step took effect, no undo was sent): nothing follows Processed.
# A write that only records what an ended order still delivers (its held status updates sent
# again or given up) is no transition: domain.lifecycle lets it through at any time.
# Error is left only by an operator's resubmit (-> Processing, the first step claimed at once)
# or a resumed compensation. Operators' annotations (an acknowledgement) are timeline rows of
# the state store, not transitions.
ALLOWED_TRANSITIONS: Final = MappingProxyType(
    {
        # Any state; -> Processed and -> Error too: a released step's late answer finishes it.
        _P.PENDING: frozenset(_P),
        _P.PROCESSING: frozenset(_P),
        _P.COMPENSATING: frozenset({_P.COMPENSATING, _P.ERROR}),
        _P.PROCESSED: frozenset(),
        _P.ERROR: frozenset({_P.ERROR, _P.PROCESSING, _P.COMPENSATING}),
    }
)


def transition_allowed(current: ProcessState, new: ProcessState) -> bool:
    return new in ALLOWED_TRANSITIONS[current]
