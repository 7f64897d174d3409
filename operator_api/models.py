"""What operator operations return: JSON-ready pydantic models (``model_dump(mode="json")``).

The OpenAPI document (:mod:`operator_api.openapi`) is generated from these same models.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from core.order import Order, StepRecord, TimelineEntry
from core.state_models import OrderRecord
from scheduler.control import Outcome


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class ActionRequest(BaseModel):
    """Body of a cancel or resubmit."""

    model_config = ConfigDict(extra="forbid", strict=True)

    operator: str | None = Field(
        default=None,
        description="Ignored: who acts is the caller App Service Authentication signed in "
        "(X-MS-CLIENT-PRINCIPAL-NAME), recorded as operator:<name>",
        max_length=128,
    )
    reason: str | None = Field(default=None, description="Why (required)", max_length=1024)


class AckRequest(BaseModel):
    """Body of an alert acknowledgement."""

    model_config = ConfigDict(extra="forbid", strict=True)

    operator: str | None = Field(
        default=None,
        max_length=128,
        description="Ignored: who acknowledges is the signed-in caller",
    )


class OrderSummary(_Model):
    """The pattern's process record of one order, as operators see it."""

    order_id: str
    workflow: str
    state: str = Field(description="Pending, Processing, Compensating, Processed or Error")
    generation: int = Field(description="Goes up with each resubmission; part of idempotency keys")
    attempt: int = Field(description="Agent requests sent for this order, all steps together")
    failure_count: int
    current_step: str | None
    current_operation: Literal["do", "undo"]
    locked_by: str | None
    complete_by: datetime | None
    next_attempt_at: datetime | None = Field(description="When the next retry is due")
    last_error: str | None
    compensation_cause: str | None = Field(
        description="Why the order is being (or was) undone: step_declined, failure_threshold "
        "or cancelled"
    )
    compensation_reason: str | None = Field(
        description="The failure or cancellation that started the compensation, in words "
        "(a cancellation names the operator)"
    )
    reply_to: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, p: Order) -> OrderSummary:
        return cls(
            order_id=p.order_id,
            workflow=p.workflow,
            state=p.state.value,
            generation=p.generation,
            attempt=p.attempt,
            failure_count=p.failure_count,
            current_step=p.current_step,
            current_operation=p.current_operation,
            locked_by=p.locked_by,
            complete_by=p.complete_by,
            next_attempt_at=p.next_attempt_at,
            last_error=p.last_error,
            compensation_cause=p.compensation_cause,
            compensation_reason=p.compensation_reason,
            reply_to=p.reply_to,
            created_at=p.created_at,
            updated_at=p.updated_at,
        )


class OrderPage(_Model):
    state: str
    items: list[OrderSummary]
    continuation: str | None = Field(
        description="Pass as `continuation` for the next page; null when there is no more. "
        "A page may hold fewer items than `limit` (even none) and still have one."
    )
    scanned: int = Field(description="Index rows looked at for this page")


class StepView(_Model):
    name: str
    index: int
    state: str = Field(
        description="Pending (not requested), Running (outcome unknown), Succeeded, Failed "
        "(refused: no effect), Compensated (undone) or Voided (never took effect; refused for "
        "ever)"
    )
    generation: int = Field(
        description="Generation of the step's idempotency key last requested (0: never requested)"
    )
    attempt: int = Field(
        description="Requests sent for this step, forward and undo (counted afresh when a "
        "resubmit redoes the step)"
    )
    result: dict[str, JsonValue] | None
    error_code: str | None
    error_message: str | None
    completed_at: datetime | None
    compensated_at: datetime | None

    @classmethod
    def of(cls, s: StepRecord) -> StepView:
        return cls(
            name=s.name,
            index=s.index,
            state=s.state.value,
            generation=s.generation,
            attempt=s.attempt,
            result=s.result,
            error_code=s.error_code,
            error_message=s.error_message,
            completed_at=s.completed_at,
            compensated_at=s.compensated_at,
        )


class TimelineView(_Model):
    seq: int
    at: datetime
    actor: str = Field(description="Who: a scheduler/supervisor instance or operator:<name>")
    event: str
    from_state: str | None
    to_state: str
    step: str | None
    attempt: int
    detail: str

    @classmethod
    def of(cls, t: TimelineEntry) -> TimelineView:
        return cls(
            seq=t.seq,
            at=t.at,
            actor=t.actor,
            event=t.event,
            from_state=t.from_state.value if t.from_state else None,
            to_state=t.to_state.value,
            step=t.step,
            attempt=t.attempt,
            detail=t.detail,
        )


class OrderDetail(_Model):
    order: OrderSummary
    submitted: dict[str, JsonValue] = Field(description="The OrderSubmitted message as stored")
    steps: list[StepView]
    timeline: list[TimelineView]
    timeline_continuation: int | None = Field(
        description="Pass as `timeline_after` for more timeline entries; null at the end"
    )

    @classmethod
    def of(cls, order: OrderRecord, timeline: list[TimelineEntry], more: bool) -> OrderDetail:
        return cls(
            order=OrderSummary.of(order.process),
            submitted=order.details.model_dump(mode="json"),
            steps=[StepView.of(s) for s in order.steps],
            timeline=[TimelineView.of(t) for t in timeline],
            timeline_continuation=timeline[-1].seq if more and timeline else None,
        )


