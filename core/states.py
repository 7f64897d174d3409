"""The states an order and its steps move through, shared by messages and the state store."""

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
        return self in (ProcessState.PROCESSED, ProcessState.ERROR)

    @property
    def in_flight(self) -> bool:
        return not self.terminal


class StepState(StrEnum):
    """State of one step row.

    Compensating: the step is to be undone (or its undo is in flight); it stays so until its
    undo succeeds (Compensated). A step whose undo could not be completed stays Compensating,
    which is how an operator sees what is left to undo.
    """

    PENDING = "Pending"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    COMPENSATING = "Compensating"
    COMPENSATED = "Compensated"


_P = ProcessState
# Which ProcessState may follow which. Self-transitions are real: Processing -> Processing
# dispatches the next step, Pending -> Pending is a supervisor bump of a stale Pending order,
# Compensating -> Compensating moves to the next undo. Nothing leaves Processed; Error is left
# only by an operator's resubmit (-> Pending) or an operator-requested undo (-> Compensating).
ALLOWED_TRANSITIONS: Final[MappingProxyType[ProcessState, frozenset[ProcessState]]] = (
    MappingProxyType(
        {
            _P.PENDING: frozenset({_P.PENDING, _P.PROCESSING, _P.COMPENSATING, _P.ERROR}),
            _P.PROCESSING: frozenset(
                {_P.PROCESSING, _P.PENDING, _P.COMPENSATING, _P.PROCESSED, _P.ERROR}
            ),
            _P.COMPENSATING: frozenset({_P.COMPENSATING, _P.ERROR}),
            _P.PROCESSED: frozenset(),
            _P.ERROR: frozenset({_P.PENDING, _P.COMPENSATING}),
        }
    )
)


def transition_allowed(current: ProcessState, new: ProcessState) -> bool:
    return new in ALLOWED_TRANSITIONS[current]
