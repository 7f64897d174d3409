"""Wire shape of `$management` replies: arrays go out as plain AMQP arrays, as Service Bus sends
them (a described array is a different type to a strict AMQP decoder)."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta

from azure.servicebus import ServiceBusMessage
from azure.servicebus._pyamqp._encode import encode_payload
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from proton import UNDESCRIBED, Array, Data, Message

from devstack.servicebus import codec, management
from devstack.servicebus.config import QueueSettings
from devstack.servicebus.queues import Queue, parse_incoming

NOW = 1_700_000_000.0


def new_queue() -> Queue:
    return Queue.with_dead_letter_queue(QueueSettings("q", lock_duration=timedelta(seconds=30)))


def round_trip(reply: Message) -> Message:
    decoded = Message()
    decoded.decode(reply.encode())
    return decoded


def request(operation: str, body: dict) -> Message:
    return Message(properties={"operation": "com.microsoft:" + operation}, body=body)


def test_renew_lock_replies_with_an_undescribed_timestamp_array() -> None:
    queue = new_queue()
    queue.enqueue(parse_incoming(Message(body="x").encode()), NOW)
    locked = queue.lock_next(NOW)
    assert locked is not None
    token = locked[1]
    body = {"lock-tokens": Array(UNDESCRIBED, Data.UUID, token)}
    reply = round_trip(
        management.handle(queue, request("renew-lock", body), NOW + 10, contextlib.nullcontext)
    )
    assert reply.properties["statusCode"] == 200
    expirations = reply.body["expirations"]
    assert list(expirations.elements) == [int((NOW + 40) * 1000)]
    assert expirations.type == Data.TIMESTAMP
    assert expirations.descriptor is UNDESCRIBED, f"described array: {expirations!r}"


def test_schedule_message_replies_with_an_undescribed_long_array() -> None:
    queue = new_queue()
    due = datetime(2031, 1, 1, tzinfo=UTC)
    message = ServiceBusMessage("later", scheduled_enqueue_time_utc=due)
    outgoing = PyamqpTransport.to_outgoing_amqp_message(message._raw_amqp_message)
    encoded = bytes(encode_payload(bytearray(), outgoing))
    body = {"messages": [{"message": encoded}]}
    raw_reply = management.handle(
        queue, request("schedule-message", body), NOW, contextlib.nullcontext
    )
    reply = round_trip(raw_reply)
    assert reply.properties["statusCode"] == 200
    seqs = reply.body["sequence-numbers"]
    assert list(seqs.elements) == [1]
    assert seqs.type == Data.LONG
    assert seqs.descriptor is UNDESCRIBED, f"described array: {seqs!r}"
    # the broker's own codec can read its own reply
    (section,) = [s for s in codec.split_sections(raw_reply.encode()) if s.code == codec.AMQP_VALUE]
    assert codec.section_value(section) == {"sequence-numbers": [1]}
