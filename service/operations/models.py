"""What operator operations return: JSON-ready pydantic models (``model_dump(mode="json")``).

The operator API's OpenAPI document (FastAPI's, :mod:`operator_api.app`) is generated from these
same models; the listings' query parameters are in :mod:`service.operations.queries`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from adapters.store.records import OrderRecord
from domain.order import Order, StepRecord, TimelineEntry, valid_trace_parent
from service.control import Action, Outcome
from service.operations.step_activity import StepActivity, step_activity


def trace_id_of(trace_parent: str | None) -> str | None:
    """The 32-hex-digit trace id of a valid ``traceparent`` (Application Insights' operation
    id), else None."""
    valid = valid_trace_parent(trace_parent)
    return None if valid is None else valid[3:35]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class _Body(BaseModel):
    """A request body: unknown fields and values of another type (no coercion) are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _attributes(source: object, names: Iterable[str]) -> dict[str, Any]:
    """The attributes ``names`` of ``source``: the fields a view shares with what it shows."""
    return {name: getattr(source, name) for name in names}


def _operator(who: str = "who acts is the signed-in caller") -> Any:
    """A body's ``operator``: ignored, since a body says whatever its sender wants."""
    return Field(default=None, max_length=128, description=f"Ignored: {who}")


def _reason(description: str = "Why (required)") -> Any:
    return Field(default=None, description=description, max_length=1024)


class ActionRequest(_Body):
    """Body of a cancel or resubmit."""

    operator: str | None = _operator(
        "who acts is the caller App Service Authentication signed in "
        "(X-MS-CLIENT-PRINCIPAL-NAME), recorded as operator:<name>"
    )
    reason: str | None = _reason()


class RestartRequest(ActionRequest):
    """Body of a restart: the step to redo from, and why."""

    step: str | None = Field(
        default=None,
        description="The step to redo from (required): one of the order's workflow version",
        max_length=64,
    )


class OrderFilterBody(_Body):
    """Which orders: the same filters as GET /orders (every one optional, at least one given)."""

    state: str | None = Field(
        default=None,
        description="resubmit: Error (the default); cancel: Pending or Processing (default both)",
        max_length=20,
    )
    step: str | None = Field(default=None, description="The order's current step", max_length=64)
    older_than: str | None = Field(
        default=None, description="Created longer ago than this: 90s, 15m, 2h, 7d", max_length=12
    )
    newer_than: str | None = Field(
        default=None, description="Created more recently than this", max_length=12
    )
    text: str | None = Field(
        default=None,
        description="Found in the order id, last error or compensation reason (any case)",
        max_length=200,
    )


class BulkRequest(OrderFilterBody):
    """Body of a bulk resubmit or cancel."""

    operator: str | None = _operator()
    reason: str | None = _reason()
    dry_run: bool = Field(default=False, description="Only list the orders that would be acted on")
    order_ids: list[str] | None = Field(
        default=None,
        max_length=100,
        description="Act only on these (those a dry run listed), each only if it still "
        "matches the filter",
    )
    limit: int = Field(default=100, ge=1, le=100, description="Orders acted on at most")


