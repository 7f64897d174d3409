"""The slice of the AMQP 1.0 type system the broker needs to route Service Bus messages.

The broker never re-encodes a client's message. It splits the transfer into its sections,
keeps the immutable ones (properties, application properties, body, footer) as the client's own
bytes, and writes fresh header and message-annotation sections for each delivery. That keeps
messages byte-faithful (re-encoding through a generic codec can change integer widths) and
is several times cheaper than a decode/encode round trip.

Encoding reference: OASIS AMQP 1.0, part 1 (types) and part 3 (message format). A value's
width follows from the high nibble of its constructor code, which is what `skip` relies on.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

_FIXED_WIDTH = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}


class CodecError(ValueError):
    """The bytes are not a well-formed AMQP message."""


class Symbol(str):
    """An AMQP symbol (ASCII), as distinct from a string."""


class Timestamp(int):
    """An AMQP timestamp: milliseconds since the Unix epoch."""


class Described(tuple):
    """A described value: (descriptor, value)."""

    @property
    def descriptor(self) -> Any:
        return self[0]

    @property
    def value(self) -> Any:
        return self[1]


def skip(buf: bytes, pos: int) -> int:
    """Return the offset just past the encoded value that starts at `pos`."""
    try:
        code = buf[pos]
        if code == 0x00:
            return skip(buf, skip(buf, pos + 1))
        nibble = code >> 4
        if nibble in _FIXED_WIDTH:
            end = pos + 1 + _FIXED_WIDTH[nibble]
        elif nibble in (0xA, 0xC, 0xE):
            end = pos + 2 + buf[pos + 1]
        elif nibble in (0xB, 0xD, 0xF):
            end = pos + 5 + struct.unpack_from(">I", buf, pos + 1)[0]
        else:
            raise CodecError(f"unknown AMQP type code 0x{code:02x} at offset {pos}")
    except (IndexError, struct.error) as exc:
        raise CodecError(f"truncated AMQP value at offset {pos}") from exc
    except RecursionError as exc:
        raise CodecError(f"AMQP value at offset {pos} is nested too deeply") from exc
    if end > len(buf):
        raise CodecError(f"AMQP value at offset {pos} runs past the end of the frame")
    return end


@dataclass(frozen=True, slots=True)
class Section:
    code: int
    raw: bytes


def split_sections(buf: bytes) -> list[Section]:
    """Split an encoded message into its sections, checking each is a known section type."""
    sections: list[Section] = []
    pos = 0
    while pos < len(buf):
        if buf[pos] != 0x00:
            raise CodecError(f"expected a described section at offset {pos}")
        try:
            code = _section_code(buf, pos + 1)
        except (IndexError, struct.error) as exc:
            raise CodecError(f"truncated section descriptor at offset {pos}") from exc
        end = skip(buf, pos)
        sections.append(Section(code, bytes(buf[pos:end])))
        pos = end
    if not sections:
        raise CodecError("empty message")
    return sections


def _section_code(buf: bytes, pos: int) -> int:
    if buf[pos] == 0x53:
        code = buf[pos + 1]
    elif buf[pos] == 0x80:
        code = struct.unpack_from(">Q", buf, pos + 1)[0]
    else:
        raise CodecError(f"unsupported section descriptor at offset {pos}")
    if not HEADER <= code <= FOOTER:
        raise CodecError(f"0x{code:x} is not an AMQP message section")
    return code


def section_value(section: Section) -> Any:
    """Decode a section's value (the part after its descriptor)."""
    return decode(section.raw)[0].value


def first_list_item(section: Section) -> Any:
    """The first item of a list-valued section (None when the list is empty), decoding nothing
    else: the message-id of a properties section costs one value, not thirteen."""
    buf = section.raw
    try:
        pos = skip(buf, 1)  # past the descriptor
        code = buf[pos]
        if code == 0x45:
            return None
        wide = code == 0xD0
        if not wide and code != 0xC0:
            raise CodecError(f"expected a list, found type code 0x{code:02x} at offset {pos}")
        _, pos = _size(buf, pos + 1, wide)
        count, pos = _size(buf, pos, wide)
    except (IndexError, struct.error) as exc:
        raise CodecError("truncated list header") from exc
    return decode(buf, pos)[0] if count else None


