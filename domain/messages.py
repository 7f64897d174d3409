"""Message schemas for every queue, with one strict parser and one encoder.

Every message is a frozen pydantic model that forbids unknown fields and carries
``schema_version`` (1) and a ``type`` discriminator. Datetimes must be timezone-aware and are
normalised to UTC; naive datetimes are rejected.

Money is integer cents (the currency's minor unit; for a currency without one, such as JPY, one
"cent" is one unit). Integers are exact in every JSON parser and fit a Table ``Edm.Int64``; a
``Decimal`` would travel as a string or as a float that other languages round, and Table
Storage has no decimal type.

Wire rules enforced by :func:`parse_message`, each failure raised as :class:`BadMessage` with a
reason a person can act on: at most 256 KiB, UTF-8, one JSON object, no duplicate keys, no
NaN/Infinity, a ``type`` equal to the expected one, ``schema_version`` 1, and the schema
validated strictly (no string-to-number coercion).

Message ids (:func:`message_id_for`) are deterministic, so a send repeated after a crash carries
the same id and Service Bus duplicate detection drops the copy. Each names exactly one message:
it is made of everything that tells that message from any other, so duplicate detection drops
copies and only copies (issue 39). What an id leaves out is what two copies of one message may
differ in, and the rule says why:

==================  ===========================================================================
OrderSubmitted      ``sub:<order_id>:<content_hash[:16]>`` - the same order sent twice dedupes
                    (the hash leaves out ``submitted_at``: a client's retry restamps it); a
                    different payload under the same id gets through and is rejected visibly.
AgentRequest        ``req:<idempotency_key>:<attempt>``, the key being
                    ``<order_id>:<step>:<operation>:<generation>`` - one request per attempt of
                    one key. The order's attempt counts every claim of the order, across steps
                    and generations, and each claim sends one request, made from the order as
                    that claim wrote it (action, payload, deadlines, the key undone): so no two
                    requests the app makes share order, key and attempt.
AgentResponse       ``rsp:<idempotency_key>:<attempt>`` - the answer to one request, whatever a
                    redelivered request makes the agent answer the second time (the service
                    answers one key once; the Scheduler applies one answer per request). An
                    answer to a request for another key - another generation, a key never sent
                    - is another message and reaches the Scheduler, which refuses and alerts it
                    if the order never sent that request.
SchedulerCommand    ``cmd:<order_id>:<command>:<failure_count>:<attempt>`` - one command per
                    recovery decision: each release of an order is decided by one conditional
                    write, at an attempt and failure count no other release of it has (a
                    release follows a claim, which moves the attempt, or counts a failure);
                    reason, author and time are that decision's.
SendOwed            ``owed:<order_id>:<timeline_seq>`` - the operations app's request that the
                    pattern app send what one write of the order left owing: one conditional
                    write assigns each timeline number, and no later one reuses it. Copies may
                    differ in when they were asked.
ReplayDeadLetter    ``replay:<queue role>:<sequence_number>`` - one dead letter sent back: Service
                    Bus numbers each message of a queue once, and a dead letter keeps its number
                    (a replayed copy that dies again is another message, with another number).
                    A replay asked for again after a crash is the same message.
DueRows             ``due:<bucket>:<sha256 of the rows, each with the due time it was found at>``
                    - one hand-out of index rows by a Supervisor tick. The tick hands a row out
                    only on a write conditional on the row as found, which moves its due time:
                    the same rows found at the same due times are the same hand-out (a send
                    repeated after a lost answer), and a row that comes due again (its lease
                    over, nobody moved it on) is found at a new due time, so its next hand-out
                    is another message. Copies may differ in the lease, the sender and the
                    write id, which the hand-out's own write sets.
StatusUpdate        ``st:<order_id>:<sequence>`` - the order's status sequence number, which one
                    conditional write assigns and no later one reuses (not even a resubmission).
OperatorAlert       ``alert:<order_id or ->:<reason>:`` and what makes the event it reports one:
                    ``<caused_by>`` for an alert raised while handling a message (the queue's
                    role and the message's MessageId): one per message, however often it is
                    redelivered and whichever instance handles it, never merged with another
                    message's; else ``<timeline_seq>:<sha(detail, excerpt)[:16]>`` for an
                    alert an order's write raises (its entry into Error, a long compensation's
                    ``compensation_delayed`` warning): one per order write that raises it,
                    however often its outbox is sent and whichever message brings the next
                    write that sends it; else ``<sha(detail, excerpt)[:16]>`` for a condition
                    (an order parked on a missing workflow version, a reply queue that refuses):
                    repeats within the duplicate-detection window are one alert.
==================  ===========================================================================

Every rule names an order by its id, which stays taken until the order is purged, a day after
it finished at the soonest (``RETENTION_DAYS``): far outside Service Bus's ten-minute
duplicate-detection window. No id depends on ``resume`` (the order's snapshot a request and
its reply carry, :mod:`service.resume`): a request resent with a later snapshot is the same
message, and duplicate detection drops it like any resend. The longest request or answer id (a
64-character order id, a 40-character step, ``undo``, generation 9999, attempt 1,000,000) is
127 characters; any id longer than Service Bus's 128 (an alert naming a long MessageId) is
replaced by ``<prefix>:<sha256 of the long id, 40 hex>``, still deterministic.

Changing a rule is safe during a rolling deploy (the ``req:`` and ``rsp:`` ids gained the
generation in issue 39): no receiver parses a MessageId or checks it against the body (the
signature covers the MessageId a message came with, :mod:`domain.signing`), and the app
compares ids only of messages it holds, computed by one rule. So a message in flight under the
earlier rule is handled as before. What it costs is that a message sent once under each rule
(resent from the outbox by an instance of the other version, or answered again by one) is not
recognised as a copy and arrives twice, which every handler takes as it takes a redelivery
after the duplicate-detection window: the idempotency key, an answer for a step already
recorded, a status update by its sequence.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, ClassVar, Final, Literal, TypeVar

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    StrictInt,
    ValidationError,
    model_validator,
)

from domain import ids
from domain.agents import AGENT_NAMES
from domain.workflows import DEFAULT_WORKFLOW, MAX_VERSION, WORKFLOW_NAMES

MAX_MESSAGE_BYTES: Final = 256 * 1024
MAX_RAW_EXCERPT_BYTES: Final = 2048
MAX_DETAIL_BYTES: Final = 4096
MAX_ERROR_MESSAGE_BYTES: Final = 2048
MAX_MESSAGE_ID_LENGTH: Final = 128
MAX_CAUSE_CHARS: Final = 200
"""An alert's ``caused_by``: a queue role, ``/`` and a MessageId (at most 128 characters)."""
MAX_ITEMS: Final = 100
MAX_QUANTITY: Final = 1_000_000
MAX_UNIT_PRICE_CENTS: Final = 10**12
MAX_TOTAL_CENTS: Final = 10**15
"""Far above any real order, far below Int64 (about 9.2e18), the Table integer type."""
MAX_ATTEMPT: Final = 1_000_000
MAX_RESUME_CHARS: Final = 64 * 1024
"""The largest ``resume`` snapshot a message carries (a three-step order's is 2.7-3.9 KB):
with it, a request or a reply stays far below the 256 KiB a message may hold."""
_MAX_ERRORS_SHOWN: Final = 5
_TRUNCATED: Final = "...[truncated]"