class AckRequest(_Body):
    """Body of an alert acknowledgement."""

    operator: str | None = _operator("who acknowledges is the signed-in caller")
    reason: str | None = _reason(
        "Why (required): recorded in the order's timeline when the alert names one"
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
    compensating_since: datetime | None = Field(
        default=None,
        description="When its latest compensation began: an undo that fails or times out is "
        "retried until COMPENSATION_BUDGET_SECONDS after this (null: it never compensated)",
    )
    reply_to: str | None
    created_at: datetime
    updated_at: datetime
    settling: list[str] = Field(
        default_factory=list,
        description="Processed or Error only: the steps an answer to a request the order sent "
        "may still change (outcome unknown, or an undo not answered); while there are any the "
        "order is settling and records those answers. Empty: settled, only an operator "
        "changes it now",
    )

    @classmethod
    def of(cls, p: Order) -> OrderSummary:
        return cls(
            **_attributes(p, cls.model_fields.keys() - {"compensating_since", "settling"}),
            compensating_since=p.compensation_started_at,
            settling=[s.name for s in p.open_steps] if p.settling else [],
        )


class OrderPage(_Model):
    state: str
    sort: str = Field(
        default="index",
        description="index (the source's key order), id, created, updated; -created and "
        "-updated: newest first",
    )
    filters: dict[str, str] = Field(
        default_factory=dict, description="The filters applied: step, older_than, newer_than, text"
    )
    items: list[OrderSummary]
    continuation: str | None = Field(
        description="Pass as `continuation` for the next page; null when there is no more. "
        "A page may hold fewer items than `limit` (even none) and still have one."
    )
    scanned: int = Field(
        description="Rows looked at for this page (index rows cost a point read each)"
    )
    partial: bool = Field(
        default=False,
        description="Sorted listings: the candidates did not all fit in one read, so the "
        "order covers only the `scanned` read; narrow the filter",
    )


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
    started_at: datetime | None = Field(
        default=None, description="When its latest run's first request was sent (timeline)"
    )
    duration_s: float | None = Field(
        default=None,
        description="From started_at to its answer, or to now while it runs (null: unknown)",
    )
    requests: int = Field(default=0, description="Forward requests of its latest run")
    failures: int = Field(
        default=0, description="Failed attempts (transient errors, missed deadlines), all runs"
    )
    deferrals: int = Field(default=0, description="Attempts put off by an open circuit")
    reasons: list[str] = Field(
        default_factory=list,
        description="Why attempts failed, were deferred or answered late (latest 10, oldest "
        "first), from the timeline",
    )

    @classmethod
    def of(cls, s: StepRecord, activity: StepActivity | None = None) -> StepView:
        """The step as recorded, and its activity (from the timeline) when given."""
        measured = {"started_at", "duration_s", "requests", "failures", "deferrals", "reasons"}
        done = _attributes(activity, measured) if activity is not None else {}
        return cls(**_attributes(s, cls.model_fields.keys() - measured), **done)


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
        return cls.model_validate(t, from_attributes=True)


class OrderDetail(_Model):
    order: OrderSummary
    submitted: dict[str, JsonValue] = Field(description="The OrderSubmitted message as stored")
    steps: list[StepView]
    timeline: list[TimelineView]
    timeline_continuation: int | None = Field(
        description="Pass as `timeline_after` for more timeline entries; null at the end"
    )
    trace_id: str | None = Field(
        default=None,
        description="The order's trace id (32 hex digits; null if the order records none): "
        "every hop, recovery and operator action of the order is in that trace. Search it as "
        "the operation id in Application Insights; locally, `orderctl trace ORDER-ID`",
        pattern=r"^[0-9a-f]{32}$",
    )

    @classmethod
    def of(
        cls,
        order: OrderRecord,
        timeline: list[TimelineEntry],
        more: bool,
        *,
        history: list[TimelineEntry] | None = None,
        now: datetime | None = None,
    ) -> OrderDetail:
        """``timeline``: the page shown; ``history``: the whole timeline, which each step's
        activity is read from (default: the page); ``now``: for a step still running."""
        now = now or order.process.updated_at
        activity = step_activity(order.steps, timeline if history is None else history, now)
        return cls(
            order=OrderSummary.of(order.process),
            submitted=order.details.model_dump(mode="json"),
            steps=[StepView.of(s, activity.get(s.name)) for s in order.steps],
            timeline=[TimelineView.of(t) for t in timeline],
            timeline_continuation=timeline[-1].seq if more and timeline else None,
            trace_id=trace_id_of(order.process.trace_parent),
        )


class ActionView(_Model):
    """What a cancel or resubmit did."""

    order_id: str
    action: Action
    outcome: Outcome = Field(
        description="cancel: compensating (every step that may have taken effect, the one in "
        "flight too, is being undone; Error 'cancelled' follows) or failed (nothing to undo: "
        "Error now). resubmit: resubmitted (resumes at the first step not done, next "
        "generation) or compensation_resumed (the undos left are retried, same generation). "
        "restart: restarted (the named step and every later one are redone, next generation)"
    )
    state: str
    step: str | None
    generation: int
    requested_by: str
    detail: str


Resolution = Literal["open", "retrying", "resolved", "superseded", "order_gone"]


class AlertView(_Model):
    sequence_number: int = Field(description="The alert's id in the alerts queue")
    message_id: str | None
    enqueued_at: datetime | None
    alert: dict[str, JsonValue] | None = Field(description="The OperatorAlert message")
    raw: str | None = Field(description="Excerpt of a body that is not a valid OperatorAlert")
    problem: str | None = Field(description="Why `raw` could not be read as an alert")
    resolution: Resolution = Field(
        default="open",
        description="From the order's state and timeline now: open (nothing has changed it), "
        "retrying (the order was resubmitted or restarted and is in flight), resolved (the "
        "order is Processed now; a compensation_delayed warning: the order no longer "
        "compensates), superseded (the order failed again later: a newer alert "
        "stands), order_gone (the order no longer exists: purged). An alert naming no order "
        "is open until acknowledged",
    )
    order_state: str | None = Field(default=None, description="The named order's state now")


class AlertPage(_Model):
    items: list[AlertView]
    continuation: str | None
    open_only: bool = Field(
        default=False, description="Only open and retrying alerts are listed (`open=true`)"
    )


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


class DeadLetterActionRequest(_Body):
    """Body of a dead-letter replay or purge: which messages, and whether to change anything."""

    operator: str | None = _operator()
    sequence_numbers: list[int] | None = Field(
        default=None, max_length=100, description="These dead letters (their sequence numbers)"
    )
    all: bool = Field(
        default=False,
        description="Every dead letter of the queue (up to `limit`)",
        serialization_alias="everything",  # the use case's keyword
    )
    dry_run: bool = Field(default=False, description="Only say what would be done")
    reason: str | None = _reason(
        "Why (required unless dry_run): recorded in the timeline of each order a message "
        "names, and in the dead-letter log"
    )
    limit: int = Field(default=100, ge=1, le=100, description="Dead letters examined at most")


DeadLetterOutcomeKind = Literal[
    "replayed", "purged", "would_replay", "would_purge", "refused", "not_found", "failed"
]


class DeadLetterOutcome(_Model):
    sequence_number: int
    message_id: str | None
    order_id: str | None = Field(
        description="The order the message names (only trusted for the app's signed messages "
        "and for submissions)"
    )
    outcome: DeadLetterOutcomeKind = Field(
        description="replayed (sent back to its queue, then removed from the dead letters), "
        "purged (removed), would_replay / would_purge (dry run), refused (not replayed: "
        "see detail; it stays), not_found (no such dead letter), failed (see detail; it stays)"
    )
    detail: str
    recorded_in_timeline: bool = Field(description="The action is in the order's timeline")


class DeadLetterActionView(_Model):
    """What a dead-letter replay or purge did (or, in a dry run, would do)."""

    action: Literal["replay", "purge"]
    queue: str
    entity: str
    dry_run: bool
    items: list[DeadLetterOutcome]
    more: bool = Field(description="More dead letters were left unexamined: call again")
    recorded_in_log: bool = Field(
        default=False,
        description="The action (who, why, each message's outcome) is in the dead-letter log; "
        "false for a dry run, or if the log could not be written (the action stands)",
    )


class LoggedDeadLetter(_Model):
    """One message of a logged dead-letter action, and what became of it."""

    sequence_number: int
    message_id: str | None
    order_id: str | None = Field(description="The order the message names, if trusted")
    outcome: str = Field(description="replayed, purged, refused, not_found or failed")


class DeadLetterLogEntry(_Model):
    """One dead-letter replay or purge an operator ran (never a dry run)."""

    at: datetime
    actor: str = Field(description="Who acted: operator:<name>")
    action: str = Field(description="replay or purge")
    queue: str = Field(description="The queue role (orders, responses, ...)")
    reason: str = Field(description="Why, as the operator wrote it")
    messages: int = Field(description="Messages listed in `outcomes`")
    counts: dict[str, int] = Field(description="Messages listed, by outcome")
    outcomes: list[LoggedDeadLetter]
    truncated: bool = Field(
        description="The list of messages was too long to store whole: `outcomes` holds a part"
    )


class DeadLetterLogView(_Model):
    actions: list[DeadLetterLogEntry] = Field(
        description="Dead-letter replays and purges, newest first"
    )


class BucketView(_Model):
    bucket: int
    holder: str | None = Field(description="The instance whose lease is current, if any")
    leased_until: datetime | None
    swept_at: datetime | None = Field(description="When the last full sweep of it started")
    swept_by: str | None
    lag_s: float = Field(description="Seconds the most overdue order was due at that sweep")
    due_found: int = Field(description="Rows due at the latest tick that held it")
    dispatched: int = Field(description="Of those, rows that tick handed out to the instances")
    returned: int = Field(
        description="Rows of the hand-out before found due again: nobody moved them on in time"
    )
    drain_rate: float = Field(description="Rows a second of this bucket the instances moved on")
    left: int = Field(description="Rows due that tick neither handled nor handed out")


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
    backlog: int = Field(description="Rows due at the latest tick of each bucket, summed")
    left: int = Field(
        description="Of those, rows no tick handled or handed out (they wait for the next)"
    )
    drain_rate: float = Field(
        description="Rows a second the app's instances moved on, as the latest ticks measured"
    )
    time_to_drain_s: float | None = Field(
        description="The backlog at that rate (null: rows are due and none was moved on yet)"
    )
    drains_within_period: bool = Field(
        description="Whether the backlog drains within a period and no tick left rows for later: "
        "the recovery bound holds only while it does"
    )
    bound: dict[str, float] = Field(
        description="The recovery bound computed from the settings (seconds): period, budget, "
        "lease, skew_s (the tolerated clock skew), detection_s (deadline to the Supervisor "
        "acting), stall_s"
    )
    buckets: list[BucketView]


class BulkItem(_Model):
    order_id: str
    order: OrderSummary | None = Field(
        description="The order as it was when selected (null: it no longer exists)"
    )
    outcome: str = Field(
        description="would_resubmit / would_cancel (dry run), the action's outcome "
        "(resubmitted, compensation_resumed, compensating, failed), skipped (it no longer "
        "matches the filter) or refused (see detail)"
    )
    detail: str
    state: str | None = Field(description="The order's state after the action")


class BulkView(_Model):
    """What a bulk resubmit or cancel did (or, in a dry run, would do)."""

    action: Literal["resubmit", "cancel"]
    dry_run: bool
    states: list[str]
    filters: dict[str, str]
    items: list[BulkItem]
    acted: int = Field(description="Orders the action was carried out on")
    more: bool = Field(description="More orders match than `limit`: run it again")


class WatchView(_Model):
    """One change of an order (`GET /orders/{id}/watch`): its state now, and the timeline
    entries new since `after`."""

    changed: bool = Field(description="False: nothing new within `wait` seconds")
    terminal: bool = Field(
        description="Processed or Error: the order has ended (one still settling may record "
        "late answers: `detail.order.settling`)"
    )
    detail: OrderDetail


class HealthCheck(_Model):
    name: Literal["settings", "table", "servicebus"]
    ok: bool
    detail: str
    duration_ms: float


class HealthView(_Model):
    """`GET /health`: whether this app can work (200) or not (503), checked cheaply."""

    status: Literal["ok", "failing"]
    checks: list[HealthCheck]


class ErrorDetail(_Model):
    code: str
    message: str


class ErrorBody(_Model):
    error: ErrorDetail


class PurgeBody(_Body):
    """Body of a purge: which finished orders, how old, and whether to change anything."""

    operator: str | None = _operator("who purges is the signed-in caller (recorded with the run)")
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
