"""Which dead letters a replay or purge takes, what it refuses and why, and the command that has
the pattern app send one back: decided per message, without a broker (messages as the SDK hands
them over)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus.exceptions import ServiceBusConnectionError

from adapters.queues import properties_of
from domain import signing
from domain.messages import MAX_REPLAY_BYTES, ReplayDeadLetter, encode
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


def settler(
    kind: str = "replay", role: str = "commands", wanted=None, handed: list | None = None
) -> Settler:
    """A settler whose replay commands are encoded as a send would, and kept in ``handed``."""
    kept = [] if handed is None else handed

    async def hand_over(command: ReplayDeadLetter) -> None:
        encode(command)
        kept.append(command)

    return Settler(
        kind=kind,  # type: ignore[arg-type]
        role=role,
        entity=QUEUE,
        keyring=KEYS,
        now=lambda: NOW,
        wanted=wanted,
        actor="operator:ada",
        hand_over=hand_over,
        window=timedelta(minutes=10),
    )


async def test_a_signed_message_is_handed_to_the_pattern_app_whole_then_completed():
    handed: list[ReplayDeadLetter] = []
    s = settler(handed=handed)
    assert await s.act(signed(5)) is True
    [command] = handed
    assert (command.queue, command.sequence_number, command.requested_by) == (
        "commands", 5, "operator:ada",
    )  # fmt: skip
    assert (command.message_id, command.raw_body()) == ("m-1", BODY)
    assert command.properties == {"signature": signed(5).application_properties[
        b"signature"].decode(), "schema_version": 1}  # fmt: skip
    assert (command.correlation_id, command.subject, command.content_type) == (
        "o-1", "SchedulerCommand", "application/json",
    )  # fmt: skip
    verdict = signing.verify(
        KEYS, command.properties["signature"], queue=QUEUE, message_id="m-1", body=BODY
    )
    assert isinstance(verdict, signing.Verified)
    [outcome] = s.outcomes.values()
    assert (outcome.outcome, outcome.order_id) == ("replayed", "o-1")
    assert outcome.detail == f"sent back to {QUEUE} (by the pattern app)"


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
    handed: list[ReplayDeadLetter] = []
    s = settler(handed=handed)
    assert await s.act(make()) is False
    assert handed == []
    [outcome] = s.outcomes.values()
    assert outcome.outcome == "refused" and problem in outcome.detail
    assert outcome.order_id is None, "an untrusted body's order is not believed"


async def test_a_message_first_sent_inside_the_duplicate_window_is_refused_until_it_passes():
    recent = signed(1, enqueued_time_utc=NOW - timedelta(minutes=9))
    s = settler()
    assert await s.act(recent) is False
    [outcome] = s.outcomes.values()
    assert outcome.outcome == "refused"
    assert "until 12:01:00 UTC (duplicate detection)" in outcome.detail


async def test_submissions_are_not_signed_and_are_replayed_as_they_are():
    submission = Received(3, json.dumps({"order_id": "o-9"}).encode())
    s = settler(role="orders")
    assert await s.act(submission) is True
    assert [o.order_id for o in s.outcomes.values()] == ["o-9"]


async def test_a_failed_hand_over_keeps_the_message():
    s = settler()

    async def broken(command: ReplayDeadLetter) -> None:
        raise ServiceBusConnectionError(message="link detached")

    s.hand_over = broken
    assert await s.act(signed(1)) is False
    assert [o.outcome for o in s.outcomes.values()] == ["failed"]


async def test_a_dead_letter_too_large_for_a_command_is_refused_and_kept():
    big = signed(1, body=b"x" * (MAX_REPLAY_BYTES + 1))
    dry = settler()
    dry.consider(big)
    assert [o.outcome for o in dry.outcomes.values()] == ["refused"]
    handed: list[ReplayDeadLetter] = []
    s = settler(handed=handed)
    assert await s.act(big) is False and handed == []
    [outcome] = s.outcomes.values()
    assert f"over the {MAX_REPLAY_BYTES} a replay carries" in outcome.detail


async def test_a_command_over_the_message_limit_is_refused_and_kept():
    """A body that fits, whose properties take the command over 256 KiB: encoding refuses it."""
    big = Received(1, b"x" * MAX_REPLAY_BYTES, application_properties={
        f"p{i}": "y" * 4000 for i in range(20)
    })  # fmt: skip
    handed: list[ReplayDeadLetter] = []
    s = settler(role="orders", handed=handed)
    assert await s.act(big) is False and handed == []
    [outcome] = s.outcomes.values()
    assert outcome.outcome == "refused" and "the limit is 262144 (256 KiB)" in outcome.detail


async def test_properties_a_command_cannot_carry_are_refused_and_kept():
    message = Received(1, application_properties={b"raw": b"\xff\xfe"})
    s = settler(role="orders")
    assert await s.act(message) is False
    [outcome] = s.outcomes.values()
    assert outcome.outcome == "refused"
    assert "does not fit a replay command: properties.raw" in outcome.detail


async def test_purge_takes_anything_and_a_dry_run_only_says():
    s = settler(kind="purge")
    assert await s.act(Received(1)) is True
    assert [o.outcome for o in s.outcomes.values()] == ["purged"]
    dry = settler()
    dry.consider(signed(1))
    dry.consider(Received(2))
    assert [o.outcome for o in dry.outcomes.values()] == ["would_replay", "refused"]


async def test_only_the_named_dead_letters_are_taken_and_missing_ones_are_said():
    s = settler(wanted=frozenset({2, 7}))
    assert await s.act(signed(1)) is False
    assert not s.enough()
    assert await s.act(signed(2)) is True
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
