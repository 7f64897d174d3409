"""The delivery-id repair between the socket and proton: frames as the azure-servicebus SDK
encodes them, including the duplicate and skipped delivery-ids its racing threads produce."""

from __future__ import annotations

import struct

import pytest
from azure.servicebus._pyamqp._encode import encode_frame
from azure.servicebus._pyamqp.endpoints import Source, Target
from azure.servicebus._pyamqp.performatives import (
    AttachFrame,
    BeginFrame,
    OpenFrame,
    TransferFrame,
)
from proton import Collector, Connection, Event, Transport

from devstack.servicebus import codec
from devstack.servicebus.framing import DeliveryIdRepair, encode_uint

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"


def make(cls, **fields):
    """A pyamqp performative or terminus; fields not given are left out (None)."""
    return cls(**{name: fields.get(name) for name in cls._fields})


def frame(performative, channel: int = 0) -> bytes:
    body = encode_frame(performative)[1] or b""
    return struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + bytes(body)


def transfer(delivery_id: int | None, payload: bytes = b"\x00Sw\xa1\x02hi", **fields) -> bytes:
    fields.setdefault("handle", 0)
    fields.setdefault("delivery_tag", struct.pack(">I", delivery_id or 0))
    fields.setdefault("message_format", 0)
    fields.setdefault("settled", False)
    return frame(make(TransferFrame, delivery_id=delivery_id, payload=payload, **fields))


def opening(next_outgoing_id: int = 0) -> bytes:
    return (
        AMQP_HEADER
        + frame(make(OpenFrame, container_id="sdk", max_frame_size=65536, channel_max=10))
        + frame(
            make(
                BeginFrame,
                next_outgoing_id=next_outgoing_id,
                incoming_window=5000,
                outgoing_window=5000,
            )
        )
        + frame(
            make(
                AttachFrame,
                name="req",
                handle=0,
                role=False,
                send_settle_mode=0,
                rcv_settle_mode=0,
                source=make(Source, address="q/$management"),
                target=make(Target, address="q/$management"),
                initial_delivery_count=0,
            )
        )
    )


def frames_of(stream: bytes) -> list[tuple[int, bytes]]:
    """(channel, frame body) of each AMQP frame after the protocol header."""
    assert stream.startswith(AMQP_HEADER)
    out, pos = [], len(AMQP_HEADER)
    while pos < len(stream):
        size, doff, _, channel = struct.unpack_from(">IBBH", stream, pos)
        out.append((channel, stream[pos + doff * 4 : pos + size]))
        pos += size
    assert pos == len(stream), "frame sizes must add up to the stream"
    return out


def transfers_of(stream: bytes) -> list[tuple[int | None, bytes]]:
    """(delivery-id, payload) of each transfer frame."""
    found = []
    for _, body in frames_of(stream):
        if body[:3] != b"\x00\x53\x14":
            continue
        fields, end = codec.decode(body, 3)
        found.append((fields[1], body[end:]))
    return found


def feed_in_pieces(stream: bytes, size: int) -> bytes:
    repair = DeliveryIdRepair()
    return b"".join(repair.feed(stream[i : i + size]) for i in range(0, len(stream), size))


def test_a_well_ordered_stream_passes_through_untouched() -> None:
    stream = opening() + b"".join(transfer(i) for i in range(5))
    repair = DeliveryIdRepair()
    assert repair.feed(stream) == stream
    assert repair.rewritten == 0


@pytest.mark.parametrize("piece", [1, 3, 7, 64])
def test_any_split_of_the_stream_gives_the_same_bytes(piece: int) -> None:
    stream = opening() + transfer(0) + transfer(1) + transfer(1) + transfer(5) + transfer(4)
    assert feed_in_pieces(stream, piece) == DeliveryIdRepair().feed(stream)


def test_duplicate_and_skipped_ids_are_renumbered_and_payloads_kept() -> None:
    payloads = [f"\x00Sw\xa1\x02m{i}".encode() for i in range(5)]
    sent_ids = [0, 1, 1, 3, 3]  # the SDK's race: a duplicate, a lost increment, another duplicate
    stream = opening() + b"".join(transfer(i, p) for i, p in zip(sent_ids, payloads, strict=True))
    repair = DeliveryIdRepair()
    out = repair.feed(stream)
    assert transfers_of(out) == [(i, p) for i, p in enumerate(payloads)]
    assert repair.rewritten == 2


