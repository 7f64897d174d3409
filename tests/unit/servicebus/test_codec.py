"""The broker's AMQP codec: section splitting on real client encodings, primitive decoding,
map merging, header encoding, and refusal of malformed input with CodecError only."""

from __future__ import annotations

import random
import struct
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus._pyamqp._encode import encode_payload
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport
from proton import Data, Message, int32, symbol, timestamp

from devstack.servicebus import codec
from devstack.servicebus.codec import CodecError, Described, Symbol, Timestamp

# --- messages as real clients encode them ---------------------------------------------------


def proton_message() -> bytes:
    message = Message(
        id="m-1",
        correlation_id="c-1",
        subject="greeting",
        content_type="text/plain",
        body="hello",
        properties={"count": 3, "who": "world", "flag": True},
        annotations={symbol("x-opt-partition-key"): "pk"},
        durable=True,
        priority=7,
        ttl=30,
    )
    return message.encode()


def sdk_message(message: ServiceBusMessage) -> bytes:
    """Bytes exactly as azure-servicebus (pyamqp transport) puts them on the wire."""
    outgoing = PyamqpTransport.to_outgoing_amqp_message(message._raw_amqp_message)
    return bytes(encode_payload(bytearray(), outgoing))


def sdk_plain() -> bytes:
    return sdk_message(
        ServiceBusMessage(
            "payload",
            message_id="sdk-1",
            application_properties={"attempt": 2, "step": "charge"},
            subject="orders",
            time_to_live=timedelta(seconds=45),
        )
    )


def sdk_scheduled() -> bytes:
    return sdk_message(
        ServiceBusMessage(
            b"\x00\x01binary",
            message_id="sdk-2",
            scheduled_enqueue_time_utc=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
        )
    )


VALID_MESSAGES: dict[str, Callable[[], bytes]] = {
    "proton": proton_message,
    "sdk-plain": sdk_plain,
    "sdk-scheduled": sdk_scheduled,
}


def values_by_code(raw: bytes) -> dict[int, Any]:
    return {s.code: codec.section_value(s) for s in codec.split_sections(raw)}


# --- splitting ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALID_MESSAGES))
def test_split_sections_covers_the_whole_message_in_order(name: str) -> None:
    raw = VALID_MESSAGES[name]()
    sections = codec.split_sections(raw)
    assert b"".join(s.raw for s in sections) == raw
    codes = [s.code for s in sections]
    assert codes == sorted(codes), "sections come in the order AMQP prescribes"
    assert all(codec.HEADER <= c <= codec.FOOTER for c in codes)
    # skip() walks the same boundaries
    pos, ends = 0, []
    while pos < len(raw):
        pos = codec.skip(raw, pos)
        ends.append(pos)
    assert ends == [sum(len(s.raw) for s in sections[: i + 1]) for i in range(len(sections))]


def test_proton_message_sections_decode_to_what_proton_encoded() -> None:
    values = values_by_code(proton_message())
    assert set(values) == {
        codec.HEADER,
        codec.MESSAGE_ANNOTATIONS,
        codec.PROPERTIES,
        codec.APPLICATION_PROPERTIES,
        codec.AMQP_VALUE,
    }
    header = values[codec.HEADER]
    assert header[0] is True and header[1] == 7 and header[2] == 30_000
    assert values[codec.MESSAGE_ANNOTATIONS] == {"x-opt-partition-key": "pk"}
    assert isinstance(next(iter(values[codec.MESSAGE_ANNOTATIONS])), Symbol)
    props = values[codec.PROPERTIES]
    assert props[0] == "m-1" and props[3] == "greeting" and props[5] == "c-1"
    assert props[6] == Symbol("text/plain") and isinstance(props[6], Symbol)
    assert values[codec.APPLICATION_PROPERTIES] == {"count": 3, "who": "world", "flag": True}
    assert values[codec.AMQP_VALUE] == "hello"