def utc_now() -> datetime:
    return datetime.now(UTC)


def truncate_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` UTF-8 bytes, never inside a character, marked.

    Unpaired surrogates (which no UTF-8 encoder accepts) become '?', so the result always encodes.
    """
    encoded = text.encode("utf-8", errors="replace")
    if len(encoded) <= max_bytes:
        return encoded.decode("utf-8")
    budget = max(0, max_bytes - len(_TRUNCATED))
    return encoded[:budget].decode("utf-8", errors="ignore") + _TRUNCATED


def excerpt(body: bytes | str, max_bytes: int = MAX_RAW_EXCERPT_BYTES) -> str:
    """A printable, bounded excerpt of a raw message body for an alert (any bytes accepted)."""
    if isinstance(body, bytes):
        # Decode only what can be shown: slicing first keeps this cheap for large bodies.
        head = body[: max_bytes * 4]
        text = head.decode("utf-8", errors="backslashreplace")
        if len(head) < len(body):
            text += _TRUNCATED
    else:
        text = body[: max_bytes * 4]
    return truncate_utf8(text, max_bytes)


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


def _iso_only(value: Any) -> Any:
    # pydantic would read a number as a Unix timestamp; the wire format is ISO 8601 only.
    if isinstance(value, int | float):
        raise ValueError("expected an ISO 8601 date-time string with a UTC offset")
    return value


def _absent(value: object) -> bool:
    return value is None


def _truncator(max_bytes: int) -> BeforeValidator:
    return BeforeValidator(lambda v: truncate_utf8(v, max_bytes) if isinstance(v, str) else v)


UtcDatetime = Annotated[AwareDatetime, BeforeValidator(_iso_only), AfterValidator(_to_utc)]
OrderId = Annotated[str, AfterValidator(ids.validate_order_id)]
CustomerId = Annotated[str, AfterValidator(lambda v: ids.validate_id(v, "customer id"))]
Sku = Annotated[str, AfterValidator(ids.validate_sku)]
StepName = Annotated[str, AfterValidator(lambda v: ids.validate_name(v, "step name"))]
ActionName = Annotated[str, AfterValidator(lambda v: ids.validate_name(v, "action name"))]
ReasonCode = Annotated[str, AfterValidator(lambda v: ids.validate_name(v, "reason"))]
QueueName = Annotated[str, AfterValidator(lambda v: ids.validate_entity_name(v, "reply_to"))]
Actor = Annotated[str, AfterValidator(ids.validate_instance_id)]
ErrorCode = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
Severity = Literal["warning", "error", "critical"]
Currency = Annotated[str, Field(pattern=r"^[A-Z]{3}$")]
Attempt = Annotated[StrictInt, Field(ge=1, le=MAX_ATTEMPT)]
MAX_RUN_BUDGET_S: Final = 86_400.0
RunBudget = Annotated[float, Field(gt=0, le=MAX_RUN_BUDGET_S, allow_inf_nan=False)]
Counter = Annotated[StrictInt, Field(ge=0, le=MAX_ATTEMPT)]
Detail = Annotated[str, _truncator(MAX_DETAIL_BYTES)]
Resume = Annotated[
    str | None,
    Field(max_length=MAX_RESUME_CHARS, pattern=r"^[A-Za-z0-9_.-]+$", exclude_if=_absent),
]
"""The order as stored when the message was sent (:mod:`service.resume`): the Scheduler decides on
it, an agent checks its request against it (:mod:`service.consistency`). Left out of the JSON
when absent, so a message without one is encoded as before."""
JsonObject = dict[str, JsonValue]

OrderStatus = Literal["Pending", "Processing", "Compensating", "Processed", "Error", "Rejected"]
"""What a StatusUpdate reports: a ProcessState, or Rejected for a refused submission."""
StatusEvent = Literal[
    "received",
    "step_started",
    "step_completed",
    "compensating",
    "step_compensated",
    "processed",
    "failed",
    "resubmitted",
]
"""What happened to the order: the transition a StatusUpdate reports."""


class MessageBase(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    MESSAGE_TYPE: ClassVar[str] = ""
    """The ``type`` literal of the concrete class, for routing and error messages."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.MESSAGE_TYPE = cls.model_fields["type"].default


def _non_empty(items: tuple[LineItem, ...]) -> tuple[LineItem, ...]:
    # Checked after the items, not with min_length: pydantic's min_length would also report
    # "0 items" whenever one item is invalid, which misleads whoever reads the alert.
    if not items:
        raise ValueError("an order needs at least one item")
    return items


class LineItem(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    sku: Sku
    quantity: Annotated[StrictInt, Field(gt=0, le=MAX_QUANTITY)]
    unit_price_cents: Annotated[StrictInt, Field(ge=0, le=MAX_UNIT_PRICE_CENTS)]

    @property
    def line_total_cents(self) -> int:
        return self.quantity * self.unit_price_cents


def _known_workflow(name: str) -> str:
    if name not in WORKFLOW_NAMES:
        raise ValueError(f"unknown workflow {name[:64]!r}; known: {', '.join(WORKFLOW_NAMES)}")
    return name


class OrderSubmitted(MessageBase):
    """An order to process. ``total_cents`` may be omitted; if given it must equal the sum."""

    type: Literal["OrderSubmitted"] = "OrderSubmitted"
    order_id: OrderId
    customer_id: CustomerId
    items: Annotated[tuple[LineItem, ...], Field(max_length=MAX_ITEMS), AfterValidator(_non_empty)]
    currency: Currency
    total_cents: Annotated[StrictInt, Field(ge=0, le=MAX_TOTAL_CENTS)]
    reply_to: QueueName | None = None
    workflow: Annotated[str, AfterValidator(_known_workflow)] = DEFAULT_WORKFLOW
    workflow_version: Annotated[StrictInt, Field(ge=1, le=MAX_VERSION)] | None = None
    """A version of ``workflow`` to run (None: the deployment's current one)."""
    submitted_at: UtcDatetime = Field(default_factory=utc_now)

    @model_validator(mode="before")
    @classmethod
    def _fill_total(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("total_cents") is None:
            total = _raw_total(data.get("items"))
            # With malformed items the sum is unknown or negative; 0 keeps total_cents out of the
            # error list, which then names only the items (the model check below does not run).
            data = {**data, "total_cents": 0 if total is None else max(total, 0)}
        return data

    @model_validator(mode="after")
    def _check_total(self) -> OrderSubmitted:
        expected = sum(item.line_total_cents for item in self.items)
        if self.total_cents != expected:
            raise ValueError(
                f"total_cents is {self.total_cents} but the items add up to {expected}"
            )
        return self

    def content_hash(self) -> str:
        """sha256 of the canonical JSON of everything but ``submitted_at``.

        Two submissions of one order are "the same payload" when this matches: a client that
        retries with a fresh timestamp is not a conflict; any change to what is ordered, by
        whom, for how much, or where status goes, is.
        """
        # Without a version the hash is what it was before versions, so a redelivery of a
        # submission made before they existed is still "the same payload".
        unset = {"workflow_version"} if self.workflow_version is None else set()
        content = self.model_dump(mode="json", exclude={"submitted_at", *unset})
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _raw_total(items: Any) -> int | None:
    """Sum of raw item dicts, or None when they are not well-formed (validation reports it)."""
    if not isinstance(items, list | tuple):
        return None
    total = 0
    for item in items:
        if isinstance(item, LineItem):
            total += item.line_total_cents
            continue
        if not isinstance(item, dict):
            return None
        quantity, price = item.get("quantity"), item.get("unit_price_cents")
        if type(quantity) is not int or type(price) is not int:
            return None
        total += quantity * price
    return total


class AgentRequest(MessageBase):
    """Scheduler -> agent: perform ``action`` (the remote operation) for one step attempt.

    An undo names the forward call it undoes (``undoes``, the step's ``do`` key of the same
    generation): the remote service undoes that call if it happened, and otherwise answers
    "nothing to undo" and refuses that key for ever after (see docs/remote-service-contract.md).

    ``complete_by`` is the attempt's deadline: an agent that picks the request up later drops
    it. ``run_budget_s`` is how long the call may take once an agent has started it (None, as
    from a Scheduler that predates it: until ``complete_by``).
    """

    type: Literal["AgentRequest"] = "AgentRequest"
    order_id: OrderId
    step: StepName
    operation: ids.Operation
    action: ActionName
    attempt: Attempt
    complete_by: UtcDatetime
    run_budget_s: RunBudget | None = None
    idempotency_key: str
    undoes: str | None = None
    payload: JsonObject = Field(default_factory=dict)
    requested_at: UtcDatetime = Field(default_factory=utc_now)
    resume: Resume = None
    """Attached when sent, never stored; the agent echoes it in its response unchanged."""

    @model_validator(mode="after")
    def _check_key(self) -> AgentRequest:
        key = _own_key(self)
        forward = str(key._replace(operation="do"))
        if self.operation == "undo" and self.undoes != forward:
            raise ValueError(f"an undo must name the forward key it undoes: undoes={forward!r}")
        if self.operation == "do" and self.undoes is not None:
            raise ValueError("a 'do' request undoes nothing; leave undoes out")
        return self

    @property
    def generation(self) -> int:
        return ids.parse_idempotency_key(self.idempotency_key).generation

    def run_deadline(self, started: datetime) -> datetime:
        """When a call started at ``started`` must stop: its run budget, within complete-by."""
        if self.run_budget_s is None:
            return self.complete_by
        return min(self.complete_by, started + timedelta(seconds=self.run_budget_s))


def _own_key(message: AgentRequest | AgentResponse) -> ids.IdempotencyKey:
    """``message``'s idempotency key, which must name its order, step and operation."""
    key = ids.parse_idempotency_key(message.idempotency_key)
    owner = f"{message.order_id}:{message.step}:{message.operation}"
    if f"{key.order_id}:{key.step}:{key.operation}" != owner:
        raise ValueError(f"idempotency_key {message.idempotency_key!r} does not belong to {owner}")
    return key


EXPIRED: Final = "expired"
"""The ``error_code`` of a transient failure an agent reports for a request it took up only
after its complete-by and never carried to the service: the attempt failed on our side."""


class AgentResponse(MessageBase):
    """Agent -> scheduler: the outcome of one step attempt, for the request's idempotency key.

    ``succeeded``: the service applied the operation (or had applied it before).
    ``failed``: needs an ``error_code``; ``transient`` says whether trying again may succeed
    (a decline is not transient: that key will never take effect). A transient failure coded
    :data:`EXPIRED` reached its agent only after complete-by: the service was not called.
    ``nothing_to_undo``: an undo whose forward call never took effect; the service now refuses
    that forward key for ever, so nothing is left in place.
    ``deferred``: the agent's circuit to its service is open; nothing was attempted, try again
    at ``retry_at``. Not a failure: an outage delays an order, it does not fail it.
    """

    type: Literal["AgentResponse"] = "AgentResponse"
    order_id: OrderId
    step: StepName
    operation: ids.Operation
    attempt: Attempt
    idempotency_key: str
    outcome: Literal["succeeded", "failed", "nothing_to_undo", "deferred"]
    transient: StrictBool = False
    error_code: ErrorCode | None = None
    error_message: Annotated[str, _truncator(MAX_ERROR_MESSAGE_BYTES)] | None = None
    retry_at: UtcDatetime | None = None
    result: JsonObject = Field(default_factory=dict)
    responded_at: UtcDatetime = Field(default_factory=utc_now)
    resume: Resume = None
    """The request's ``resume``, echoed unchanged: the Scheduler applies this answer to that
    state of the order without reading it first (:mod:`service.resume`)."""

    @model_validator(mode="after")
    def _check_outcome(self) -> AgentResponse:
        _own_key(self)
        if self.outcome == "failed":
            if self.error_code is None:
                raise ValueError("a failed response needs an error_code")
        elif self.transient or self.error_code is not None or self.error_message is not None:
            raise ValueError(
                f"a {self.outcome} response has no error_code, error_message or transient=true"
            )
        if (self.outcome == "deferred") != (self.retry_at is not None):
            raise ValueError("retry_at goes with a deferred response, and only with one")
        if self.outcome == "nothing_to_undo" and self.operation != "undo":
            raise ValueError("nothing_to_undo answers an undo only")
        return self

    @property
    def generation(self) -> int:
        return ids.parse_idempotency_key(self.idempotency_key).generation


class SchedulerCommand(MessageBase):
    """Scheduler or Supervisor -> scheduler: retry an order (operators act through the
    operations app: :mod:`service.control`).

    ``attempt`` and ``failure_count`` are the order's values when the command was decided; the
    scheduler ignores a command whose context is no longer current.
    """

    type: Literal["SchedulerCommand"] = "SchedulerCommand"
    order_id: OrderId
    command: Literal["retry"]
    attempt: Counter
    failure_count: Counter
    reason: Annotated[str, Field(min_length=1), _truncator(1024)]
    requested_by: Actor
    requested_at: UtcDatetime = Field(default_factory=utc_now)


class SendOwed(MessageBase):
    """Operations app -> scheduler-commands: send what order ``order_id`` owes.

    The operations app sends to this queue only (docs/architecture.md, "Two apps"): an
    operator's action it decided and wrote (timeline entry ``timeline_seq``, the order's
    outbox with it) is sent by the pattern app, which sends whatever the order owes when this
    arrives (:mod:`service.handover`).
    """

    type: Literal["SendOwed"] = "SendOwed"
    order_id: OrderId
    timeline_seq: Annotated[StrictInt, Field(ge=0)]
    requested_by: Actor
    requested_at: UtcDatetime = Field(default_factory=utc_now)


SIGNED_ROLES: Final = frozenset({"commands", "responses", *AGENT_NAMES})
"""The queues (by role) whose trigger takes only messages the app signed for them."""
MAX_REPLAY_BYTES: Final = 160 * 1024
"""The largest dead letter a replay carries: in base64 it grows by a third, and the command
must stay within the 256 KiB of a message."""
MAX_REPLAY_PROPERTIES: Final = 32
PropertyName = Annotated[str, Field(min_length=1, max_length=128)]
PropertyValue = StrictBool | StrictInt | float | Annotated[str, Field(max_length=4096)]
Header = Annotated[str, Field(max_length=256)] | None


class ReplayDeadLetter(MessageBase):
    """Operations app -> scheduler-commands: send dead letter ``sequence_number`` of the queue
    whose role is ``queue`` back to it, as it was first sent: the same ``body`` (base64),
    MessageId, application properties (a signature among them) and headers.

    The operations app received it from the dead letters and found it may be replayed
    (service/operations/dead_letter_settler.py); the pattern app sends it
    (:mod:`service.replays`), a message for a queue of signed messages only if its signature
    verifies for that queue.
    """

    type: Literal["ReplayDeadLetter"] = "ReplayDeadLetter"
    queue: Annotated[str, AfterValidator(lambda v: ids.validate_name(v, "queue role"))]
    sequence_number: Annotated[StrictInt, Field(ge=1, lt=2**63)]
    message_id: Annotated[str, Field(min_length=1, max_length=MAX_MESSAGE_ID_LENGTH)]
    body: Annotated[
        str, Field(max_length=(MAX_REPLAY_BYTES + 2) // 3 * 4, pattern=r"^[A-Za-z0-9+/]*={0,2}$")
    ]
    properties: Annotated[
        dict[PropertyName, PropertyValue], Field(max_length=MAX_REPLAY_PROPERTIES)
    ]
    correlation_id: Header = None
    subject: Header = None
    content_type: Header = None
    reply_to: Header = None
    requested_by: Actor
    requested_at: UtcDatetime = Field(default_factory=utc_now)

    @model_validator(mode="after")
    def _check_body(self) -> ReplayDeadLetter:
        self.raw_body()
        return self

    def raw_body(self) -> bytes:
        """The dead letter's body, as it was sent."""
        try:
            return base64.b64decode(self.body, validate=True)
        except binascii.Error as error:
            raise ValueError(f"body is not base64: {error}") from None


MAX_DUE_ROWS: Final = 100
"""Rows one DueRows message carries: at most one Table transaction of the bucket's marks."""
MAX_BUCKET: Final = 255
Generation = Annotated[StrictInt, AfterValidator(ids.validate_generation)]


class DueRow(BaseModel):
    """One active-index row a Supervisor tick found due and handed out (:class:`DueRows`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    order_id: OrderId
    generation: Generation
    found_due: UtcDatetime
    """The row's due time as the tick found it: with the row, it names this hand-out."""


class DueRows(MessageBase):
    """Supervisor -> scheduler-commands: rows of one index bucket found due, for whichever
    instance takes the message to recover (:mod:`service.recovery`).

    The tick marks the rows handed out until ``leased_until`` before it sends this; a row not
    moved on by then comes due again and is handed out anew. The instance that takes it reads
    the rows first and recovers those still handed out, by this hand-out or a later one.
    """

    type: Literal["DueRows"] = "DueRows"
    bucket: Annotated[StrictInt, Field(ge=0, le=MAX_BUCKET)]
    hand_out: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
    """The id the tick marked the rows with (``DispatchId``): a write id, not part of the
    message's identity."""
    rows: Annotated[tuple[DueRow, ...], Field(min_length=1, max_length=MAX_DUE_ROWS)]
    leased_until: UtcDatetime
    dispatched_at: UtcDatetime
    requested_by: Actor

    @model_validator(mode="after")
    def _distinct(self) -> DueRows:
        keys = [(row.order_id, row.generation) for row in self.rows]
        if len(set(keys)) != len(keys):
            raise ValueError("a row appears twice")
        return self


class StatusUpdate(MessageBase):
    """Scheduler -> the submitter's reply queue. ``sequence`` orders updates of one order.

    ``sequence`` counts the updates of one order from 0, without gaps, across scheduler
    instances (the counter is kept on the order, see :mod:`domain.lifecycle`). Updates are sent
    in sequence order; a receiver that sees one twice (a resend after a crash) ignores it.
    """

    type: Literal["StatusUpdate"] = "StatusUpdate"
    order_id: OrderId
    sequence: Annotated[StrictInt, Field(ge=0)]
    state: OrderStatus
    event: StatusEvent | None = None
    step: StepName | None = None
    detail: Detail = ""
    updated_at: UtcDatetime = Field(default_factory=utc_now)


class OperatorAlert(MessageBase):
    """Anything a person must look at. ``order_id`` is None when the input had no usable id."""

    type: Literal["OperatorAlert"] = "OperatorAlert"
    order_id: OrderId | None
    severity: Severity
    reason: ReasonCode
    detail: Detail
    raw_excerpt: Annotated[str, _truncator(MAX_RAW_EXCERPT_BYTES)] | None = None
    source: Actor
    timeline_seq: Counter | None = None
    """The order's timeline entry that raised it (an order may enter Error more than once)."""
    caused_by: Annotated[str, Field(min_length=1, max_length=MAX_CAUSE_CHARS)] | None = None
    """The message whose handling raised it, ``<queue role>/<MessageId>`` (see
    :meth:`service.inbound.Delivery.cause`): it tells two such alerts apart however alike
    their text, and a redelivery of that message from the next."""
    raised_at: UtcDatetime = Field(default_factory=utc_now)


MESSAGE_TYPES: Final[dict[str, type[MessageBase]]] = {
    cls.MESSAGE_TYPE: cls
    for cls in (
        OrderSubmitted,
        AgentRequest,
        AgentResponse,
        SchedulerCommand,
        SendOwed,
        ReplayDeadLetter,
        DueRows,
        StatusUpdate,
        OperatorAlert,
    )
}

T = TypeVar("T", bound=MessageBase)


class BadMessage(Exception):
    """A message body that cannot be accepted, with the reason a person needs.

    ``order_id`` is filled in when the body was a JSON object with a valid ``order_id``, so the
    alert can name the order; ``raw_excerpt`` is a bounded, printable copy of the body.
    """

    def __init__(
        self,
        reason: str,
        *,
        expected: str,
        order_id: str | None = None,
        raw_excerpt: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.expected = expected
        self.order_id = order_id
        self.raw_excerpt = raw_excerpt

    def to_alert(
        self,
        source: str,
        severity: Literal["warning", "error"] = "error",
        *,
        caused_by: str | None = None,
    ) -> OperatorAlert:
        return OperatorAlert(
            order_id=self.order_id,
            severity=severity,
            reason="bad_message",
            detail=f"rejected {self.expected}: {self.reason}",
            raw_excerpt=self.raw_excerpt,
            source=source,
            caused_by=caused_by,
        )


class MessageTooLarge(ValueError):
    """Raised by :func:`encode` for a message a receiver would refuse."""


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


class _DuplicateKey(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def summarize(error: ValidationError) -> str:
    parts = []
    for item in error.errors(include_url=False, include_input=False)[:_MAX_ERRORS_SHOWN]:
        path = ".".join(str(p) for p in item["loc"]) or "(message)"
        if len(path) > 100:  # deeply nested JSON values make paths of any length
            path = f"{path[:48]}...{path[-48:]}"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        parts.append(f"{path}: {message}")
    more = error.error_count() - _MAX_ERRORS_SHOWN
    if more > 0:
        parts.append(f"(+{more} more)")
    return "; ".join(parts)


def _order_id_of(data: dict[str, Any]) -> str | None:
    try:
        return ids.validate_order_id(data.get("order_id"))
    except ids.InvalidId:
        return None


def _as_bytes(body: bytes | str) -> bytes:
    if isinstance(body, str):
        # surrogatepass keeps lone surrogates, which then fail UTF-8 decoding with a clear reason.
        return body.encode("utf-8", errors="surrogatepass")
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    raise TypeError(f"body must be bytes or str, got {type(body).__name__}")


def _decode_object(raw: bytes, expected: str) -> dict[str, Any]:
    """The body as a JSON object, or BadMessage saying why it is not one."""

    def bad(reason: str) -> BadMessage:
        return BadMessage(reason, expected=expected, raw_excerpt=excerpt(raw))

    if len(raw) > MAX_MESSAGE_BYTES:
        raise bad(f"body is {len(raw)} bytes; the limit is {MAX_MESSAGE_BYTES} (256 KiB)")
    if not raw.strip():
        raise bad("body is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad(f"body is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        data = json.loads(
            text, object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant
        )
    except _DuplicateKey as exc:
        raise bad(f"body is not acceptable JSON: key {str(exc)[:64]!r} appears twice") from None
    except json.JSONDecodeError as exc:
        raise bad(f"body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:
        raise bad(f"body is not acceptable JSON: {exc}") from None
    except RecursionError:
        raise bad("body is not acceptable JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise bad(f"body is a JSON {_json_kind(data)}; expected an object ({expected})")
    # Strict UTF-8 cannot carry a surrogate: only a \u escape can, so only then encode again.
    try:
        if "\\u" in text:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise bad(
            "body is not acceptable JSON: a string has an unpaired surrogate escape"
        ) from None
    return data


def _validate(raw: bytes, data: dict[str, Any], expected: type[T]) -> T:
    name = expected.MESSAGE_TYPE
    order_id = _order_id_of(data)

    def bad(reason: str) -> BadMessage:
        return BadMessage(reason, expected=name, order_id=order_id, raw_excerpt=excerpt(raw))

    if "type" not in data:
        raise bad(f"field 'type' is missing; expected {name!r}")
    if data["type"] != name:
        raise bad(f"message type is {repr(data['type'])[:80]}; expected {name!r}")
    version = data.get("schema_version", 1)
    if version != 1 or isinstance(version, bool):
        raise bad(f"schema_version {repr(version)[:20]} is not supported; this build reads 1")
    try:
        return expected.model_validate(data)
    except ValidationError as exc:
        raise bad(f"{name} is invalid: {summarize(exc)}") from None


class SignedBody(bytes):
    """A body the app encoded itself (:func:`encode`) and signed for the queue it came from, its
    signature verified (:mod:`domain.signing`, ``service.inbound``).

    :func:`parse_message` reads it in one pass, pydantic's own JSON parser validating as it
    reads: what the app's encoder writes cannot hold what the strict reader is there to refuse
    (a key twice, NaN, an unpaired surrogate), and nobody else can sign. Anything it does not
    accept is read again the strict way, so a refusal says the same as for any other body."""


def parse_message(body: bytes | str, expected: type[T]) -> T:
    """Decode and validate one message of type ``expected``, or raise :class:`BadMessage`."""
    if isinstance(body, SignedBody) and len(body) <= MAX_MESSAGE_BYTES:
        with suppress(ValidationError):  # refused: read again below, the strict way, to say why
            return expected.model_validate_json(body)
    raw = _as_bytes(body)
    data = _decode_object(raw, expected.MESSAGE_TYPE)
    return _validate(raw, data, expected)


def parse_one_of(body: bytes | str, *expected: type[MessageBase]) -> MessageBase:
    """Decode one message of whichever of ``expected`` its ``type`` names, or raise
    :class:`BadMessage` (reported against the first of ``expected`` if it names none)."""
    raw = _as_bytes(body)
    names = " or ".join(kind.MESSAGE_TYPE for kind in expected)
    data = _decode_object(raw, names)
    kinds = {kind.MESSAGE_TYPE: kind for kind in expected}
    return _validate(raw, data, kinds.get(data.get("type"), expected[0]))  # type: ignore[arg-type]


def _json_kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def encode(message: MessageBase) -> bytes:
    """Compact UTF-8 JSON of ``message``; refuses what :func:`parse_message` would refuse."""
    body = message.model_dump_json().encode("utf-8")
    if len(body) > MAX_MESSAGE_BYTES:
        raise MessageTooLarge(
            f"{message.MESSAGE_TYPE} encodes to {len(body)} bytes; the limit is "
            f"{MAX_MESSAGE_BYTES} (256 KiB)"
        )
    return body


def _short_hash(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()[:16]


def _rows_hash(rows: tuple[DueRow, ...]) -> str:
    """The rows of a hand-out, each with the due time it was found at, whatever their order."""
    found = sorted(f"{r.order_id}.{r.generation}@{r.found_due.isoformat()}" for r in rows)
    return hashlib.sha256("\n".join(found).encode("utf-8")).hexdigest()[:40]


def _event(alert: OperatorAlert) -> str:
    """What makes the event ``alert`` reports one (the rules in the module docstring)."""
    if alert.caused_by is not None:
        return alert.caused_by
    fingerprint = _short_hash(alert.detail, alert.raw_excerpt or "")
    return fingerprint if alert.timeline_seq is None else f"{alert.timeline_seq}:{fingerprint}"


def message_id_for(message: MessageBase) -> str:
    """The deterministic Service Bus MessageId of ``message`` (rules in the module docstring)."""
    match message:
        case OrderSubmitted():
            prefix, rest = "sub", f"{message.order_id}:{message.content_hash()[:16]}"
        case AgentRequest() | AgentResponse():
            prefix = "req" if isinstance(message, AgentRequest) else "rsp"
            # The key names the order, step, operation and generation (_own_key checked it).
            rest = f"{message.idempotency_key}:{message.attempt}"
        case SchedulerCommand():
            prefix = "cmd"
            rest = f"{message.order_id}:{message.command}:{message.failure_count}:{message.attempt}"
        case SendOwed():
            prefix, rest = "owed", f"{message.order_id}:{message.timeline_seq}"
        case ReplayDeadLetter():
            prefix, rest = "replay", f"{message.queue}:{message.sequence_number}"
        case DueRows():
            prefix, rest = "due", f"{message.bucket}:{_rows_hash(message.rows)}"
        case StatusUpdate():
            prefix, rest = "st", f"{message.order_id}:{message.sequence}"
        case OperatorAlert():
            prefix, rest = "alert", f"{message.order_id or '-'}:{message.reason}:{_event(message)}"
        case _:
            raise TypeError(f"no message id rule for {type(message).__name__}")
    message_id = f"{prefix}:{rest}"
    if len(message_id) <= MAX_MESSAGE_ID_LENGTH:
        return message_id
    return f"{prefix}:{hashlib.sha256(message_id.encode('utf-8')).hexdigest()[:40]}"
