"""Table entity shapes of the state store, and its errors.

Row layout of one order (PartitionKey = order id), in RowKey order:

``details``
    The submitted order: ``Payload`` (canonical JSON, split over ``Payload``, ``PayloadPart1``...
    when longer than one string property may be), ``PayloadParts``, ``PayloadHash`` (see
    :meth:`domain.messages.OrderSubmitted.content_hash`), ``CustomerId``, ``Currency``,
    ``TotalCents`` (Int64), ``ItemCount``, ``SubmittedAt``. Written once, never changed.
``process``
    The whole mutable order (:class:`domain.order.Order`), so one point read loads it and one
    ETag-conditional write changes it: the pattern's ``OrderID``, ``LockedBy``, ``CompleteBy``,
    ``ProcessState``, ``FailureCount``, plus ``Workflow``, ``Attempt``, ``Generation``,
    ``CurrentStep``, ``CurrentOperation``, ``ReplyTo``, ``LastError``, ``NextAttemptAt``,
    ``CreatedAt``, ``UpdatedAt``, ``TimelineSeq``, ``WriteId``, ``CompensationCause``,
    ``CompensationReason``, ``CompensationStartedAt``, ``CompensationWarned`` (only when true),
    ``StatusSeq``, ``TraceParent`` (the W3C traceparent of the span that created the order; a
    malformed one reads as none); and JSON (split like ``Payload``): ``AgentPayload`` (what
    agents are told), ``Steps`` (each step's state, generation, attempts, the requests it sent,
    result, error, and its failed attempts by whose failure each was, when it has any) and
    ``Outbox`` (the messages the last write implied, until known delivered).
``timeline-<seq, 8 digits>``
    Append-only: ``Seq``, ``At``, ``Actor``, ``Event``, ``FromState``, ``ToState``, ``Step``,
    ``Attempt``, ``Detail``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from azure.core import MatchConditions
from azure.data.tables import EntityProperty

from adapters.tables import Entity
from domain import ids
from domain.messages import MESSAGE_TYPES, OrderSubmitted, truncate_utf8
from domain.order import (
    NO_FAILURES,
    Failures,
    Order,
    Outgoing,
    Requests,
    StepRecord,
    StepState,
    TimelineEntry,
    valid_trace_parent,
)
from domain.states import ProcessState

DETAILS_ROW: Final = "details"
PROCESS_ROW: Final = "process"
TIMELINE_PREFIX: Final = "timeline-"
TIMELINE_END: Final = "timeline."  # '.' sorts right after '-': the end of the timeline range
TIMELINE_SEQ_DIGITS: Final = 8
MAX_TIMELINE_SEQ: Final = 10**TIMELINE_SEQ_DIGITS - 1
SCHEMA_VERSION: Final = 2
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


class Unconfirmed(ConcurrencyConflict):
    """A write whose answer was lost (a timeout, a reset, a 5xx) and whose row, read at once,
    does not carry it: decide again on what is stored. If the lost write is still on its way it
    lands first or not at all: whatever is written next is conditional on the same ETag."""


class CorruptOrderState(StoreError):
    """Rows of an order are missing or unreadable; an operator must look at it."""


def utc(value: datetime) -> datetime:
    """A plain aware UTC datetime; naive datetimes are refused (they would be read as local)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"datetime {value.isoformat()} has no timezone; use an aware UTC one")
    value = value.astimezone(UTC)  # a datetime subclass (the SDK's) is rebuilt as a plain one
    return datetime.combine(value, value.timetz())


def etag_of(entity: Entity) -> str:
    etag = entity.metadata.get("etag")
    if not etag:
        raise CorruptOrderState(f"row {entity.get('RowKey')} came back without an ETag")
    return str(etag)


def if_unchanged(etag: str | None) -> dict[str, Any]:
    """The condition of a write or delete that must find the row as it was read (its ETag)."""
    return {"etag": etag, "match_condition": MatchConditions.IfNotModified}


_INVERT_MS: Final = 10**13  # past the year 2286 in milliseconds since the epoch


def newest_first_key(at: datetime, suffix: str) -> str:
    """A RowKey that sorts rows newest first (the purge and dead-letter logs' runs)."""
    millis = int(utc(at).timestamp() * 1000)
    return f"{_INVERT_MS - millis:013d}.{suffix}"


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