def test_sdk_message_sections_decode_to_what_the_sdk_sent() -> None:
    values = values_by_code(sdk_plain())
    assert codec.HEADER in values and values[codec.HEADER][2] == 45_000
    props = values[codec.PROPERTIES]
    assert props[0] == "sdk-1" and props[3] == "orders"
    assert values[codec.APPLICATION_PROPERTIES] == {"attempt": 2, "step": "charge"}
    assert values[codec.DATA] == b"payload"


def test_sdk_scheduled_message_carries_the_enqueue_time_annotation() -> None:
    values = values_by_code(sdk_scheduled())
    when = values[codec.MESSAGE_ANNOTATIONS]["x-opt-scheduled-enqueue-time"]
    assert isinstance(when, Timestamp)
    assert when == int(datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp() * 1000)
    assert values[codec.DATA] == b"\x00\x01binary"


def test_section_map_bytes_is_the_encoded_map_after_the_descriptor() -> None:
    sections = {s.code: s for s in codec.split_sections(proton_message())}
    raw_map = codec.section_map_bytes(sections[codec.APPLICATION_PROPERTIES])
    assert raw_map[0] in (0xC1, 0xD1)
    assert codec.decode(raw_map) == ({"count": 3, "who": "world", "flag": True}, len(raw_map))


def test_split_sections_accepts_the_long_ulong_descriptor_form() -> None:
    long_form = b"\x00\x80" + struct.pack(">Q", codec.AMQP_VALUE) + b"\xa1\x02hi"
    (section,) = codec.split_sections(long_form)
    assert section.code == codec.AMQP_VALUE and codec.section_value(section) == "hi"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"", "empty message"),
        (b"\xa1\x02hi", "expected a described section"),
        (b"\x00\x53\x10\x40", "not an AMQP message section"),
        (b"\x00\xa1\x01x\x40", "unsupported section descriptor"),
        (b"\x00\x53\x77\xa1\x05hi", "runs past the end"),
    ],
)
def test_split_sections_refuses_what_is_not_a_message(raw: bytes, why: str) -> None:
    with pytest.raises(CodecError, match=why):
        codec.split_sections(raw)


# --- decoding primitives --------------------------------------------------------------------

U = uuid.UUID("12345678-1234-5678-1234-567812345678")

PRIMITIVES: list[tuple[str, bytes, Any]] = [
    ("null", b"\x40", None),
    ("true", b"\x41", True),
    ("false", b"\x42", False),
    ("boolean-1", b"\x56\x01", True),
    ("boolean-0", b"\x56\x00", False),
    ("ubyte", b"\x50\xff", 255),
    ("byte", b"\x51\xff", -1),
    ("ushort", b"\x60\xff\xfe", 0xFFFE),
    ("short", b"\x61\xff\xfe", -2),
    ("uint", b"\x70\xff\xff\xff\xfe", 0xFFFFFFFE),
    ("smalluint", b"\x52\xc8", 200),
    ("uint0", b"\x43", 0),
    ("int", b"\x71\xff\xff\xff\xfd", -3),
    ("smallint", b"\x54\xfc", -4),
    ("ulong", b"\x80" + struct.pack(">Q", 2**64 - 1), 2**64 - 1),
    ("smallulong", b"\x53\x07", 7),
    ("ulong0", b"\x44", 0),
    ("long", b"\x81" + struct.pack(">q", -(2**63)), -(2**63)),
    ("smalllong", b"\x55\x80", -128),
    ("float", b"\x72" + struct.pack(">f", 1.5), 1.5),
    ("double", b"\x82" + struct.pack(">d", -2.25), -2.25),
    ("char", b"\x73\x00\x01\xf6\x00", "\U0001f600"),
    ("timestamp", b"\x83" + struct.pack(">q", 1_700_000_000_123), 1_700_000_000_123),
    ("uuid", b"\x98" + U.bytes, U),
    ("vbin8", b"\xa0\x03abc", b"abc"),
    ("vbin32", b"\xb0\x00\x00\x00\x03abc", b"abc"),
    ("str8", b"\xa1\x04h\xc3\xa9!", "hé!"),
    ("str32", b"\xb1\x00\x00\x00\x02ok", "ok"),
    ("sym8", b"\xa3\x03sym", "sym"),
    ("sym32", b"\xb3\x00\x00\x00\x03sym", "sym"),
    ("list0", b"\x45", []),
    ("list8", b"\xc0\x04\x02\x41\x50\x09", [True, 9]),
    ("list32", b"\xd0\x00\x00\x00\x07\x00\x00\x00\x02\x40\x52\x05", [None, 5]),
    ("map8", b"\xc1\x06\x02\xa3\x01k\x54\x01", {"k": 1}),
    ("map32", b"\xd1\x00\x00\x00\x08\x00\x00\x00\x02\xa1\x01k\x41", {"k": True}),
    ("array8-int", b"\xe0\x0a\x02\x71\x00\x00\x00\x01\xff\xff\xff\xfe", [1, -2]),
    ("array32-sym", b"\xf0\0\0\0\x0f\0\0\0\x02\xb3\0\0\0\x01a\0\0\0\x01b", ["a", "b"]),
    ("array8-bool", b"\xe0\x04\x02\x56\x01\x00", [True, False]),
    ("array8-empty", b"\xe0\x02\x00\x71", []),
    ("described", b"\x00\xa3\x03foo\x52\x02", Described(("foo", 2))),
]


