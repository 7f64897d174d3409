"""Order state in Azure Table Storage: one partition per order, ETag-guarded transitions.

Layout of the ``orders`` table: see :mod:`core.state_models`. Rules that keep it correct:

- **Create is one transaction.** ``details``, ``process``, every step row and timeline row 0 go
  in one batch (same PartitionKey): all of them exist or none does. A second create of the same
  id fails as a whole with 409 and is answered from the stored payload hash.
- **The process row's ETag guards the whole partition.** Every later write is one batch that
  replaces the ``process`` row on condition of the ETag it was read with (412 otherwise) and
  inserts the next timeline row, plus the step rows it changes (a reply recorded, steps marked
  for undo, steps reset for a resubmission). A lost race therefore writes nothing at all, not
  even a timeline row; and the timeline row key comes from the process row's ``TimelineSeq``,
  so two writers can never both append one.
- **A 412 is never retried blindly.** The SDK's transport retry may resend a batch whose first
  try did commit; the 412 that follows would be our own write. Each transition carries a random
  ``WriteId``; on 412 the store reads the row once, and if it carries our ``WriteId`` the write
  is ours and succeeds. Otherwise :class:`ConcurrencyConflict`: re-read and decide again.

Active-order index (table ``activeorders``, :mod:`core.active_index`): the row of an order
generation is written BEFORE the transaction that puts it in flight (create, resubmit) and
deleted AFTER the one that makes it terminal (Processed, Error), so a crash leaves at worst an
extra row, which the Supervisor reaps; never an in-flight order without a row. The Error index
(:mod:`core.error_index`) follows the same rule for the transitions into and out of Error.

Compensation (see :mod:`scheduler.compensation`) uses the same transitions: it starts with one
write that marks every step to undo ``Compensating`` and puts the first undo in flight
(:meth:`OrderStateStore.begin_compensation`); each undo is claimed, released and recovered like a
forward step, with ``CurrentOperation`` = ``undo``.

Every id is validated (:mod:`core.ids`) before any request; every query filter is
parameterized. Operation counting belongs to the SDK pipeline, not here.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Final, Self

from azure.core import MatchConditions
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import (
    TableClient,
    TableServiceClient,
    TableTransactionError,
    UpdateMode,
)

from core import ids
from core.active_index import DEFAULT_GRACE, ActiveOrderIndex, index_partition
from core.error_index import ErrorOrderIndex
from core.messages import AgentResponse, OrderSubmitted, truncate_utf8, utc_now
from core.state_models import (
    DETAILS_ROW,
    MAX_LAST_ERROR_BYTES,
    PROCESS_ROW,
    STEP_PREFIX,
    TIMELINE_END,
    TIMELINE_PREFIX,
    ActivePage,
    ActiveRow,
    AlreadyExists,
    ConcurrencyConflict,
    CorruptOrderState,
    Created,
    CreateResult,
    InvalidTransition,
    OrderNotFound,
    OrderRecord,
    ProcessRecord,
    StaleResult,
    StepRecord,
    StepUpdate,
    StoreError,
    TimelineEntry,
    details_entity,
    etag_of,
    get_json,
    new_step_entity,
    timeline_row_key,
    utc,
)
from core.states import ProcessState, StepState, transition_allowed
from core.workflows import WORKFLOWS, Step, Workflow

__all__ = [
    "DEFAULT_GRACE",
    "ActiveOrderIndex",
    "ActivePage",
    "ActiveRow",
    "AlreadyExists",
    "ConcurrencyConflict",
    "CorruptOrderState",
    "CreateResult",
    "Created",
    "InvalidTransition",
    "OrderNotFound",
    "OrderRecord",
    "OrderStateStore",
    "ProcessRecord",
    "StaleResult",
    "StepRecord",
    "StepUpdate",
    "StoreError",
    "TimelineEntry",
    "index_partition",
]

DEFAULT_ORDERS_TABLE: Final = "orders"
DEFAULT_ACTIVE_TABLE: Final = "activeorders"
# Fields a transition may change; the rest (ids, workflow, timestamps, sequence) the store owns.
_CHANGEABLE: Final = frozenset(
    {
        "state",
        "locked_by",
        "complete_by",
        "failure_count",
        "attempt",
        "generation",
        "current_step",
        "current_operation",
        "last_error",
        "next_attempt_at",
        "compensation_cause",
        "compensation_reason",
        "cancel_requested_by",
        "reply_error",
    }
)
_CLEARED_MARKS: Final = {
    "compensation_cause": None,
    "compensation_reason": None,
    "cancel_requested_by": None,
    "reply_error": None,
}


class OrderStateStore:
    """Reads and ETag-conditional writes of order state; see the module docstring for the rules.

    Give it a ``TableServiceClient`` built any way (connection string locally, managed identity
    in Azure); :meth:`from_connection_string` is a shortcut. Call :meth:`ensure_tables` once at
    startup. Methods are synchronous and safe to call from several threads.
    """

    def __init__(
        self,
        service: TableServiceClient,
        *,
        orders_table: str = DEFAULT_ORDERS_TABLE,
        active_table: str = DEFAULT_ACTIVE_TABLE,
        workflows: Mapping[str, Workflow] = WORKFLOWS,
        clock: Callable[[], datetime] = utc_now,
        owns_service: bool = False,
    ) -> None:
        self._service = service
        self._orders_name = ids.validate_table_name(orders_table)
        self._active_name = ids.validate_table_name(active_table)
        if self._orders_name.lower() == self._active_name.lower():
            raise ValueError("the orders table and the active-order index must differ")
        self._orders: TableClient = service.get_table_client(self._orders_name)
        self._active: TableClient = service.get_table_client(self._active_name)
        self.index = ActiveOrderIndex(self._active, clock)
        """The active-order index; the Supervisor lists and reaps through it."""
        self.errors = ErrorOrderIndex(self._orders, clock)
        """The index of orders in Error (a partition of the orders table)."""
        self._workflows = workflows
        self._clock = clock
        self._owns_service = owns_service

    @classmethod
    def from_connection_string(cls, connection_string: str, **kwargs: Any) -> Self:
        service = TableServiceClient.from_connection_string(connection_string)
        return cls(service, owns_service=True, **kwargs)

    @property
    def orders_table(self) -> str:
        return self._orders_name

    @property
    def active_table(self) -> str:
        return self._active_name

    def ensure_tables(self) -> None:
        for name in (self._orders_name, self._active_name):
            self._service.create_table_if_not_exists(name)

    def close(self) -> None:
        self._orders.close()
        self._active.close()
        if self._owns_service:
            self._service.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _now(self) -> datetime:
        return utc(self._clock())

    def _workflow(self, name: str) -> Workflow:
        try:
            return self._workflows[name]
        except KeyError:
            raise CorruptOrderState(f"workflow {name!r} is not known to this build") from None

    # ----------------------------------------------------------------------------- create

    def create_order(
        self, submitted: OrderSubmitted, workflow: Workflow, *, actor: str = "scheduler"
    ) -> CreateResult:
        """Insert an order with all its rows in one transaction.

        Returns :class:`Created`, or :class:`AlreadyExists` when the id is taken (a redelivered
        submission has ``same_payload=True``; a different order under a used id has False).
        """
        order_id = ids.validate_order_id(submitted.order_id)
        ids.validate_instance_id(actor, "actor")
        if self._workflows.get(workflow.name) != workflow:
            raise ValueError(f"workflow {workflow.name!r} is not registered with this store")
        now = self._now()
        payload_hash = submitted.content_hash()
        process = ProcessRecord(
            order_id=order_id,
            workflow=workflow.name,
            state=ProcessState.PENDING,
            locked_by=None,
            complete_by=None,
            failure_count=0,
            attempt=0,
            generation=1,
            current_step=workflow.first_step.name,
            current_operation="do",
            reply_to=submitted.reply_to,
            last_error=None,
            next_attempt_at=now,
            created_at=now,
            updated_at=now,
            timeline_seq=0,
            write_id=uuid.uuid4().hex,
            etag="",
        )
        created = TimelineEntry(
            seq=0,
            at=now,
            actor=actor,
            event="created",
            from_state=None,
            to_state=ProcessState.PENDING,
            step=None,
            attempt=0,
            detail=f"workflow {workflow.name}, {len(workflow.steps)} steps",
        )
        operations: list[tuple[str, dict[str, Any]]] = [
            ("create", details_entity(submitted, payload_hash)),
            ("create", process.to_entity()),
            *(
                ("create", new_step_entity(order_id, index, step.name, now))
                for index, step in enumerate(workflow.steps)
            ),
            ("create", created.to_entity(order_id)),
        ]
        self.index.put(order_id, process.generation, workflow.name)
        try:
            results = self._orders.submit_transaction(operations)
        except TableTransactionError as exc:
            if not _entity_exists(exc):
                raise
            return self._existing(order_id, payload_hash)
        return Created(dataclasses.replace(process, etag=results[1]["etag"]))

    def _existing(self, order_id: str, payload_hash: str) -> AlreadyExists:
        rows = {
            row["RowKey"]: row
            for row in self._orders.query_entities(
                "PartitionKey eq @pk and RowKey le @last",
                parameters={"pk": order_id, "last": PROCESS_ROW},
            )
        }
        details, process_row = rows.get(DETAILS_ROW), rows.get(PROCESS_ROW)
        if details is None or process_row is None:
            raise CorruptOrderState(
                f"order {order_id} has rows but no {'details' if details is None else 'process'}"
                " row; an earlier write was not one transaction"
            )
        process = ProcessRecord.from_entity(process_row, etag_of(process_row))
        if process.state.terminal or process.generation != 1:
            # The upsert just made re-created the generation-1 index row of a finished order.
            self.index.discard(order_id, 1)
        existing_hash = details.get("PayloadHash", "")
        return AlreadyExists(
            same_payload=existing_hash == payload_hash,
            existing_payload_hash=existing_hash,
            process=process,
        )

    # ------------------------------------------------------------------------------ reads

    def get_process(self, order_id: str) -> ProcessRecord:
        """Point read of the process row (with its ETag)."""
        order_id = ids.validate_order_id(order_id)
        try:
            entity = self._orders.get_entity(order_id, PROCESS_ROW)
        except ResourceNotFoundError:
            raise OrderNotFound(order_id) from None
        return ProcessRecord.from_entity(entity, etag_of(entity))

    def find_process(self, order_id: str) -> ProcessRecord | None:
        try:
            return self.get_process(order_id)
        except OrderNotFound:
            return None

    def get_order(self, order_id: str) -> OrderRecord:
        """Details, process and steps of one order in one partition query (timeline excluded)."""
        order_id = ids.validate_order_id(order_id)
        rows = list(
            self._orders.query_entities(
                "PartitionKey eq @pk and RowKey lt @end",
                parameters={"pk": order_id, "end": TIMELINE_PREFIX},
            )
        )
        if not rows:
            raise OrderNotFound(order_id)
        by_key = {row["RowKey"]: row for row in rows}
        details, process_row = by_key.get(DETAILS_ROW), by_key.get(PROCESS_ROW)
        if details is None or process_row is None:
            raise CorruptOrderState(f"order {order_id} lacks its details or process row")
        payload = get_json(details, "Payload")
        try:
            submitted = OrderSubmitted.model_validate_json(payload or "")
        except ValueError as exc:
            raise CorruptOrderState(f"details of order {order_id} are unreadable: {exc}") from None
        steps = sorted(
            (StepRecord.from_entity(row) for row in rows if row["RowKey"].startswith(STEP_PREFIX)),
            key=lambda step: step.index,
        )
        return OrderRecord(
            details=submitted,
            payload_hash=details.get("PayloadHash", ""),
            process=ProcessRecord.from_entity(process_row, etag_of(process_row)),
            steps=tuple(steps),
        )

    def get_timeline(
        self, order_id: str, *, after_seq: int = -1, limit: int = 1000
    ) -> list[TimelineEntry]:
        """Timeline rows with ``seq > after_seq``, oldest first, at most ``limit``."""
        order_id = ids.validate_order_id(order_id)
        if limit < 1:
            raise ValueError("limit must be at least 1")
        low = TIMELINE_PREFIX if after_seq < 0 else timeline_row_key(after_seq)
        entries: list[TimelineEntry] = []
        query = self._orders.query_entities(
            "PartitionKey eq @pk and RowKey gt @low and RowKey lt @high",
            parameters={"pk": order_id, "low": low, "high": TIMELINE_END},
            results_per_page=min(limit, 1000),
        )
        for row in query:
            entries.append(TimelineEntry.from_entity(row))
            if len(entries) >= limit:
                break
        return entries

    # ------------------------------------------------------------------------ transitions

    def transition(
        self,
        current: ProcessRecord,
        changes: Mapping[str, Any],
        *,
        actor: str,
        event: str,
        detail: str = "",
        step_update: StepUpdate | None = None,
        more_steps: Sequence[StepUpdate] = (),
    ) -> ProcessRecord:
        """Apply ``changes`` (ProcessRecord field names) to ``current`` as one conditional write.

        In one batch: the process row replaced on condition of ``current.etag``, the next
        timeline row inserted, and ``step_update`` plus ``more_steps`` (if any) written to their
        step rows (updates of one step are merged into one write; ``step_update`` names the
        timeline row's step). Returns the new record (with its new ETag). Raises
        :class:`ConcurrencyConflict` if the row changed since ``current`` was read,
        :class:`InvalidTransition` (before any request) if the state machine forbids the move,
        and :class:`OrderNotFound` if the order is gone.
        """
        new = self._apply(current, changes)
        return self._commit(
            current,
            new,
            actor=actor,
            event=event,
            detail=detail,
            step=new.current_step if step_update is None else step_update.step,
            step_updates=_merge_step_updates(
                [] if step_update is None else [step_update], more_steps
            ),
        )

    def annotate(
        self,
        current: ProcessRecord,
        *,
        actor: str,
        event: str,
        detail: str = "",
        reply_error: str | None = None,
    ) -> ProcessRecord:
        """Record something about an order without moving it, in any state (even Processed).

        One conditional write: a timeline row and, when given, ``reply_error`` on the process
        row (status replies stopped). Operator actions that change nothing (acknowledging an
        alert) are recorded this way.
        """
        values: dict[str, Any] = {}
        if reply_error is not None:
            values["reply_error"] = truncate_utf8(reply_error, MAX_LAST_ERROR_BYTES)
        new = dataclasses.replace(
            current,
            **values,
            updated_at=self._now(),
            timeline_seq=current.timeline_seq + 1,
            write_id=uuid.uuid4().hex,
        )
        return self._commit(
            current, new, actor=actor, event=event, detail=detail, step=None, step_updates=[]
        )

    def _commit(
        self,
        current: ProcessRecord,
        new: ProcessRecord,
        *,
        actor: str,
        event: str,
        detail: str,
        step: str | None,
        step_updates: Sequence[StepUpdate],
    ) -> ProcessRecord:
        ids.validate_order_id(current.order_id)
        ids.validate_instance_id(actor, "actor")
        ids.validate_name(event, "event")
        workflow = self._workflow(current.workflow)
        entry = TimelineEntry(
            seq=new.timeline_seq,
            at=new.updated_at,
            actor=actor,
            event=event,
            from_state=current.state,
            to_state=new.state,
            step=step,
            attempt=new.attempt,
            detail=detail,
        )
        operations: list[tuple[Any, ...]] = [
            (
                "update",
                new.to_entity(),
                {
                    "mode": UpdateMode.REPLACE,
                    "etag": current.etag,
                    "match_condition": MatchConditions.IfNotModified,
                },
            ),
            ("create", entry.to_entity(current.order_id)),
        ]
        for update in step_updates:
            index = workflow.index_of(update.step)
            operations.append(
                (
                    "upsert" if update.reset else "update",
                    update.to_entity(current.order_id, index, new.updated_at),
                    {"mode": UpdateMode.REPLACE if update.reset else UpdateMode.MERGE},
                )
            )
        if current.state.terminal and new.state.in_flight:
            self.index.put(current.order_id, new.generation, current.workflow)
        entering_error = new.state is ProcessState.ERROR and current.state is not ProcessState.ERROR
        error_row = self.errors.put(new.order_id, new.generation) if entering_error else None
        try:
            new = self._submit_transition(current, new, operations)
        except (ConcurrencyConflict, OrderNotFound, CorruptOrderState):
            if error_row is not None:
                self.errors.discard(new.order_id, new.generation, etag=error_row)
            raise
        if new.state.terminal:
            self.index.discard(new.order_id, new.generation)
        if current.state is ProcessState.ERROR and new.state is not ProcessState.ERROR:
            self.errors.discard(current.order_id, current.generation)
        return new

    def _apply(self, current: ProcessRecord, changes: Mapping[str, Any]) -> ProcessRecord:
        unknown = set(changes) - _CHANGEABLE
        if unknown:
            raise ValueError(f"these process fields cannot be changed: {sorted(unknown)}")
        values = dict(changes)
        state = ProcessState(values.get("state", current.state))
        if not transition_allowed(current.state, state):
            raise InvalidTransition(
                f"order {current.order_id}: {current.state} -> {state} is not allowed"
            )
        values["state"] = state
        if values.get("locked_by") is not None:
            ids.validate_instance_id(values["locked_by"], "locked_by")
        for name in ("complete_by", "next_attempt_at"):
            if values.get(name) is not None:
                values[name] = utc(values[name])
        if values.get("current_step") is not None:
            self._workflow(current.workflow).index_of(values["current_step"])
        if "current_operation" in values:
            ids.validate_operation(values["current_operation"])
        if values.get("attempt", current.attempt) < current.attempt:
            raise InvalidTransition("attempt never decreases (stale replies are told by it)")
        if values.get("generation", current.generation) < current.generation:
            raise InvalidTransition("generation never decreases (idempotency keys depend on it)")
        if values.get("failure_count", 0) < 0:
            raise ValueError("failure_count cannot be negative")
        for name in ("last_error", "compensation_reason"):
            if values.get(name) is not None:
                values[name] = truncate_utf8(values[name], MAX_LAST_ERROR_BYTES)
        if values.get("compensation_cause") is not None:
            ids.validate_name(values["compensation_cause"], "compensation cause")
        if values.get("cancel_requested_by") is not None:
            ids.validate_instance_id(values["cancel_requested_by"], "cancel_requested_by")
        return dataclasses.replace(
            current,
            **values,
            updated_at=self._now(),
            timeline_seq=current.timeline_seq + 1,
            write_id=uuid.uuid4().hex,
        )

    def _submit_transition(
        self,
        current: ProcessRecord,
        new: ProcessRecord,
        operations: Iterable[tuple[Any, ...]],
    ) -> ProcessRecord:
        try:
            results = self._orders.submit_transaction(operations)
        except TableTransactionError as exc:
            if exc.status_code == 404:
                if exc.index == 0:
                    raise OrderNotFound(current.order_id) from None
                raise CorruptOrderState(
                    f"order {current.order_id} lacks the step row this transition updates"
                ) from None
            if exc.status_code != 412 and not _entity_exists(exc):
                raise
            # 412: the process row changed; 409: our timeline row exists. Either way someone
            # else wrote - unless that someone was an SDK retry of this very batch.
            stored = self.find_process(current.order_id)
            if stored is not None and stored.write_id == new.write_id:
                return stored
            raise ConcurrencyConflict(
                current.order_id,
                f"expected {current.state} at timeline {current.timeline_seq}; now "
                + (f"{stored.state} at {stored.timeline_seq}" if stored else "gone"),
            ) from None
        return dataclasses.replace(new, etag=results[0]["etag"])

    def claim(
        self,
        current: ProcessRecord,
        *,
        instance_id: str,
        complete_by: datetime,
        step: str | None = None,
    ) -> ProcessRecord:
        """Take a Pending order (or a released compensation) for one attempt of one step.

        LockedBy = ``instance_id``, CompleteBy, Attempt + 1, ProcessState = Processing (a
        compensation stays Compensating). ``step`` defaults to the order's current step.
        """
        ids.validate_instance_id(instance_id)
        if current.state is ProcessState.PENDING:
            state, operation = ProcessState.PROCESSING, "do"
        elif current.state is ProcessState.COMPENSATING and current.locked_by is None:
            state, operation = ProcessState.COMPENSATING, "undo"
        else:
            owner = f" (locked by {current.locked_by})" if current.locked_by else ""
            raise InvalidTransition(
                f"order {current.order_id} is {current.state}{owner}; only a Pending order or a "
                "released compensation can be claimed"
            )
        target = step or current.current_step or self._workflow(current.workflow).first_step.name
        return self.transition(
            current,
            {
                "state": state,
                "locked_by": instance_id,
                "complete_by": complete_by,
                "attempt": current.attempt + 1,
                "current_step": target,
                "current_operation": operation,
                "next_attempt_at": None,
            },
            actor=instance_id,
            event="claimed",
            detail=f"{operation} {target}, attempt {current.attempt + 1}",
        )

    def record_step_result(
        self,
        current: ProcessRecord,
        response: AgentResponse,
        changes: Mapping[str, Any],
        *,
        actor: str,
        event: str,
        detail: str = "",
    ) -> ProcessRecord:
        """Record an agent's reply on its step row together with the process ``changes``.

        Refuses (:class:`StaleResult`, before any request) a reply that is not for the step,
        attempt and direction in flight: a late reply never changes state.
        """
        self.ensure_current(current, response)
        return self.transition(
            current,
            changes,
            actor=actor,
            event=event,
            detail=detail or _describe(response),
            step_update=StepUpdate.from_response(response),
        )

    @staticmethod
    def ensure_current(current: ProcessRecord, response: AgentResponse) -> None:
        """Raise :class:`StaleResult` unless ``response`` answers the attempt in flight."""
        in_flight = (
            current.current_step,
            current.attempt,
            current.current_operation,
        )
        answered = (response.step, response.attempt, response.operation)
        if response.order_id != current.order_id:
            raise StaleResult(f"reply for {response.order_id} offered to {current.order_id}")
        if current.state not in (ProcessState.PROCESSING, ProcessState.COMPENSATING):
            raise StaleResult(f"order {current.order_id} is {current.state}; no step is in flight")
        if answered != in_flight:
            raise StaleResult(
                f"order {current.order_id} awaits {_fmt(in_flight)}; reply is for {_fmt(answered)}"
            )

    def advance(
        self,
        current: ProcessRecord,
        response: AgentResponse,
        *,
        next_step: Step,
        complete_by: datetime,
        actor: str,
    ) -> ProcessRecord:
        """A step succeeded: record it and dispatch ``next_step`` (Attempt + 1, new CompleteBy).

        FailureCount restarts at 0: it counts consecutive failures of the step in flight.
        """
        self.ensure_current(current, response)
        if response.outcome != "succeeded" or response.operation != "do":
            raise ValueError("advance takes a succeeded 'do' reply")
        return self.record_step_result(
            current,
            response,
            {
                "current_step": next_step.name,
                "current_operation": "do",
                "attempt": current.attempt + 1,
                "complete_by": complete_by,
                "failure_count": 0,
                "last_error": None,
            },
            actor=actor,
            event="step_succeeded",
            detail=f"{response.step} succeeded; next {next_step.name}",
        )

    def mark_processed(
        self, current: ProcessRecord, *, actor: str, response: AgentResponse | None = None
    ) -> ProcessRecord:
        """The order is done: Processed, LockedBy cleared, leaves the active index."""
        changes = {
            "state": ProcessState.PROCESSED,
            "locked_by": None,
            "complete_by": None,
            "next_attempt_at": None,
            "last_error": None,
        }
        if response is not None:
            return self.record_step_result(
                current, response, changes, actor=actor, event="processed"
            )
        return self.transition(current, changes, actor=actor, event="processed")

    def mark_error(
        self,
        current: ProcessRecord,
        *,
        actor: str,
        reason: str,
        response: AgentResponse | None = None,
    ) -> ProcessRecord:
        """The order failed for good: Error, LockedBy cleared, leaves the active index."""
        changes = {
            "state": ProcessState.ERROR,
            "locked_by": None,
            "complete_by": None,
            "next_attempt_at": None,
            "last_error": reason,
        }
        if response is not None:
            return self.record_step_result(
                current, response, changes, actor=actor, event="error", detail=reason
            )
        return self.transition(current, changes, actor=actor, event="error", detail=reason)

    def release_for_retry(
        self,
        current: ProcessRecord,
        *,
        actor: str,
        reason: str,
        next_attempt_at: datetime,
        complete_by: datetime | None = None,
    ) -> ProcessRecord:
        """Give an order back for another attempt (the Supervisor's recovery move).

        LockedBy = None, FailureCount + 1, ProcessState = Pending (a compensation stays
        Compensating), NextAttemptAt = when the retry is due, CompleteBy = by when someone must
        have claimed it (None: no deadline until claimed).
        """
        state = (
            ProcessState.COMPENSATING
            if current.state is ProcessState.COMPENSATING
            else ProcessState.PENDING
        )
        return self.transition(
            current,
            {
                "state": state,
                "locked_by": None,
                "failure_count": current.failure_count + 1,
                "next_attempt_at": next_attempt_at,
                "complete_by": complete_by,
                "last_error": reason,
            },
            actor=actor,
            event="released",
            detail=reason,
        )

    def resubmit(
        self,
        current: ProcessRecord,
        *,
        actor: str,
        reason: str,
        step: str | None = None,
        redo: Sequence[str] = (),
    ) -> ProcessRecord:
        """An operator restarts an Error order at ``step`` (default: where it stopped).

        Generation + 1 (new idempotency keys, new index row), FailureCount 0, Pending, the
        compensation and cancel marks cleared. The step rows named in ``redo`` (the ones the
        resubmission will do again) are reset to fresh Pending rows in the same write; their
        history stays in the timeline.
        """
        self._require_error(current, "resubmitted")
        target = step or current.current_step or self._workflow(current.workflow).first_step.name
        return self.transition(
            current,
            {
                "state": ProcessState.PENDING,
                "generation": current.generation + 1,
                "failure_count": 0,
                "locked_by": None,
                "complete_by": None,
                "next_attempt_at": self._now(),
                "current_step": target,
                "current_operation": "do",
                "last_error": None,
                **_CLEARED_MARKS,
            },
            actor=actor,
            event="resubmitted",
            detail=reason,
            more_steps=[
                StepUpdate(step=name, attempt=None, state=None, reset=True) for name in redo
            ],
        )

    def resume_compensation(
        self, current: ProcessRecord, *, actor: str, reason: str, step: str
    ) -> ProcessRecord:
        """An operator resubmits an Error order whose compensation was left incomplete.

        Back to Compensating (released, so the next claim dispatches the undo of ``step``),
        FailureCount 0, the same Generation: the undo keeps its idempotency key, so an undo that
        did take effect before is not applied twice.
        """
        self._require_error(current, "resubmitted")
        return self.transition(
            current,
            {
                "state": ProcessState.COMPENSATING,
                "failure_count": 0,
                "locked_by": None,
                "complete_by": None,
                "next_attempt_at": self._now(),
                "current_step": step,
                "current_operation": "undo",
                "cancel_requested_by": None,
                "reply_error": None,
            },
            actor=actor,
            event="compensation_resumed",
            detail=reason,
        )

    def request_cancel(self, current: ProcessRecord, *, actor: str, reason: str) -> ProcessRecord:
        """Mark a Processing order for cancellation; the in-flight step's outcome decides next.

        Its reply (or its deadline passing) starts the compensation instead of the next step.
        """
        if current.state is not ProcessState.PROCESSING:
            raise InvalidTransition(
                f"order {current.order_id} is {current.state}; a cancel request waits only for "
                "a Processing order's step in flight"
            )
        return self.transition(
            current,
            {
                "cancel_requested_by": actor,
                "compensation_cause": "cancelled",
                "compensation_reason": f"cancelled by {actor}: {reason}",
            },
            actor=actor,
            event="cancel_requested",
            detail=reason,
        )

    def begin_compensation(
        self,
        current: ProcessRecord,
        undo: Sequence[Step],
        *,
        cause: str,
        reason: str,
        actor: str,
        instance_id: str | None,
        complete_by: datetime | None = None,
        response: AgentResponse | None = None,
    ) -> ProcessRecord:
        """Start undoing ``undo`` (latest step first): Compensating, every one marked for undo.

        With ``instance_id`` the caller claims the first undo (LockedBy, ``complete_by``,
        Attempt + 1) and must dispatch it; without, the order is released (LockedBy None) for the
        Scheduler to claim. ``response`` is the reply that led here, recorded on its step.
        FailureCount restarts at 0: each undo gets the full failure threshold.
        """
        if not undo:
            raise ValueError("nothing to undo; mark the order Error instead")
        if response is not None:
            self.ensure_current(current, response)
        if (instance_id is None) != (complete_by is None):
            raise ValueError("claiming the first undo needs both instance_id and complete_by")
        changes: dict[str, Any] = {
            "state": ProcessState.COMPENSATING,
            "current_step": undo[0].name,
            "current_operation": "undo",
            "failure_count": 0,
            "compensation_cause": cause,
            "compensation_reason": reason,
            "last_error": reason,
            "locked_by": instance_id,
            "complete_by": complete_by,
        }
        if instance_id is not None:
            changes |= {"attempt": current.attempt + 1, "next_attempt_at": None}
        else:
            changes["next_attempt_at"] = self._now()
        return self.transition(
            current,
            changes,
            actor=actor,
            event="compensation_started",
            detail=f"{reason}; to undo: {', '.join(step.name for step in undo)}",
            step_update=None if response is None else StepUpdate.from_response(response),
            more_steps=[
                StepUpdate(step=step.name, attempt=None, state=StepState.COMPENSATING)
                for step in undo
            ],
        )

    def advance_compensation(
        self,
        current: ProcessRecord,
        response: AgentResponse,
        *,
        next_undo: Step,
        complete_by: datetime,
        actor: str,
    ) -> ProcessRecord:
        """An undo succeeded: record the step Compensated and dispatch ``next_undo``."""
        self._require_undo_success(current, response)
        return self.record_step_result(
            current,
            response,
            {
                "current_step": next_undo.name,
                "current_operation": "undo",
                "attempt": current.attempt + 1,
                "complete_by": complete_by,
                "failure_count": 0,
            },
            actor=actor,
            event="step_compensated",
            detail=f"{response.step} undone; next undo {next_undo.name}",
        )

    def finish_compensation(
        self, current: ProcessRecord, response: AgentResponse, *, actor: str, last_error: str
    ) -> ProcessRecord:
        """The last undo succeeded: Error with ``last_error``, LockedBy cleared."""
        self._require_undo_success(current, response)
        return self.record_step_result(
            current,
            response,
            {
                "state": ProcessState.ERROR,
                "locked_by": None,
                "complete_by": None,
                "next_attempt_at": None,
                "last_error": last_error,
            },
            actor=actor,
            event="compensated",
            detail=last_error,
        )

    def _require_undo_success(self, current: ProcessRecord, response: AgentResponse) -> None:
        self.ensure_current(current, response)
        if response.outcome != "succeeded" or response.operation != "undo":
            raise ValueError("this transition takes a succeeded 'undo' reply")

    @staticmethod
    def _require_error(current: ProcessRecord, what: str) -> None:
        if current.state is not ProcessState.ERROR:
            raise InvalidTransition(
                f"order {current.order_id} is {current.state}; only Error orders are {what}"
            )

    # ------------------------------------------------------------------------------ index

    def list_active(self, limit: int = 1000, *, continuation: str | None = None) -> ActivePage:
        """One page of the active-order index (see :meth:`ActiveOrderIndex.list`)."""
        return self.index.list(limit, continuation=continuation)

    def reap_active(
        self, row: ActiveRow, process: ProcessRecord | None, *, grace: timedelta = DEFAULT_GRACE
    ) -> bool:
        """Delete an index row that is garbage (see :meth:`ActiveOrderIndex.reap`)."""
        return self.index.reap(row, process, grace=grace)


def _merge_step_updates(
    first: Sequence[StepUpdate], more: Sequence[StepUpdate]
) -> list[StepUpdate]:
    """One update per step (a batch may touch each row once); later fields fill in gaps.

    A reply's update (result, error, attempt) and a mark for undo on the same step become one
    write whose state is the later one's.
    """
    merged: dict[str, StepUpdate] = {}
    for update in (*first, *more):
        earlier = merged.get(update.step)
        if earlier is None:
            merged[update.step] = update
            continue
        merged[update.step] = dataclasses.replace(
            earlier,
            attempt=update.attempt if update.attempt is not None else earlier.attempt,
            state=update.state if update.state is not None else earlier.state,
            result=update.result if update.result is not None else earlier.result,
            error_code=update.error_code or earlier.error_code,
            error_message=update.error_message or earlier.error_message,
            at=update.at or earlier.at,
            reset=update.reset or earlier.reset,
        )
    return list(merged.values())


def _entity_exists(error: TableTransactionError) -> bool:
    # Only a row that already exists; a 409 can also mean e.g. a table being deleted.
    return error.status_code == 409 and getattr(error, "error_code", None) == "EntityAlreadyExists"


def _fmt(in_flight: tuple[str | None, int, str]) -> str:
    step, attempt, operation = in_flight
    return f"{operation} {step} attempt {attempt}"


def _describe(response: AgentResponse) -> str:
    text = f"{response.operation} {response.step} attempt {response.attempt}: {response.outcome}"
    if response.error_code:
        text += f" ({response.error_code}{', transient' if response.transient else ''})"
    if response.error_message:
        text += f": {response.error_message}"
    return text