# --- decoding -------------------------------------------------------------------------------


def decode(buf: bytes, pos: int = 0) -> tuple[Any, int]:
    """Decode one value at `pos`; return it and the offset after it."""
    try:
        return _decode(buf, pos)
    except CodecError:
        raise
    except (
        IndexError,
        struct.error,
        UnicodeDecodeError,
        ValueError,
        OverflowError,
        RecursionError,
    ) as exc:
        raise CodecError(f"malformed AMQP value at offset {pos}: {exc}") from exc


def _decode(buf: bytes, pos: int) -> tuple[Any, int]:
    return _decode_body(buf[pos], buf, pos + 1)


def _decode_body(code: int, buf: bytes, pos: int) -> tuple[Any, int]:
    if code == 0x00:
        descriptor, pos = _decode(buf, pos)
        value, pos = _decode(buf, pos)
        return Described((descriptor, value)), pos
    simple = _SIMPLE.get(code)
    if simple is not None:
        fmt, convert = simple
        size = struct.calcsize(fmt)
        (raw,) = struct.unpack_from(fmt, buf, pos)
        return convert(raw), pos + size
    if code in _CONSTANTS:
        return _CONSTANTS[code], pos
    if code == 0x98:
        raw16 = bytes(buf[pos : pos + 16])
        if len(raw16) != 16:
            raise CodecError("truncated uuid")
        return uuid.UUID(bytes=raw16), pos + 16
    if code in (0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xB3):
        size, pos = _size(buf, pos, code & 0xF0 == 0xB0)
        raw = bytes(buf[pos : pos + size])
        if len(raw) != size:
            raise CodecError("truncated variable-width value")
        low = code & 0x0F
        value: Any = raw if low == 0 else raw.decode() if low == 1 else Symbol(raw.decode("ascii"))
        return value, pos + size
    if code in (0x45,):
        return [], pos
    if code in (0xC0, 0xD0, 0xC1, 0xD1):
        wide = code & 0xF0 == 0xD0
        _, pos = _size(buf, pos, wide)
        count, pos = _size(buf, pos, wide)
        items = []
        for _ in range(count):
            item, pos = _decode(buf, pos)
            items.append(item)
        if code & 0x0F == 0:
            return items, pos
        if count % 2:
            raise CodecError("a map needs an even number of items")
        return dict(zip(items[::2], items[1::2], strict=True)), pos
    if code in (0xE0, 0xF0):
        wide = code == 0xF0
        _, pos = _size(buf, pos, wide)
        count, pos = _size(buf, pos, wide)
        if count > len(buf) - pos:  # even zero-width elements cost a list slot each
            raise CodecError(f"array claims {count} elements in a {len(buf)}-byte frame")
        element = buf[pos]
        pos += 1
        if element == 0x00:
            raise CodecError("arrays of described values are not supported")
        items = []
        for _ in range(count):
            item, pos = _decode_body(element, buf, pos)
            items.append(item)
        return items, pos
    raise CodecError(f"unsupported AMQP type code 0x{code:02x}")


def _size(buf: bytes, pos: int, wide: bool) -> tuple[int, int]:
    if wide:
        return struct.unpack_from(">I", buf, pos)[0], pos + 4
    return buf[pos], pos + 1


_SIMPLE: dict[int, tuple[str, Any]] = {
    0x50: (">B", int),
    0x51: (">b", int),
    0x52: (">B", int),
    0x53: (">B", int),
    0x54: (">b", int),
    0x55: (">b", int),
    0x56: (">B", bool),
    0x60: (">H", int),
    0x61: (">h", int),
    0x70: (">I", int),
    0x71: (">i", int),
    0x72: (">f", float),
    0x73: (">I", chr),
    0x80: (">Q", int),
    0x81: (">q", int),
    0x82: (">d", float),
    0x83: (">q", Timestamp),
}
_CONSTANTS: dict[int, Any] = {0x40: None, 0x41: True, 0x42: False, 0x43: 0, 0x44: 0}