@pytest.mark.parametrize(
    ("encoded", "expected"), [(e, v) for _, e, v in PRIMITIVES], ids=[n for n, _, _ in PRIMITIVES]
)
def test_decode_primitive(encoded: bytes, expected: Any) -> None:
    value, end = codec.decode(encoded + b"\x40trailing", 0)
    assert value == expected
    assert type(value) is type(expected) or isinstance(value, type(expected))
    assert end == len(encoded)
    assert codec.skip(encoded + b"\x40", 0) == len(encoded), "skip agrees with decode"


def test_decode_keeps_symbol_and_timestamp_types() -> None:
    assert isinstance(codec.decode(b"\xa3\x01a")[0], Symbol)
    assert not isinstance(codec.decode(b"\xa1\x01a")[0], Symbol)
    assert isinstance(codec.decode(b"\x83" + struct.pack(">q", 5))[0], Timestamp)
    described = codec.decode(b"\x00\x53\x77\x40")[0]
    assert isinstance(described, Described)
    assert (described.descriptor, described.value) == (0x77, None)


def test_decode_at_an_offset() -> None:
    buf = b"\x41\x52\x05\xa1\x02hi"
    assert codec.decode(buf, 1) == (5, 3)
    assert codec.decode(buf, 3) == ("hi", 7)


def proton_encoded(put: Callable[[Data], None]) -> bytes:
    data = Data()
    put(data)
    return data.encode()


def _put_int_array(d: Data) -> None:
    d.put_array(False, Data.INT)
    d.enter()
    for v in (1, -2, 2**31 - 1):
        d.put_int(v)
    d.exit()


def _put_symbol_array(d: Data) -> None:
    d.put_array(False, Data.SYMBOL)
    d.enter()
    for v in ("com.microsoft:a", "b"):
        d.put_symbol(v)
    d.exit()


def _put_nested(d: Data) -> None:
    d.put_object({symbol("k"): [1, "two", None, {"in": 2.5}], "t": timestamp(1234)})