def test_first_transfer_sets_the_expectation_as_proton_does() -> None:
    stream = opening() + transfer(7) + transfer(7) + transfer(9)
    assert [i for i, _ in transfers_of(DeliveryIdRepair().feed(stream))] == [7, 8, 9]


def test_a_new_id_of_another_width_resizes_the_frame() -> None:
    stream = opening() + b"".join(transfer(i) for i in range(256)) + transfer(255) + transfer(257)
    assert encode_uint(255)[0] == 0x52 and encode_uint(256)[0] == 0x70
    out = DeliveryIdRepair().feed(stream)
    assert [i for i, _ in transfers_of(out)] == list(range(258))
    assert len(out) == len(stream) + 3  # smalluint 255 became uint 256


def test_multi_frame_deliveries_count_once_and_keep_their_id() -> None:
    first = transfer(1, b"\x00Sw\xa1\x04ab", more=True)
    middle = transfer(1, b"cd", more=True)
    last = transfer(None, b"ef", more=False, delivery_tag=None)
    stream = opening() + transfer(0) + transfer(0) + first + middle + last + transfer(2)
    ids = [i for i, _ in transfers_of(DeliveryIdRepair().feed(stream))]
    assert ids == [0, 1, 2, 2, None, 3]


def test_sessions_are_numbered_apart_and_reset_by_begin() -> None:
    stream = (
        opening()
        + transfer(0)
        + frame(make(TransferFrame, handle=0, delivery_id=5, delivery_tag=b"x", payload=b"p"), 1)
        + frame(make(TransferFrame, handle=0, delivery_id=5, delivery_tag=b"y", payload=b"q"), 1)
        + transfer(0)
        + frame(make(BeginFrame, next_outgoing_id=0, incoming_window=5, outgoing_window=5), 1)
        + frame(make(TransferFrame, handle=0, delivery_id=0, delivery_tag=b"z", payload=b"r"), 1)
    )
    ids = [i for i, _ in transfers_of(DeliveryIdRepair().feed(stream))]
    assert ids == [0, 5, 6, 1, 0]


def test_bytes_it_cannot_read_pass_through_unchanged() -> None:
    garbage = AMQP_HEADER + b"\x00\x00\x00\x04\x02\x00\x00\x00" + bytes(range(40))
    repair = DeliveryIdRepair()
    assert repair.feed(garbage) == garbage
    assert repair.feed(transfer(3) + transfer(3)) == transfer(3) + transfer(3)


def test_sasl_frames_and_heartbeats_pass_through() -> None:
    sasl = b"AMQP\x03\x01\x00\x00" + struct.pack(">IBBH", 12, 2, 1, 0) + b"\x00\x53\x41\x45"
    heartbeat = struct.pack(">IBBH", 8, 2, 0, 0)
    stream = sasl + opening() + heartbeat + transfer(0) + heartbeat
    assert DeliveryIdRepair().feed(stream) == stream


def proton_deliveries(chunks: list[bytes]) -> tuple[int, str | None]:
    """Push `chunks` into a proton server transport, answering opens between chunks as the
    broker does: (deliveries received, error if any)."""
    connection = Connection()
    collector = Collector()
    connection.collect(collector)
    transport = Transport(Transport.SERVER)
    transport.bind(connection)
    received = 0
    for chunk in chunks:
        transport.push(chunk)
        while event := collector.peek():
            if event.type == Event.CONNECTION_REMOTE_OPEN:
                event.connection.open()
            elif event.type == Event.SESSION_REMOTE_OPEN:
                event.session.open()
            elif event.type == Event.LINK_REMOTE_OPEN:
                event.link.open()
                event.link.flow(1000)
            elif event.type == Event.DELIVERY and not event.delivery.partial:
                received += 1
                event.link.advance()
            collector.pop()
        transport.peek(transport.pending())  # let proton write its open, begin, attach, flow
        transport.pop(transport.pending())
    condition = transport.condition or connection.remote_condition
    return received, (condition.description if condition else None)


def test_proton_refuses_the_racy_stream_and_accepts_it_repaired() -> None:
    racy = transfer(0) + transfer(1) + transfer(1) + transfer(2)
    _, error = proton_deliveries([opening(), racy])
    assert error is not None and "sequencing error" in error
    repair = DeliveryIdRepair()
    assert proton_deliveries([repair.feed(opening()), repair.feed(racy)]) == (4, None)
