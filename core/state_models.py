"""Typed records of the state store and their Table entity shapes.

Row layout of one order (PartitionKey = order id), in RowKey order:

``details``
    The submitted order: ``Payload`` (canonical JSON, split over ``Payload``, ``PayloadPart1``...
    when longer than one string property may be), ``PayloadParts``, ``PayloadHash`` (see
    :meth:`core.messages.OrderSubmitted.content_hash`), ``CustomerId``, ``Currency``,
    ``TotalCents`` (Int64), ``ItemCount``, ``SubmittedAt``. Written once, never changed.
``process``
    The pattern's record: ``OrderID``, ``LockedBy``, ``CompleteBy``, ``ProcessState``,
    ``FailureCount``, plus ``Workflow``, ``Attempt``, ``Generation``, ``CurrentStep``,
    ``CurrentOperation``, ``ReplyTo``, ``LastError``, ``NextAttemptAt``, ``CreatedAt``,
    ``UpdatedAt``, ``TimelineSeq`` (sequence of the latest timeline row) and ``WriteId`` (random
    id of the transition that wrote the row). Compensation and operator fields:
    ``CompensationCause`` (why the order is being undone, as an alert reason code:
    ``step_declined``, ``failure_threshold``, ``cancelled``), ``CompensationReason`` (the same in
    words), ``CancelRequestedBy`` (an operator asked to cancel while a step was in flight) and
    ``ReplyError`` (status replies to ``ReplyTo`` failed and stopped; why). Absent properties
    read as None.
``step-<nn>-<name>``
    One per workflow step: ``Step``, ``StepIndex``, ``State`` (Pending, Succeeded, Failed,
    Compensating, Compensated), ``Attempt`` (of the latest reply recorded, do or undo),
    ``Result`` (JSON of the succeeded do, split like ``Payload``; an undo keeps it),
    ``ErrorCode``, ``ErrorMessage``, ``CompletedAt``, ``CompensatedAt``, ``UpdatedAt``.
``timeline-<seq, 8 digits>``
    Append-only: ``Seq``, ``At``, ``Actor``, ``Event``, ``FromState``, ``ToState``, ``Step``,
    ``Attempt``, ``Detail``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from azure.core import MatchConditions
from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import EntityProperty, TableClient, TableEntity

from core import ids
from core.messages import AgentResponse, JsonObject, OrderSubmitted, truncate_utf8
from core.states import ProcessState, StepState

DETAILS_ROW: Final = "details"
PROCESS_ROW: Final = "process"
STEP_PREFIX: Final = "step-"
TIMELINE_PREFIX: Final = "timeline-"
TIMELINE_END: Final = "timeline."  # '.' sorts right after '-': the end of the timeline range
TIMELINE_SEQ_DIGITS: Final = 8
MAX_TIMELINE_SEQ: Final = 10**TIMELINE_SEQ_DIGITS - 1
SCHEMA_VERSION: Final = 1
MAX_LAST_ERROR_BYTES: Final = 2048
MAX_TIMELINE_DETAIL_BYTES: Final = 2048
# A string property holds at most 64 KiB of UTF-16; 16,000 code points stay below that even when
# every one of them needs a surrogate pair (4 bytes).
JSON_CHUNK_CHARS: Final = 16_000


class StoreError(Exception):
    """Base of the state store's own errors (HTTP errors from the SDK pass through unchanged)."""


class OrderNotFound(StoreError):
    def __init__(self, order_id: str) -> None:
        super().__init__(f"order {order_id} does not exist")
        self.order_id = order_id


class ConcurrencyConflict(StoreError):
    """The record changed since it was read (HTTP 412): someone else owns the next move.

    Never retry the same write: re-read, and decide again whether anything is left to do.
    """

    def __init__(self, order_id: str, detail: str = "") -> None:
        text = f"order {order_id} was changed by someone else"
        super().__init__(f"{text}: {detail}" if detail else text)
        self.order_id = order_id


class InvalidTransition(StoreError):
    """A transition that the state machine forbids, refused before any request."""


class StaleResult(StoreError):
    """A step result for another step, attempt or direction than the one in flight."""


class CorruptOrderState(StoreError):
    """Rows of an order are missing or unreadable; an operator must look at it."""