@pytest.mark.parametrize(
    ("put", "expected"),
    [
        (lambda d: d.put_ubyte(200), 200),
        (lambda d: d.put_byte(-100), -100),
        (lambda d: d.put_ushort(60_000), 60_000),
        (lambda d: d.put_short(-30_000), -30_000),
        (lambda d: d.put_uint(4_000_000_000), 4_000_000_000),
        (lambda d: d.put_uint(7), 7),
        (lambda d: d.put_int(-2_000_000_000), -2_000_000_000),
        (lambda d: d.put_ulong(2**63 + 5), 2**63 + 5),
        (lambda d: d.put_long(-(2**40)), -(2**40)),
        (lambda d: d.put_long(-5), -5),
        (lambda d: d.put_float(0.25), 0.25),
        (lambda d: d.put_double(1e300), 1e300),
        (lambda d: d.put_char("Z"), "Z"),
        (lambda d: d.put_timestamp(1_700_000_000_000), 1_700_000_000_000),
        (lambda d: d.put_uuid(U), U),
        (lambda d: d.put_binary(b"x" * 300), b"x" * 300),
        (lambda d: d.put_string("é" * 200), "é" * 200),
        (lambda d: d.put_symbol("s" * 256), "s" * 256),
        (lambda d: d.put_bool(False), False),
        (lambda d: d.put_null(), None),
        (_put_int_array, [1, -2, 2**31 - 1]),
        (_put_symbol_array, ["com.microsoft:a", "b"]),
        (_put_nested, {"k": [1, "two", None, {"in": 2.5}], "t": 1234}),
    ],
)
def test_decode_matches_proton_encoding(put: Callable[[Data], None], expected: Any) -> None:
    encoded = proton_encoded(put)
    value, end = codec.decode(encoded)
    assert value == expected
    assert end == len(encoded)


# --- encoding -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -(2**63),
        2**63 - 1,
        Timestamp(1_700_000_000_000),
        U,
        Symbol("x-opt-sequence-number"),
        "plain",
        "é" * 300,
        b"\x00\xff",
        b"b" * 300,
        {Symbol("a"): 1, "b": "two", "c": None},
    ],
)
def test_encode_round_trips_through_decode_and_proton(value: Any) -> None:
    encoded = codec.encode(value)
    assert codec.decode(encoded) == (value, len(encoded))
    data = Data()
    data.decode(encoded)
    assert data.get_object() == value


def test_encode_picks_the_amqp_types_service_bus_uses() -> None:
    data = Data()
    data.decode(codec.encode(Timestamp(5)))
    assert data.type() == Data.TIMESTAMP
    data.decode(codec.encode(Symbol("s")))
    assert data.type() == Data.SYMBOL
    data.decode(codec.encode(5))
    assert data.type() == Data.LONG
    with pytest.raises(TypeError):
        codec.encode(1.5)


# --- merge_map ------------------------------------------------------------------------------


def _app_props_map() -> bytes:
    sections = {s.code: s for s in codec.split_sections(proton_message())}
    return codec.section_map_bytes(sections[codec.APPLICATION_PROPERTIES])


def test_merge_map_keeps_other_entries_byte_for_byte_and_overrides_updated_keys() -> None:
    original = _app_props_map()
    kept_entries = dict(codec.map_entries(original))
    merged = codec.merge_map(original, {"count": "replaced", "new": Symbol("added")})
    assert codec.decode(merged)[0] == {
        "who": "world",
        "flag": True,
        "count": "replaced",
        "new": "added",
    }
    assert kept_entries["who"] in merged and kept_entries["flag"] in merged
    # proton encoded count=3 as an int (0x71); its old entry must be gone, not duplicated
    assert kept_entries["count"] not in merged
    assert len(list(codec.map_entries(merged))) == 4
    data = Data()
    data.decode(merged)
    assert data.get_object()["count"] == "replaced"


def test_merge_map_preserves_integer_widths_of_untouched_entries() -> None:
    original = proton_encoded(lambda d: d.put_object({"i": int32(1), "keep": int32(7)}))
    merged = codec.merge_map(original, {"i": 2})
    data = Data()
    data.decode(merged)
    result = data.get_object()
    assert result == {"keep": 7, "i": 2}
    assert isinstance(result["keep"], int32), "the client's int32 stays an int32"
    assert not isinstance(result["i"], int32), "updates are encoded as long"


def test_merge_map_from_nothing_and_with_no_updates() -> None:
    assert codec.decode(codec.merge_map(None, {"a": 1}))[0] == {"a": 1}
    assert codec.decode(codec.merge_map(b"", {"a": 1}))[0] == {"a": 1}
    original = _app_props_map()
    assert codec.decode(codec.merge_map(original, {}))[0] == codec.decode(original)[0]


