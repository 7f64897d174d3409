"""Every MessageId names exactly one message (issue 39): distinct messages get distinct ids, and
a copy of one message - redelivered, resent with a later snapshot - gets the same id, so
duplicate detection drops copies and only copies.

What makes a message of each type distinct is written here, from the rules of
:mod:`domain.messages`, independently of how :func:`message_id_for` builds its text; Hypothesis
draws pairs of messages from small alphabets (so that they often agree in part) and checks that
two ids are equal exactly when the messages are one message. That an id leaves out the rest of
a request or a command (its payload, deadlines, reason) rests on the app never making two that
differ only there: tests/support/world.py checks that of every message the app sends while the
stateful lifecycle test explores it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from domain import ids
from domain.messages import (
    MAX_MESSAGE_ID_LENGTH,
    AgentRequest,
    AgentResponse,
    MessageBase,
    OperatorAlert,
    OrderSubmitted,
    ReplayDeadLetter,
    SchedulerCommand,
    SendOwed,
    StatusUpdate,
    encode,
    message_id_for,
    parse_message,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)

# Few values each, so that two draws often share an order, a step, a key or an attempt; and the
# extremes, so that the longest ids are drawn too.
order_ids = st.sampled_from(["o-1", "o-2", "o-1-1", "O-1", "o" * 64])
steps = st.sampled_from(["charge_payment", "charge", "payment", "s" * 40])
operations = st.sampled_from(["do", "undo"])
generations = st.sampled_from([1, 2, 12, ids.MAX_GENERATION])
attempts = st.sampled_from([1, 2, 11, 21, 1_000_000])
moments = st.sampled_from([T0, T0 + timedelta(seconds=45)])
texts = st.sampled_from(["", "declined", "a:b", "x" * 300])
payloads = st.sampled_from([{}, {"amount_cents": 100}, {"amount_cents": 999_999}])
snapshots = st.sampled_from([None, "r1.AAAA", "r1.BBBB"])


def _request(f: dict[str, Any]) -> AgentRequest:
    key = ids.idempotency_key(f["order_id"], f["step"], f["operation"], f["generation"])
    forward = ids.idempotency_key(f["order_id"], f["step"], "do", f["generation"])
    return AgentRequest(
        order_id=f["order_id"],
        step=f["step"],
        operation=f["operation"],
        action=f["action"],
        attempt=f["attempt"],
        complete_by=f["at"] + timedelta(seconds=90),
        run_budget_s=f["budget"],
        idempotency_key=key,
        undoes=forward if f["operation"] == "undo" else None,
        payload=f["payload"],
        requested_at=f["at"],
        resume=f["resume"],
    )


def _response(f: dict[str, Any]) -> AgentResponse:
    outcome = f["outcome"]
    if outcome == "nothing_to_undo" and f["operation"] == "do":
        outcome = "succeeded"
    return AgentResponse(
        order_id=f["order_id"],
        step=f["step"],
        operation=f["operation"],
        attempt=f["attempt"],
        idempotency_key=ids.idempotency_key(
            f["order_id"], f["step"], f["operation"], f["generation"]
        ),
        outcome=outcome,
        transient=outcome == "failed" and f["transient"],
        error_code=f["code"] if outcome == "failed" else None,
        retry_at=f["at"] if outcome == "deferred" else None,
        result=f["payload"],
        responded_at=f["at"],
        resume=f["resume"],
    )


ANSWERED = {
    "order_id": order_ids,
    "step": steps,
    "operation": operations,
    "generation": generations,
    "attempt": attempts,
    "at": moments,
    "payload": payloads,
    "resume": snapshots,
}
KINDS: dict[str, tuple[dict[str, st.SearchStrategy[Any]], Callable[..., MessageBase]]] = {
    "request": (
        ANSWERED
        | {
            "action": st.sampled_from(["charge", "refund"]),
            "budget": st.sampled_from([None, 30.0]),
        },
        _request,
    ),
    "response": (
        ANSWERED
        | {
            "outcome": st.sampled_from(["succeeded", "failed", "deferred", "nothing_to_undo"]),
            "transient": st.booleans(),
            "code": st.sampled_from(["declined", "timed_out"]),
        },
        _response,
    ),
    "command": (
        {
            "order_id": order_ids,
            "command": st.just("retry"),
            "attempt": st.sampled_from([0, 1, 2, 12]),
            "failure_count": st.sampled_from([0, 1, 2, 12]),
            "reason": st.sampled_from(["deadline passed", "circuit open"]),
            "requested_by": st.sampled_from(["supervisor-1", "scheduler-2"]),
            "requested_at": moments,
        },
        lambda f: SchedulerCommand(**f),
    ),
    "update": (
        {
            "order_id": order_ids,
            "sequence": st.sampled_from([0, 1, 11, 111]),
            "state": st.sampled_from(["Processing", "Processed"]),
            "step": st.sampled_from([None, "charge_payment"]),
            "detail": texts,
            "updated_at": moments,
        },
        lambda f: StatusUpdate(**f),
    ),
    "alert": (
        {
            "order_id": st.none() | order_ids,
            "severity": st.sampled_from(["error", "critical"]),
            "reason": st.sampled_from(["bad_message", "unrequested_answer"]),
            "detail": texts,
            "raw_excerpt": st.sampled_from([None, "{}"]),
            "source": st.sampled_from(["scheduler-1", "agent-payment:host-b"]),
            "timeline_seq": st.sampled_from([None, 3, 33]),
            "caused_by": st.sampled_from(
                [None, "responses/rsp:o-1:c:do:1:2", "responses/rsp:o-1:c:do:2:2", "r/" + "m" * 128]
            ),
            "raised_at": moments,
        },
        lambda f: OperatorAlert(**f),
    ),
    "owed": (
        {
            "order_id": order_ids,
            "timeline_seq": st.sampled_from([0, 3, 33]),
            "requested_by": st.sampled_from(["ops:alice", "ops:bob"]),
            "requested_at": moments,
        },
        lambda f: SendOwed(**f),
    ),
    "replay": (
        {
            "queue": st.sampled_from(["orders", "payment"]),
            "sequence_number": st.sampled_from([1, 2, 2**40]),
            "message_id": st.sampled_from(["m-1", "m-2"]),
            "body": st.sampled_from(["", "e30="]),
            "properties": st.sampled_from([{}, {"k": "v"}]),
            "requested_by": st.sampled_from(["ops:alice", "ops:bob"]),
            "requested_at": moments,
        },
        lambda f: ReplayDeadLetter(**f),
    ),
    "submission": (
        {
            "order_id": order_ids,
            "customer_id": st.sampled_from(["c-1", "c-2"]),
            "quantity": st.sampled_from([1, 2]),
            "currency": st.sampled_from(["EUR", "USD"]),
            "reply_to": st.sampled_from([None, "status-1"]),
            "submitted_at": moments,
        },
        lambda f: OrderSubmitted(
            order_id=f["order_id"],
            customer_id=f["customer_id"],
            items=({"sku": "SKU-1", "quantity": f["quantity"], "unit_price_cents": 100},),
            currency=f["currency"],
            reply_to=f["reply_to"],
            submitted_at=f["submitted_at"],
        ),
    ),
}


@st.composite
def messages(draw: st.DrawFn) -> MessageBase:
    fields, build = KINDS[draw(st.sampled_from(sorted(KINDS)))]
    return build({name: draw(strategy) for name, strategy in fields.items()})


@st.composite
def pairs(draw: st.DrawFn) -> tuple[MessageBase, MessageBase]:
    """Two messages: of two kinds, or of one kind agreeing in some fields and not others."""
    kind = draw(st.sampled_from(sorted(KINDS)))
    fields, build = KINDS[kind]
    first = {name: draw(strategy) for name, strategy in fields.items()}
    if draw(st.booleans()):
        return build(first), draw(messages())
    second = {
        name: value if draw(st.booleans()) else draw(fields[name]) for name, value in first.items()
    }
    return build(first), build(second)


def _answered(m: AgentRequest | AgentResponse) -> tuple[Any, ...]:
    """One request, and every answer to it: the key (order, step, operation, generation) and
    the attempt that carried it."""
    key = ids.parse_idempotency_key(m.idempotency_key)
    return (m.order_id, m.step, m.operation, key.generation, m.attempt)


def _alerted(m: OperatorAlert) -> tuple[Any, ...]:
    """One alert: about one order, for one reason, of one event - the message whose handling
    raised it, else the order write that raised it and what it says, else what it says."""
    if m.caused_by is not None:
        event: tuple[Any, ...] = (m.caused_by,)
    else:
        event = (m.timeline_seq, m.detail, m.raw_excerpt)
    return (m.order_id, m.reason, *event)


IDENTITY: dict[type[MessageBase], Callable[[Any], tuple[Any, ...]]] = {
    AgentRequest: _answered,
    AgentResponse: _answered,
    SchedulerCommand: lambda m: (m.order_id, m.command, m.attempt, m.failure_count),
    SendOwed: lambda m: (m.order_id, m.timeline_seq),
    ReplayDeadLetter: lambda m: (m.queue, m.sequence_number),
    StatusUpdate: lambda m: (m.order_id, m.sequence),
    OperatorAlert: _alerted,
    OrderSubmitted: lambda m: (m.model_dump(mode="json", exclude={"submitted_at"}),),
}
"""What tells one message of each type from every other (domain.messages, "Message ids")."""


def same_message(a: MessageBase, b: MessageBase) -> bool:
    return type(a) is type(b) and IDENTITY[type(a)](a) == IDENTITY[type(b)](b)


@settings(max_examples=1000)
@given(pairs())
def test_two_ids_are_equal_exactly_when_the_messages_are_one(pair):
    a, b = pair
    assert (message_id_for(a) == message_id_for(b)) == same_message(a, b), (
        message_id_for(a),
        message_id_for(b),
    )


@settings(max_examples=300)
@given(messages().filter(lambda m: isinstance(m, AgentRequest | AgentResponse)), st.data())
def test_an_answer_to_another_key_or_attempt_is_another_message(message, data):
    """Issue 39: an answer to a request for another generation (a key never sent) shared the
    genuine answer's id, and duplicate detection dropped it: no alert, the effect unseen."""
    key = ids.parse_idempotency_key(message.idempotency_key)
    generation = data.draw(generations.filter(lambda g: g != key.generation))
    attempt = data.draw(attempts.filter(lambda n: n != message.attempt))
    other_key = str(key._replace(generation=generation))
    changes: list[dict[str, Any]] = [{"attempt": attempt}, {"idempotency_key": other_key}]
    if isinstance(message, AgentRequest) and message.undoes is not None:
        changes[1]["undoes"] = str(key._replace(operation="do", generation=generation))
    for change in changes:
        other = type(message).model_validate(message.model_dump() | change)
        assert message_id_for(other) != message_id_for(message), change