def order_entity(order: Order) -> dict[str, Any]:
    """The ``process`` row of ``order``. None values are left out by REPLACE (LockedBy = null)."""
    entity: dict[str, Any] = {
        "PartitionKey": order.order_id,
        "RowKey": PROCESS_ROW,
        "SchemaVersion": SCHEMA_VERSION,
        "OrderID": order.order_id,
        "Workflow": order.workflow,
        "ProcessState": order.state.value,
        "LockedBy": order.locked_by,
        "CompleteBy": order.complete_by,
        "FailureCount": order.failure_count,
        "Attempt": order.attempt,
        "Generation": order.generation,
        "CurrentStep": order.current_step,
        "CurrentOperation": order.current_operation,
        "ReplyTo": order.reply_to,
        "LastError": _clip(order.last_error),
        "NextAttemptAt": order.next_attempt_at,
        "CreatedAt": order.created_at,
        "UpdatedAt": order.updated_at,
        "TimelineSeq": order.timeline_seq,
        "WriteId": order.write_id,
        "CompensationCause": order.compensation_cause,
        "CompensationReason": _clip(order.compensation_reason),
        "CompensationStartedAt": order.compensation_started_at,
        "CompensationWarned": order.compensation_warned or None,
        "StatusSeq": order.status_seq,
        "TraceParent": valid_trace_parent(order.trace_parent),
    }
    put_json(entity, "AgentPayload", _dumps(order.payload))
    put_json(entity, "Steps", _dumps([step_json(step) for step in order.steps]))
    put_json(entity, "Outbox", _dumps([outgoing_json(o) for o in order.outbox]))
    return entity