def test_map_entries_refuses_a_non_map() -> None:
    with pytest.raises(CodecError, match="expected a map"):
        list(codec.map_entries(b"\xc0\x01\x00"))


def test_merge_encoded_takes_updates_already_encoded() -> None:
    original = _app_props_map()
    update = codec.encode("count") + codec.encode("replaced")
    assert codec.merge_encoded(original, {"count": update}) == codec.merge_map(
        original, {"count": "replaced"}
    )


def test_long_and_timestamp_encoders_match_encode() -> None:
    assert codec.encode_long(-7) == codec.encode(-7)
    assert codec.encode_timestamp_ms(1_700_000_000_123) == codec.encode(
        Timestamp(1_700_000_000_123)
    )
    assert codec.encoded_symbol("x-opt-lock-token") == codec.encode(Symbol("x-opt-lock-token"))


# --- first_list_item ------------------------------------------------------------------------


@pytest.mark.parametrize("message_id", ["order-1", 42, uuid.UUID(int=7), b"\x01\x02", None])
def test_first_list_item_reads_the_message_id_of_a_properties_section(message_id: Any) -> None:
    raw = Message(id=message_id, subject="s", reply_to="r", body="x").encode()
    (properties,) = [s for s in codec.split_sections(raw) if s.code == codec.PROPERTIES]
    assert codec.first_list_item(properties) == codec.section_value(properties)[0]


def test_first_list_item_of_an_empty_or_wide_list() -> None:
    empty = codec.Section(codec.PROPERTIES, b"\x00\x53\x73\x45")
    assert codec.first_list_item(empty) is None
    zero = codec.Section(codec.PROPERTIES, b"\x00\x53\x73\xc0\x01\x00")
    assert codec.first_list_item(zero) is None
    item = codec.encode("id-1")
    wide = b"\x00\x53\x73\xd0" + struct.pack(">II", len(item) + 4, 1) + item
    assert codec.first_list_item(codec.Section(codec.PROPERTIES, wide)) == "id-1"


@pytest.mark.parametrize(
    "raw",
    [b"\x00\x53\x73\xa1\x01x", b"\x00\x53\x73\xc0", b"\x00\x53\x73\xc0\x05\x01\xa1"],
)
def test_first_list_item_refuses_what_is_not_a_list(raw: bytes) -> None:
    with pytest.raises(CodecError):
        codec.first_list_item(codec.Section(codec.PROPERTIES, raw))


# --- header ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("durable", "priority", "delivery_count"),
    [(True, 4, 0), (False, 0, 1), (True, 9, 2**32 - 1), (False, 255, 12345)],
)
def test_encode_header_round_trips_through_proton(
    durable: bool, priority: int, delivery_count: int
) -> None:
    raw = codec.encode_header(durable, priority, delivery_count) + codec.described_section(
        codec.AMQP_VALUE, codec.encode("body")
    )
    message = Message()
    message.decode(raw)
    assert message.durable is durable
    assert message.priority == priority
    assert message.delivery_count == delivery_count
    assert message.first_acquirer is False
    assert message.ttl == 0
    assert message.body == "body"
    header = codec.section_value(codec.split_sections(raw)[0])
    assert header == [durable, priority, None, False, delivery_count]


# --- malformed input: CodecError, never another exception -----------------------------------