# --- encoding -------------------------------------------------------------------------------


def encode(value: Any) -> bytes:
    """Encode a Python value with the AMQP type Service Bus uses for it."""
    if value is None:
        return b"\x40"
    if value is True:
        return b"\x41"
    if value is False:
        return b"\x42"
    if isinstance(value, Timestamp):
        return b"\x83" + struct.pack(">q", value)
    if isinstance(value, int):
        return b"\x81" + struct.pack(">q", value)
    if isinstance(value, uuid.UUID):
        return b"\x98" + value.bytes
    if isinstance(value, Symbol):
        return _variable(0xA3, value.encode("ascii"))
    if isinstance(value, str):
        return _variable(0xA1, value.encode())
    if isinstance(value, bytes | bytearray | memoryview):
        return _variable(0xA0, bytes(value))
    if isinstance(value, dict):
        return encode_map_entries(encode(k) + encode(v) for k, v in value.items())
    raise TypeError(f"cannot encode {type(value).__name__} as AMQP")


def _variable(code: int, raw: bytes) -> bytes:
    if len(raw) < 256:
        return bytes((code, len(raw))) + raw
    return bytes((code | 0x10,)) + struct.pack(">I", len(raw)) + raw


def encode_map_entries(entries: Iterable[bytes]) -> bytes:
    """A map (always the 4-byte form) from already-encoded key+value pairs."""
    pairs = list(entries)
    body = b"".join(pairs)
    return b"\xd1" + struct.pack(">II", len(body) + 4, len(pairs) * 2) + body


def encode_header(durable: bool, priority: int, delivery_count: int) -> bytes:
    """A header section carrying an explicit delivery count (Service Bus always sends one)."""
    fields = (
        (b"\x41" if durable else b"\x42")
        + bytes((0x50, priority & 0xFF))
        + b"\x40"
        + b"\x42"
        + b"\x70"
        + struct.pack(">I", delivery_count)
    )
    return b"\x00\x53\x70\xc0" + bytes((len(fields) + 1, 5)) + fields


def described_section(code: int, encoded_value: bytes) -> bytes:
    return bytes((0x00, 0x53, code)) + encoded_value


def map_entries(raw_map: bytes) -> Iterator[tuple[Any, bytes]]:
    """Yield (decoded key, encoded key+value bytes) for each entry of an encoded map."""
    code = raw_map[0] if raw_map else None
    if code not in (0xC1, 0xD1):
        raise CodecError(f"expected a map, found type code {code!r}")
    wide = code == 0xD1
    try:
        _, pos = _size(raw_map, 1, wide)
        count, pos = _size(raw_map, pos, wide)
    except (IndexError, struct.error) as exc:
        raise CodecError("truncated map header") from exc
    for _ in range(count // 2):
        key, key_end = decode(raw_map, pos)
        end = skip(raw_map, key_end)
        yield key, bytes(raw_map[pos:end])
        pos = end


def merge_map(raw_map: bytes | None, updates: dict[Any, Any]) -> bytes:
    """Encoded map = the entries of `raw_map` whose keys are not updated, then `updates`."""
    return merge_encoded(raw_map, {k: encode(k) + encode(v) for k, v in updates.items()})


def merge_encoded(raw_map: bytes | None, updates: dict[Any, bytes]) -> bytes:
    """:func:`merge_map` with each update already encoded (key and value bytes)."""
    kept = []
    if raw_map:
        kept = [entry for key, entry in map_entries(raw_map) if key not in updates]
    return encode_map_entries([*kept, *updates.values()])


def encoded_symbol(name: str) -> bytes:
    return encode(Symbol(name))


def encode_long(value: int) -> bytes:
    return b"\x81" + struct.pack(">q", value)


def encode_timestamp_ms(value: int) -> bytes:
    return b"\x83" + struct.pack(">q", value)


def section_map_bytes(section: Section) -> bytes:
    """The encoded map inside an annotations or application-properties section."""
    return section.raw[skip(section.raw, 1) :]
