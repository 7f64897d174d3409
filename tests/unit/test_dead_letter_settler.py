"""Which dead letters a replay or purge takes, what it refuses and why, and the copy it sends
back: decided per message, without a broker (messages as the SDK hands them over)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusConnectionError

from adapters.queues import Send, properties_of, replay_copy
from domain import signing
from service.operations.dead_letter_settler import Settler, selection
from service.operations.errors import InvalidRequest
from tests.support.keys import new_key_text

pytestmark = pytest.mark.anyio

KEYS = signing.parse_keyring(new_key_text("k1"))
QUEUE = "scheduler-commands"
NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
BODY = json.dumps({"type": "SchedulerCommand", "order_id": "o-1"}).encode()


@dataclass
class Received:
    """What a dead letter looks like from the SDK: AMQP strings come as bytes."""

    sequence_number: int
    body: bytes = BODY
    message_id: str = "m-1"
    enqueued_time_utc: datetime = NOW - timedelta(hours=1)
    application_properties: dict[Any, Any] = field(default_factory=dict)
    correlation_id: str | None = "o-1"
    subject: str | None = "SchedulerCommand"
    content_type: str | None = "application/json"
    reply_to: str | None = None


def signed(number: int, body: bytes = BODY, message_id: str = "m-1", **fields: Any) -> Received:
    mac = signing.sign(KEYS, queue=QUEUE, message_id=message_id, body=body)
    properties = {
        b"signature": mac.encode(),
        b"schema_version": 1,
        b"DeadLetterReason": b"MaxDeliveryCountExceeded",
    }
    return Received(number, body, message_id, application_properties=properties, **fields)


def settler(kind: str = "replay", role: str = "commands", wanted=None) -> Settler:
    return Settler(
        kind=kind,  # type: ignore[arg-type]
        role=role,
        entity=QUEUE,
        keyring=KEYS,
        now=lambda: NOW,
        wanted=wanted,
        window=timedelta(minutes=10),
    )


def into(sent: list[ServiceBusMessage]) -> Send:
    """A send that keeps what it is given."""

    async def send(message: ServiceBusMessage) -> None:
        sent.append(message)

    return send


async def dropped(message: ServiceBusMessage) -> None:
    """A send that goes nowhere."""


async def test_a_signed_message_is_sent_back_whole_then_completed():
    sent: list[ServiceBusMessage] = []
    s = settler()
    assert await s.act(signed(5), into(sent)) is True
    [copy] = sent
    assert (copy.message_id, b"".join(copy.body)) == ("m-1", BODY)
    assert copy.application_properties == {"signature": signed(5).application_properties[
        b"signature"].decode(), "schema_version": 1}  # fmt: skip
    assert (copy.correlation_id, copy.subject, copy.content_type) == (
        "o-1", "SchedulerCommand", "application/json",
    )  # fmt: skip
    verdict = signing.verify(
        KEYS, copy.application_properties["signature"], queue=QUEUE, message_id="m-1", body=BODY
    )
    assert isinstance(verdict, signing.Verified)
    [outcome] = s.outcomes.values()
    assert (outcome.outcome, outcome.order_id) == ("replayed", "o-1")


def unsigned() -> Received:
    return Received(1)


def altered_body() -> Received:
    message = signed(1)
    message.body = BODY + b" "
    return message


def another_message_id() -> Received:
    message = signed(1)
    message.message_id = "m-2"
    return message


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (unsigned, "unsigned"),
        (altered_body, "bad_signature"),
        (another_message_id, "bad_signature"),
    ],
)
async def test_a_message_the_app_did_not_sign_is_refused_and_kept(make, problem):
    sent: list[ServiceBusMessage] = []
    s = settler()
    assert await s.act(make(), into(sent)) is False
    assert sent == []
    [outcome] = s.outcomes.values()
    assert outcome.outcome == "refused" and problem in outcome.detail
    assert outcome.order_id is None, "an untrusted body's order is not believed"


async def test_a_message_first_sent_inside_the_duplicate_window_is_refused_until_it_passes():
    recent = signed(1, enqueued_time_utc=NOW - timedelta(minutes=9))
    s = settler()
    assert await s.act(recent, dropped) is False
    [outcome] = s.outcomes.values()
    assert outcome.outcome == "refused"
    assert "until 12:01:00 UTC (duplicate detection)" in outcome.detail


async def test_submissions_are_not_signed_and_are_replayed_as_they_are():
    submission = Received(3, json.dumps({"order_id": "o-9"}).encode())
    s = settler(role="orders")
    assert await s.act(submission, dropped) is True
    assert [o.order_id for o in s.outcomes.values()] == ["o-9"]


async def test_a_failed_send_keeps_the_message():
    async def broken(message: ServiceBusMessage) -> None:
        raise ServiceBusConnectionError(message="link detached")

    s = settler()
    assert await s.act(signed(1), broken) is False
    assert [o.outcome for o in s.outcomes.values()] == ["failed"]


async def test_purge_takes_anything_and_a_dry_run_only_says():
    s = settler(kind="purge")
    assert await s.act(Received(1), dropped) is True
    assert [o.outcome for o in s.outcomes.values()] == ["purged"]
    dry = settler()
    dry.consider(signed(1))
    dry.consider(Received(2))
    assert [o.outcome for o in dry.outcomes.values()] == ["would_replay", "refused"]


async def test_only_the_named_dead_letters_are_taken_and_missing_ones_are_said():
    s = settler(wanted=frozenset({2, 7}))
    assert await s.act(signed(1), dropped) is False
    assert not s.enough()
    assert await s.act(signed(2), dropped) is True
    assert [o.sequence_number for o in s.missing()] == [7]
    assert s.missing()[0].outcome == "not_found"


@pytest.mark.parametrize(
    ("numbers", "everything", "message"),
    [
        (None, False, "say which dead letters"),
        ([], False, "say which dead letters"),
        ([1], True, "not both"),
        ([0], False, "integers >= 1"),
        (["1"], False, "integers >= 1"),
        (list(range(1, 102)), False, "at most 100"),
    ],
)
def test_a_selection_must_name_dead_letters_or_say_all(numbers, everything, message):
    with pytest.raises(InvalidRequest, match=message):
        selection(numbers, everything)
    assert selection(None, True) is None
    assert selection([3, 3, 4], False) == frozenset({3, 4})


def test_properties_come_back_as_text_without_the_dead_letter_reason():
    message = Received(1, application_properties={
        b"signature": b"v1.k.x", b"count": 3, "DeadLetterErrorDescription": b"x",
        b"raw": b"\xff\xfe",
    })  # fmt: skip
    assert properties_of(message) == {"signature": "v1.k.x", "count": 3, "raw": b"\xff\xfe"}  # type: ignore[arg-type]
    assert replay_copy(message).message_id == "m-1"  # type: ignore[arg-type]