MALFORMED: list[tuple[str, Callable[[], object]]] = [
    ("split: lone described marker", lambda: codec.split_sections(b"\x00")),
    ("split: descriptor code missing", lambda: codec.split_sections(b"\x00\x53")),
    ("split: truncated ulong descriptor", lambda: codec.split_sections(b"\x00\x80\x00")),
    ("split: section after a valid one", lambda: codec.split_sections(b"\x00\x53\x77\x40\x00")),
    ("decode: empty", lambda: codec.decode(b"")),
    ("decode: char beyond unicode", lambda: codec.decode(b"\x73\xff\xff\xff\xff")),
    ("decode: truncated uuid", lambda: codec.decode(b"\x98\x00\x01")),
    ("decode: map with odd count", lambda: codec.decode(b"\xc1\x02\x01\x40")),
    ("decode: truncated str32", lambda: codec.decode(b"\xb1\x00\x00\x00\x09ab")),
    ("decode: bad utf-8", lambda: codec.decode(b"\xa1\x02\xff\xfe")),
    ("decode: non-ascii symbol", lambda: codec.decode(b"\xa3\x01\xe9")),
    ("decode: array of described", lambda: codec.decode(b"\xe0\x03\x01\x00\x40")),
    ("decode: unknown code", lambda: codec.decode(b"\x01")),
    ("decode: decimal32", lambda: codec.decode(b"\x74\x00\x00\x00\x00")),
    ("skip: unknown code", lambda: codec.skip(b"\x20", 0)),
    ("skip: past the end", lambda: codec.skip(b"\xa0\x05ab", 0)),
    ("skip: empty", lambda: codec.skip(b"", 0)),
    ("skip: deeply nested descriptors", lambda: codec.skip(b"\x00" * 5000 + b"\x40\x40", 0)),
    ("decode: deeply nested descriptors", lambda: codec.decode(b"\x00" * 5000 + b"\x40\x40")),
    ("decode: deeply nested lists", lambda: codec.decode(b"\xc0\x02\x01" * 5000 + b"\x40")),
    ("map_entries: empty", lambda: list(codec.map_entries(b""))),
    ("map_entries: truncated map32", lambda: list(codec.map_entries(b"\xd1\x00"))),
    ("merge_map: truncated map", lambda: codec.merge_map(b"\xc1\x05\x02\xa1", {"a": 1})),
]


@pytest.mark.parametrize("call", [c for _, c in MALFORMED], ids=[n for n, _ in MALFORMED])
def test_malformed_input_raises_codec_error(call: Callable[[], object]) -> None:
    with pytest.raises(CodecError):
        call()


def _exercise(raw: bytes) -> None:
    """Everything the broker does with a client's bytes, in the order it does it."""
    for section in codec.split_sections(raw):
        codec.section_value(section)
        if section.code in (codec.MESSAGE_ANNOTATIONS, codec.APPLICATION_PROPERTIES):
            raw_map = codec.section_map_bytes(section)
            codec.merge_map(raw_map, {Symbol("x-opt-sequence-number"): 1})
    codec.decode(raw)


def _mutations(raw: bytes, rng: random.Random) -> list[bytes]:
    out = [raw[:cut] for cut in range(len(raw))]  # every truncation
    for _ in range(400):
        data = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            kind = rng.random()
            at = rng.randrange(len(data))
            if kind < 0.5:
                data[at] = rng.randrange(256)
            elif kind < 0.7:
                data[at] = rng.choice([0x00, 0x40, 0x45, 0x53, 0x73, 0x98, 0xC1, 0xD1, 0xE0, 0xF0])
            elif kind < 0.85:
                del data[at]
            else:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
        out.append(bytes(data))
    out += [bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))) for _ in range(300)]
    return out


@pytest.mark.parametrize("name", sorted(VALID_MESSAGES))
def test_fuzzed_messages_give_codec_error_or_a_result(name: str) -> None:
    """Mutated client messages: the codec succeeds or raises CodecError, nothing else."""
    rng = random.Random(f"codec-fuzz-{name}")
    raw = VALID_MESSAGES[name]()
    _exercise(raw)  # the unmutated message is fine
    failures: dict[str, bytes] = {}
    for candidate in _mutations(raw, rng):
        try:
            _exercise(candidate)
        except CodecError:
            pass
        except Exception as exc:  # collect one example per exception type
            failures.setdefault(f"{type(exc).__name__}: {exc}", candidate)
    assert not failures, "non-CodecError exceptions:\n" + "\n".join(
        f"  {why}  <- {data.hex()}" for why, data in failures.items()
    )