@settings(max_examples=300)
@given(messages(), snapshots)
def test_a_copy_keeps_its_id_redelivered_or_resent_with_a_later_snapshot(message, snapshot):
    redelivered = parse_message(encode(message), type(message))
    assert message_id_for(redelivered) == message_id_for(message)
    if isinstance(message, AgentRequest | AgentResponse):
        resent = message.model_copy(update={"resume": snapshot})
        assert message_id_for(resent) == message_id_for(message)


@settings(max_examples=300)
@given(messages())
def test_every_id_fits_service_bus_and_says_what_it_names(message):
    message_id = message_id_for(message)
    assert 0 < len(message_id) <= MAX_MESSAGE_ID_LENGTH
    prefix = {
        AgentRequest: "req:",
        AgentResponse: "rsp:",
        SchedulerCommand: "cmd:",
        SendOwed: "owed:",
        ReplayDeadLetter: "replay:",
        StatusUpdate: "st:",
        OperatorAlert: "alert:",
        OrderSubmitted: "sub:",
    }[type(message)]
    assert message_id.startswith(prefix)
    if isinstance(message, AgentRequest | AgentResponse):
        # Never hashed: the longest is 127 characters, and names its key and attempt.
        assert message_id == f"{prefix}{message.idempotency_key}:{message.attempt}"