def utc(value: datetime) -> datetime:
    """A plain aware UTC datetime; naive datetimes are refused (they would be read as local)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"datetime {value.isoformat()} has no timezone; use an aware UTC one")
    value = value.astimezone(UTC)
    return datetime(
        value.year,
        value.month,
        value.day,
        value.hour,
        value.minute,
        value.second,
        value.microsecond,
        tzinfo=UTC,
    )


def etag_of(entity: TableEntity) -> str:
    etag = entity.metadata.get("etag")
    if not etag:
        raise CorruptOrderState(f"row {entity.get('RowKey')} came back without an ETag")
    return str(etag)


def delete_unchanged(table: TableClient, partition_key: str, row_key: str, etag: str) -> bool:
    """Delete a row only if it is still the version read (ETag); False if it changed or went."""
    try:
        table.delete_entity(
            partition_key, row_key, etag=etag, match_condition=MatchConditions.IfNotModified
        )
    except (ResourceModifiedError, ResourceNotFoundError):
        return False
    return True


def step_row_key(index: int, name: str) -> str:
    return f"{STEP_PREFIX}{index:02d}-{name}"


def timeline_row_key(seq: int) -> str:
    if not 0 <= seq <= MAX_TIMELINE_SEQ:
        raise ValueError(f"timeline sequence {seq} is outside 0..{MAX_TIMELINE_SEQ}")
    return f"{TIMELINE_PREFIX}{seq:0{TIMELINE_SEQ_DIGITS}d}"


def put_json(entity: dict[str, Any], name: str, text: str) -> None:
    """Store ``text`` as ``name``, ``name``Part1, ... and ``name``Parts (the count)."""
    chunks = [text[i : i + JSON_CHUNK_CHARS] for i in range(0, len(text), JSON_CHUNK_CHARS)]
    chunks = chunks or [""]
    entity[name] = chunks[0]
    for number, chunk in enumerate(chunks[1:], start=1):
        entity[f"{name}Part{number}"] = chunk
    entity[f"{name}Parts"] = len(chunks)


def get_json(entity: Mapping[str, Any], name: str) -> str | None:
    if name not in entity:
        return None
    parts = _int(entity.get(f"{name}Parts"), 1)
    pieces = [entity[name]] + [entity.get(f"{name}Part{n}") for n in range(1, parts)]
    if any(not isinstance(piece, str) for piece in pieces):
        raise CorruptOrderState(f"{name} of {entity.get('PartitionKey')} has a missing part")
    return "".join(pieces)


def _int(value: Any, default: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, EntityProperty):
        return int(value.value)
    return int(value)


def _dt(value: Any) -> datetime | None:
    return None if value is None else utc(value)


def _int64(value: int) -> EntityProperty:
    return EntityProperty(value, "Edm.Int64")


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """The ``process`` row as read (``etag`` is the version every transition is conditional on)."""

    order_id: str
    workflow: str
    state: ProcessState
    locked_by: str | None
    complete_by: datetime | None
    failure_count: int
    attempt: int
    generation: int
    current_step: str | None
    current_operation: ids.Operation
    reply_to: str | None
    last_error: str | None
    next_attempt_at: datetime | None
    created_at: datetime
    updated_at: datetime
    timeline_seq: int
    write_id: str
    etag: str
    compensation_cause: str | None = None
    compensation_reason: str | None = None
    cancel_requested_by: str | None = None
    reply_error: str | None = None

    def to_entity(self) -> dict[str, Any]:
        # None values are left out: with REPLACE they remove the property (LockedBy = null).
        return {
            "PartitionKey": self.order_id,
            "RowKey": PROCESS_ROW,
            "SchemaVersion": SCHEMA_VERSION,
            "OrderID": self.order_id,
            "Workflow": self.workflow,
            "ProcessState": self.state.value,
            "LockedBy": self.locked_by,
            "CompleteBy": self.complete_by,
            "FailureCount": self.failure_count,
            "Attempt": self.attempt,
            "Generation": self.generation,
            "CurrentStep": self.current_step,
            "CurrentOperation": self.current_operation,
            "ReplyTo": self.reply_to,
            "LastError": self.last_error,
            "NextAttemptAt": self.next_attempt_at,
            "CreatedAt": self.created_at,
            "UpdatedAt": self.updated_at,
            "TimelineSeq": self.timeline_seq,
            "WriteId": self.write_id,
            "CompensationCause": self.compensation_cause,
            "CompensationReason": self.compensation_reason,
            "CancelRequestedBy": self.cancel_requested_by,
            "ReplyError": self.reply_error,
        }

    @classmethod
    def from_entity(cls, entity: Mapping[str, Any], etag: str) -> ProcessRecord:
        try:
            return cls(
                order_id=entity["OrderID"],
                workflow=entity["Workflow"],
                state=ProcessState(entity["ProcessState"]),
                locked_by=entity.get("LockedBy") or None,
                complete_by=_dt(entity.get("CompleteBy")),
                failure_count=_int(entity.get("FailureCount")),
                attempt=_int(entity.get("Attempt")),
                generation=_int(entity.get("Generation"), 1),
                current_step=entity.get("CurrentStep") or None,
                current_operation=ids.validate_operation(entity.get("CurrentOperation", "do")),
                reply_to=entity.get("ReplyTo") or None,
                last_error=entity.get("LastError") or None,
                next_attempt_at=_dt(entity.get("NextAttemptAt")),
                created_at=utc(entity["CreatedAt"]),
                updated_at=utc(entity["UpdatedAt"]),
                timeline_seq=_int(entity.get("TimelineSeq")),
                write_id=entity.get("WriteId", ""),
                etag=etag,
                compensation_cause=entity.get("CompensationCause") or None,
                compensation_reason=entity.get("CompensationReason") or None,
                cancel_requested_by=entity.get("CancelRequestedBy") or None,
                reply_error=entity.get("ReplyError") or None,
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise CorruptOrderState(
                f"process row of {entity.get('PartitionKey')} is unreadable: {exc!r}"
            ) from None


@dataclass(frozen=True, slots=True)
class StepRecord:
    name: str
    index: int
    state: StepState
    attempt: int
    result: JsonObject | None
    error_code: str | None
    error_message: str | None
    completed_at: datetime | None
    compensated_at: datetime | None

    @classmethod
    def from_entity(cls, entity: Mapping[str, Any]) -> StepRecord:
        try:
            result_text = get_json(entity, "Result")
            return cls(
                name=entity["Step"],
                index=_int(entity["StepIndex"]),
                state=StepState(entity["State"]),
                attempt=_int(entity.get("Attempt")),
                result=json.loads(result_text) if result_text else None,
                error_code=entity.get("ErrorCode") or None,
                error_message=entity.get("ErrorMessage") or None,
                completed_at=_dt(entity.get("CompletedAt")),
                compensated_at=_dt(entity.get("CompensatedAt")),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise CorruptOrderState(
                f"step row {entity.get('RowKey')} of {entity.get('PartitionKey')} is "
                f"unreadable: {exc!r}"
            ) from None


@dataclass(frozen=True, slots=True)
class StepUpdate:
    """What a transition records on a step row (merged: absent fields keep their values).

    ``state`` None leaves the state as it is (a failed undo: the step is still to be undone).
    ``attempt`` None leaves the row's attempt (a step marked for undo before any undo reply).
    ``reset`` replaces the row with a fresh Pending one (a step a resubmission will redo).
    """

    step: str
    attempt: int | None
    state: StepState | None
    result: JsonObject | None = None
    error_code: str | None = None
    error_message: str | None = None
    at: datetime | None = None
    reset: bool = False

    @classmethod
    def from_response(cls, response: AgentResponse) -> StepUpdate:
        succeeded = response.outcome == "succeeded"
        if response.operation == "do":
            state: StepState | None = StepState.SUCCEEDED if succeeded else StepState.FAILED
        else:
            state = StepState.COMPENSATED if succeeded else None
        return cls(
            step=response.step,
            attempt=response.attempt,
            state=state,
            result=response.result if succeeded and response.operation == "do" else None,
            error_code=response.error_code,
            error_message=response.error_message,
            at=response.responded_at,
        )

    def to_entity(self, order_id: str, index: int, now: datetime) -> dict[str, Any]:
        if self.reset:
            return new_step_entity(order_id, index, self.step, now)
        at = utc(self.at) if self.at is not None else now
        entity: dict[str, Any] = {
            "PartitionKey": order_id,
            "RowKey": step_row_key(index, self.step),
            "UpdatedAt": now,
        }
        if self.attempt is not None:
            entity["Attempt"] = self.attempt
        if self.state is not None:
            entity["State"] = self.state.value
            if self.state is StepState.COMPENSATED:
                entity["CompensatedAt"] = at
            elif self.state in (StepState.SUCCEEDED, StepState.FAILED) or self.result is not None:
                # A result is only ever recorded for a 'do' that succeeded, even when the same
                # write marks the step for undo (an order cancelled while that step was running).
                entity["CompletedAt"] = at
        if self.result is not None:
            put_json(entity, "Result", json.dumps(self.result, separators=(",", ":")))
        if self.error_code is not None:
            entity["ErrorCode"] = self.error_code
        if self.error_message is not None:
            entity["ErrorMessage"] = truncate_utf8(self.error_message, MAX_LAST_ERROR_BYTES)
        return entity


def new_step_entity(order_id: str, index: int, name: str, now: datetime) -> dict[str, Any]:
    return {
        "PartitionKey": order_id,
        "RowKey": step_row_key(index, name),
        "Step": name,
        "StepIndex": index,
        "State": StepState.PENDING.value,
        "Attempt": 0,
        "UpdatedAt": now,
    }


def details_entity(submitted: OrderSubmitted, payload_hash: str) -> dict[str, Any]:
    entity: dict[str, Any] = {
        "PartitionKey": submitted.order_id,
        "RowKey": DETAILS_ROW,
        "SchemaVersion": SCHEMA_VERSION,
        "PayloadHash": payload_hash,
        "CustomerId": submitted.customer_id,
        "Currency": submitted.currency,
        "TotalCents": _int64(submitted.total_cents),
        "ItemCount": len(submitted.items),
        "SubmittedAt": utc(submitted.submitted_at),
    }
    put_json(entity, "Payload", submitted.model_dump_json())
    return entity


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    seq: int
    at: datetime
    actor: str
    event: str
    from_state: ProcessState | None
    to_state: ProcessState
    step: str | None
    attempt: int
    detail: str

    def to_entity(self, order_id: str) -> dict[str, Any]:
        return {
            "PartitionKey": order_id,
            "RowKey": timeline_row_key(self.seq),
            "Seq": self.seq,
            "At": self.at,
            "Actor": self.actor,
            "Event": self.event,
            "FromState": self.from_state.value if self.from_state else None,
            "ToState": self.to_state.value,
            "Step": self.step,
            "Attempt": self.attempt,
            "Detail": truncate_utf8(self.detail, MAX_TIMELINE_DETAIL_BYTES),
        }

    @classmethod
    def from_entity(cls, entity: Mapping[str, Any]) -> TimelineEntry:
        try:
            from_state = entity.get("FromState")
            return cls(
                seq=_int(entity["Seq"]),
                at=utc(entity["At"]),
                actor=entity["Actor"],
                event=entity["Event"],
                from_state=ProcessState(from_state) if from_state else None,
                to_state=ProcessState(entity["ToState"]),
                step=entity.get("Step") or None,
                attempt=_int(entity.get("Attempt")),
                detail=entity.get("Detail") or "",
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise CorruptOrderState(
                f"timeline row {entity.get('RowKey')} of {entity.get('PartitionKey')} is "
                f"unreadable: {exc!r}"
            ) from None


@dataclass(frozen=True, slots=True)
class OrderRecord:
    """Everything about one order except its timeline, from one partition query."""

    details: OrderSubmitted
    payload_hash: str
    process: ProcessRecord
    steps: tuple[StepRecord, ...]

    @property
    def order_id(self) -> str:
        return self.process.order_id

    def step(self, name: str) -> StepRecord:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"order {self.order_id} has no step {name!r}")


@dataclass(frozen=True, slots=True)
class Created:
    process: ProcessRecord
    created: bool = True


@dataclass(frozen=True, slots=True)
class AlreadyExists:
    """An order with this id exists. ``same_payload``: carry on; otherwise reject and alert."""

    same_payload: bool
    existing_payload_hash: str
    process: ProcessRecord
    created: bool = False


CreateResult = Created | AlreadyExists


@dataclass(frozen=True, slots=True)
class ActiveRow:
    """One row of the active-order index: an order generation that may be in flight."""

    order_id: str
    generation: int
    workflow: str
    written_at: datetime
    partition_key: str
    row_key: str
    etag: str


@dataclass(frozen=True, slots=True)
class ActivePage:
    rows: tuple[ActiveRow, ...]
    continuation: str | None
    """Opaque; pass it to the next ``list_active`` call to go on where this page ended."""