def order_from_entity(entity: Mapping[str, Any], etag: str) -> Order:
    try:
        return Order(
            order_id=entity["OrderID"],
            workflow=entity["Workflow"],
            state=ProcessState(entity["ProcessState"]),
            locked_by=entity.get("LockedBy") or None,
            complete_by=_dt(entity.get("CompleteBy")),
            failure_count=_int(entity.get("FailureCount")),
            attempt=_int(entity.get("Attempt")),
            generation=_int(entity.get("Generation"), 1),
            current_step=entity["CurrentStep"],
            current_operation=ids.validate_operation(entity.get("CurrentOperation", "do")),
            reply_to=entity.get("ReplyTo") or None,
            payload=json.loads(get_json(entity, "AgentPayload") or "{}"),
            steps=tuple(step_of(item) for item in json.loads(get_json(entity, "Steps") or "[]")),
            created_at=utc(entity["CreatedAt"]),
            updated_at=utc(entity["UpdatedAt"]),
            next_attempt_at=_dt(entity.get("NextAttemptAt")),
            last_error=entity.get("LastError") or None,
            compensation_cause=entity.get("CompensationCause") or None,
            compensation_reason=entity.get("CompensationReason") or None,
            compensation_started_at=_dt(entity.get("CompensationStartedAt")),
            compensation_warned=entity.get("CompensationWarned") is True,
            status_seq=_int(entity.get("StatusSeq")),
            outbox=tuple(
                outgoing_of(item) for item in json.loads(get_json(entity, "Outbox") or "[]")
            ),
            timeline_seq=_int(entity.get("TimelineSeq")),
            trace_parent=valid_trace_parent(entity.get("TraceParent")),
            etag=etag,
            write_id=entity.get("WriteId", ""),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptOrderState(
            f"process row of {entity.get('PartitionKey')} is unreadable: {exc!r}"
        ) from None


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _clip(text: str | None) -> str | None:
    return None if text is None else truncate_utf8(text, MAX_LAST_ERROR_BYTES)


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def parse_iso(value: str | None) -> datetime | None:
    return None if value is None else utc(datetime.fromisoformat(value))


def step_json(step: StepRecord) -> dict[str, Any]:
    item = {
        "name": step.name,
        "index": step.index,
        "state": step.state.value,
        "generation": step.generation,
        "attempt": step.attempt,
        "result": step.result,
        "error_code": step.error_code,
        "error_message": _clip(step.error_message),
        "completed_at": iso(step.completed_at),
        "compensated_at": iso(step.compensated_at),
        "requests": None
        if step.requests is None
        else [[run.operation, run.first, run.last] for run in step.requests],
    }
    # Most steps never fail: their JSON (and every snapshot of the order) stays as it was.
    failed = {
        operation: dataclasses.asdict(failures)  # "unanswered" a tuple: a list in JSON
        for operation, failures in (("do", step.forward_failures), ("undo", step.undo_failures))
        if failures != NO_FAILURES
    }
    if failed:
        item["failed"] = failed
    return item


def step_of(item: Mapping[str, Any]) -> StepRecord:
    state = StepState(item["state"])
    return StepRecord(
        name=item["name"],
        index=int(item["index"]),
        state=state,
        generation=int(item["generation"]),
        attempt=int(item["attempt"]),
        result=item.get("result"),
        error_code=item.get("error_code"),
        error_message=item.get("error_message"),
        completed_at=parse_iso(item.get("completed_at")),
        compensated_at=parse_iso(item.get("compensated_at")),
        requests=_requests_of(item, state),
        forward_failures=_failures_of(item, "do"),
        undo_failures=_failures_of(item, "undo"),
    )


def _failures_of(step: Mapping[str, Any], operation: str) -> Failures:
    failed = step.get("failed") or {}
    if not isinstance(failed, Mapping):
        raise ValueError(f"step {step['name']}: 'failed' is not an object")
    item = failed.get(operation)
    if item is None:
        return NO_FAILURES
    return Failures(
        at_service=int(item["at_service"]),
        on_our_side=int(item["on_our_side"]),
        unanswered=tuple(int(attempt) for attempt in item["unanswered"]),
    )


def _requests_of(item: Mapping[str, Any], state: StepState) -> tuple[Requests, ...] | None:
    """A step's requests. In a row written before they were recorded: none for a Pending step
    (it has sent nothing in its generation), not known (None) for any other."""
    if "requests" not in item:
        return () if state is StepState.PENDING else None
    runs = item["requests"]
    if runs is None:
        return None
    requests = []
    for operation, first, last in runs:
        if not (isinstance(first, int) and isinstance(last, int) and 1 <= first <= last):
            raise ValueError(f"step {item['name']!r} has requests {first!r}..{last!r}")
        requests.append(Requests(ids.validate_operation(operation), first, last))
    return tuple(requests)


def outgoing_json(outgoing: Outgoing) -> dict[str, Any]:
    return {
        "to": outgoing.to,
        "type": outgoing.message.MESSAGE_TYPE,
        "message": outgoing.message.model_dump(mode="json"),
        "not_before": iso(outgoing.not_before),
    }


def outgoing_of(item: Mapping[str, Any]) -> Outgoing:
    message_type = MESSAGE_TYPES[item["type"]]
    return Outgoing(
        to=item["to"],
        message=message_type.model_validate(item["message"]),
        not_before=parse_iso(item.get("not_before")),
    )


def details_entity(submitted: OrderSubmitted, payload_hash: str) -> dict[str, Any]:
    entity: dict[str, Any] = {
        "PartitionKey": submitted.order_id,
        "RowKey": DETAILS_ROW,
        "SchemaVersion": SCHEMA_VERSION,
        "PayloadHash": payload_hash,
        "CustomerId": submitted.customer_id,
        "Currency": submitted.currency,
        "TotalCents": EntityProperty(submitted.total_cents, "Edm.Int64"),
        "ItemCount": len(submitted.items),
        "SubmittedAt": utc(submitted.submitted_at),
    }
    put_json(entity, "Payload", submitted.model_dump_json())
    return entity


def timeline_entity(order_id: str, entry: TimelineEntry) -> dict[str, Any]:
    return {
        "PartitionKey": order_id,
        "RowKey": timeline_row_key(entry.seq),
        "Seq": entry.seq,
        "At": entry.at,
        "Actor": entry.actor,
        "Event": entry.event,
        "FromState": entry.from_state.value if entry.from_state else None,
        "ToState": entry.to_state.value,
        "Step": entry.step,
        "Attempt": entry.attempt,
        "Detail": truncate_utf8(entry.detail, MAX_TIMELINE_DETAIL_BYTES),
    }


def timeline_from_entity(entity: Mapping[str, Any]) -> TimelineEntry:
    try:
        from_state = entity.get("FromState")
        return TimelineEntry(
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
class AlreadyExists:
    """An order with this id exists. ``same_payload``: carry on; otherwise reject and alert."""

    same_payload: bool
    existing_payload_hash: str
    order: Order


@dataclass(frozen=True, slots=True)
class ActiveRow:
    """One row of the active-order index: an order generation that may be in flight."""

    order_id: str
    generation: int
    workflow: str
    written_at: datetime
    due_at: datetime
    """Never later than when the Supervisor must look at the order (adapters.store.active_index)."""
    partition_key: str
    row_key: str
    etag: str
    dispatch_id: str = ""
    """Set while a Supervisor tick has handed the row out (the MessageId of that hand-out,
    :class:`domain.messages.DueRows`); ``due_at`` is then the hand-out's lease."""
    dispatched_at: datetime | None = None
    due_since: datetime | None = None
    """When a handed-out row first came due (its due time before the first hand-out)."""

    @property
    def overdue_since(self) -> datetime:
        """When the row came due: before any hand-out moved its due time on."""
        return self.due_since if self.dispatch_id and self.due_since else self.due_at


@dataclass(frozen=True, slots=True)
class ActivePage:
    rows: tuple[ActiveRow, ...]
    continuation: str | None
    """Opaque; pass it to the next ``list_active`` call to go on where this page ended."""