class ActionView(_Model):
    """What a cancel or resubmit did."""

    order_id: str
    action: Literal["cancel", "resubmit"]
    outcome: Outcome = Field(
        description="cancel: compensating (every step that may have taken effect, the one in "
        "flight too, is being undone; Error 'cancelled' follows) or failed (nothing to undo: "
        "Error now). resubmit: resubmitted (resumes at the first step not done, next "
        "generation) or compensation_resumed (the undos left are retried, same generation)"
    )
    state: str
    step: str | None
    generation: int
    requested_by: str
    detail: str


class AlertView(_Model):
    sequence_number: int = Field(description="The alert's id in the alerts queue")
    message_id: str | None
    enqueued_at: datetime | None
    alert: dict[str, JsonValue] | None = Field(description="The OperatorAlert message")
    raw: str | None = Field(description="Excerpt of a body that is not a valid OperatorAlert")
    problem: str | None = Field(description="Why `raw` could not be read as an alert")


class AlertPage(_Model):
    items: list[AlertView]
    continuation: str | None


class AckView(_Model):
    sequence_number: int
    message_id: str | None
    order_id: str | None
    acknowledged_by: str
    recorded_in_timeline: bool = Field(
        description="True when the alert names an order and the ack is in its timeline"
    )


class DeadLetterView(_Model):
    sequence_number: int
    message_id: str | None
    enqueued_at: datetime | None
    delivery_count: int | None
    reason: str | None = Field(description="DeadLetterReason")
    description: str | None = Field(description="DeadLetterErrorDescription")
    subject: str | None
    body: JsonValue | None = Field(description="The body as JSON, when it is JSON and small")
    raw: str | None = Field(description="Excerpt of a body shown as text instead")


class DeadLetterPage(_Model):
    queue: str = Field(description="The queue's role: orders, commands, responses, ...")
    entity: str = Field(description="The Service Bus queue name")
    items: list[DeadLetterView]
    continuation: str | None


class DeadLetterCount(_Model):
    queue: str
    entity: str
    count: int = Field(description="Dead letters seen, up to `limit`")
    more: bool = Field(description="True when there are more than `count`")


class DeadLetterSummary(_Model):
    queues: list[DeadLetterCount]


class BucketView(_Model):
    bucket: int
    holder: str | None = Field(description="The instance whose lease is current, if any")
    leased_until: datetime | None
    swept_at: datetime | None = Field(description="When the last full sweep of it started")
    swept_by: str | None
    lag_s: float = Field(description="Seconds the most overdue order was due at that sweep")
    due_found: int = Field(description="Rows due at that sweep")


class SupervisorView(_Model):
    lag_s: float = Field(
        description="The most overdue order the latest sweep of each bucket found, in seconds"
    )
    oldest_sweep_s: float | None = Field(
        description="Seconds since the least recently swept bucket was swept (null: never)"
    )
    unswept_buckets: list[int] = Field(
        description="Buckets never swept, or not swept within the detection bound"
    )
    holders: dict[str, int] = Field(description="Instance -> buckets it holds now")
    bound: dict[str, float] = Field(
        description="The recovery bound computed from the settings (seconds): period, budget, "
        "lease, detection_s (deadline to the Supervisor acting), stall_s"
    )
    buckets: list[BucketView]


class ErrorDetail(_Model):
    code: str
    message: str


class ErrorBody(_Model):
    error: ErrorDetail


class PurgeBody(BaseModel):
    """Body of a purge: which finished orders, how old, and whether to change anything."""

    model_config = ConfigDict(extra="forbid", strict=True)

    operator: str | None = Field(
        default=None,
        max_length=128,
        description="Ignored: who purges is the signed-in caller (recorded with the run)",
    )
    state: Literal["Processed", "Error", "all"] = Field(
        default="all",
        description="Processed, Error (only those resolved: terminal alert acknowledged after "
        "the order last entered Error) or all (both)",
    )
    older_than_days: int | None = Field(
        default=None,
        ge=1,
        le=3650,
        description="Purge orders last changed more than this many days ago. Default: the "
        "RETENTION_DAYS setting (required when that is 0)",
    )
    dry_run: bool = Field(default=False, description="Only count what would be purged")
    limit: int = Field(
        default=1000, ge=1, le=10_000, description="Candidates examined at most in this call"
    )


class PurgeView(_Model):
    """What one purge run did. Orders are archived first, then deleted."""

    run_id: str
    requested_by: str
    dry_run: bool
    states: list[str]
    older_than_days: float
    cutoff: datetime = Field(description="Orders last changed before this were candidates")
    started_at: datetime
    finished_at: datetime | None
    examined: int = Field(description="Candidates read whole and decided on")
    purgeable: int = Field(description="Found purgeable (in a dry run: would be purged)")
    archived: int = Field(description="Appended to the archive (before their deletion)")
    purged: int = Field(description="Deleted from the orders table")
    skipped_changed: int = Field(
        description="Changed between reading and deleting (resubmitted, annotated): untouched"
    )
    already_gone: int
    kept: dict[str, int] = Field(
        description="Examined but kept, by reason: too_recent, unresolved_error, owes_messages "
        "(its final messages may not be sent yet), state_not_selected, in_flight"
    )
    interrupted_finished: int = Field(description="Interrupted purges this run finished")
    failed: int = Field(description="Orders that could not be read (see the logs)")
    more: bool = Field(description="Candidates are left: call again (or wait for the timer)")
    blobs: list[str] = Field(description="Archive blobs appended to")


class PurgeRunsView(_Model):
    runs: list[PurgeView] = Field(description="Recorded purge runs, newest first")


class ArchivedOrderView(_Model):
    """An order read back from the archive (the latest copy, when archived more than once)."""

    archived_at: datetime
    run_id: str
    copies: int = Field(description="Copies found in its day's blob (a retried purge makes 2)")
    order: OrderDetail
