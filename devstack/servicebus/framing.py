"""Tolerate the azure-servicebus SDK's racy delivery-ids on incoming transfers.

The sync SDK lets several threads send on one session (AutoLockRenewer renews each message from
its own worker thread, all through the receiver's `$management` link). Its session hands out
`delivery-id = next_outgoing_id` and increments it without a lock, so under concurrency two
transfers can carry the same delivery-id, or one can skip ahead. Service Bus accepts that;
proton-c does not: it closes the connection with `amqp:session:invalid-field` ("sequencing
error, expected delivery-id N, got M"), and every request in flight on it fails.

`DeliveryIdRepair` sits between the socket and proton's transport. It passes the byte stream
through frame by frame and, where a transfer that starts a new delivery carries a delivery-id
other than the one proton expects next on that session, rewrites it to the expected one. Payload
bytes are never touched, copied only when a frame header has to change, and a frame's size field
is fixed up when the new id needs a different width. Anything it does not understand is passed
through unchanged, so proton still reports real protocol errors itself.

The broker's event loop (driver.py) runs every read through one `DeliveryIdRepair` per
connection, then hands the bytes to proton with `push`.
"""

from __future__ import annotations

import logging
import struct

from proton import Transport

from devstack.servicebus import codec

log = logging.getLogger("servicebus.framing")

PROTOCOL_HEADER_PREFIX = b"AMQP"
FRAME_HEADER = struct.Struct(">IBBH")
AMQP_FRAME = 0
BEGIN, TRANSFER, END = 0x11, 0x14, 0x17
MAX_PERFORMATIVE = 64 * 1024  # a transfer performative is tens of bytes; more is not one


def encode_uint(value: int) -> bytes:
    """The shortest AMQP encoding of a uint, as the SDK itself writes it."""
    if value == 0:
        return b"\x43"
    if value < 256:
        return bytes((0x52, value))
    return b"\x70" + struct.pack(">I", value & 0xFFFFFFFF)


def _decode_uint(buf: bytes | memoryview, pos: int) -> int | None:
    code = buf[pos]
    if code == 0x43:
        return 0
    if code == 0x52:
        return buf[pos + 1]
    if code == 0x70:
        return struct.unpack_from(">I", buf, pos + 1)[0]
    return None  # null or not a uint


def _decode_bool(buf: bytes | memoryview, pos: int) -> bool:
    code = buf[pos]
    if code == 0x41:
        return True
    if code == 0x56:
        return buf[pos + 1] == 1
    return False  # 0x42 false, 0x40 null (default false)


class _Session:
    __slots__ = ("next_id", "open_links")

    def __init__(self) -> None:
        self.next_id: int | None = None  # proton takes its expectation from the first transfer
        self.open_links: dict[int, int] = {}  # handle -> id of its multi-frame delivery


class DeliveryIdRepair:
    """Stream filter for one connection's incoming bytes: feed() what the socket read, push what
    it returns. It holds back at most the start of a frame until the transfer performative in it
    is complete."""

    def __init__(self) -> None:
        self._pending = b""  # the start of a frame, until its performative is readable
        self._passthrough = 0  # bytes of the current frame still to pass unread
        self._disabled = False
        self._sessions: dict[int, _Session] = {}
        self.rewritten = 0

    def feed(self, data: bytes) -> bytes:
        if self._disabled:
            return data
        if self._pending:
            data = self._pending + data
            self._pending = b""
        out: list[bytes | memoryview] = []
        view = memoryview(data)
        pos, end = 0, len(data)
        clean_from = 0  # start of the run of bytes that go out unchanged
        while pos < end:
            if self._passthrough:
                step = min(self._passthrough, end - pos)
                self._passthrough -= step
                pos += step
                continue
            if end - pos < 8:
                break
            if data[pos : pos + 4] == PROTOCOL_HEADER_PREFIX:
                pos += 8
                continue
            size, doff, frame_type, channel = FRAME_HEADER.unpack_from(data, pos)
            if size < 8 or doff < 2 or doff * 4 > size:
                return self._give_up(out, view, clean_from, end, "malformed frame header")
            if frame_type != AMQP_FRAME or size == 8:  # SASL frame or heartbeat
                self._passthrough = size
                continue
            body = pos + doff * 4
            if end - body < 3:
                break
            code = data[body + 2] if data[body] == 0x00 and data[body + 1] == 0x53 else None
            if code in (BEGIN, END):
                self._sessions.pop(channel, None)
            if code != TRANSFER:
                self._passthrough = size
                continue
            list_end = self._performative_end(data, body + 3, pos + size)
            if list_end is None:
                if pos + min(size, doff * 4 + 3 + MAX_PERFORMATIVE) <= end:
                    return self._give_up(out, view, clean_from, end, "unreadable transfer")
                break  # wait for the rest of the performative
            new_head = self._transfer(data, pos, size, doff, channel, body + 3, list_end)
            if new_head is None:
                self._passthrough = size
                continue
            out.append(view[clean_from:pos])
            out.append(new_head)
            self._passthrough = size - (list_end - pos)
            pos = clean_from = list_end
        if pos < end:
            self._pending = bytes(view[pos:end])
        if clean_from == 0 and pos == end:
            return data
        out.append(view[clean_from:pos])
        return b"".join(out)

    def _give_up(
        self, out: list[bytes | memoryview], view: memoryview, clean_from: int, end: int, why: str
    ) -> bytes:
        log.debug("delivery-id repair off for this connection: %s", why)
        self._disabled = True
        out.append(view[clean_from:end])
        return b"".join(out)

    @staticmethod
    def _performative_end(data: bytes, pos: int, frame_end: int) -> int | None:
        """Offset just past the performative's field list, or None if not all here yet."""
        try:
            end = codec.skip(data, pos)
        except codec.CodecError:
            return None
        return end if end <= frame_end else None

    def _transfer(
        self,
        data: bytes,
        frame_pos: int,
        size: int,
        doff: int,
        channel: int,
        list_pos: int,
        list_end: int,
    ) -> bytes | None:
        """Track the delivery; return a new frame head (up to `list_end`) to rewrite its id."""
        fields = _list_fields(data, list_pos, list_end)
        if not fields:
            return None
        handle = _decode_uint(data, fields[0])
        if handle is None:
            return None
        session = self._sessions.get(channel)
        if session is None:
            session = self._sessions[channel] = _Session()

        def field(index: int) -> int | None:
            return fields[index] if index < len(fields) else None

        id_at, more_at, aborted_at = field(1), field(5), field(8)
        sent = _decode_uint(data, id_at) if id_at is not None else None
        more = more_at is not None and _decode_bool(data, more_at)
        aborted = aborted_at is not None and _decode_bool(data, aborted_at)
        assigned = session.open_links.get(handle)
        if assigned is None:  # the first frame of a delivery
            assigned = sent if session.next_id is None else session.next_id
            if assigned is None:
                return None  # no id where proton needs one: leave the error to proton
            session.next_id = (assigned + 1) & 0xFFFFFFFF
        if more and not aborted:
            session.open_links[handle] = assigned
        else:
            session.open_links.pop(handle, None)
        if sent is None or sent == assigned:
            return None
        assert id_at is not None
        self.rewritten += 1
        log.debug("transfer delivery-id %d taken as %d on channel %d", sent, assigned, channel)
        items = (
            data[fields[0] : id_at]
            + encode_uint(assigned)
            + data[codec.skip(data, id_at) : list_end]
        )
        performative = bytes((0x00, 0x53, TRANSFER)) + _encode_list(items, len(fields))
        head_len = doff * 4 + len(performative)
        new_size = size - (list_end - frame_pos) + head_len
        extended = data[frame_pos + 8 : frame_pos + doff * 4]
        return FRAME_HEADER.pack(new_size, doff, AMQP_FRAME, channel) + extended + performative


def _list_fields(data: bytes, pos: int, end: int) -> list[int] | None:
    """Offsets of the fields of the list encoded at `pos` (which ends at `end`)."""
    code = data[pos]
    if code == 0x45:
        return []
    if code == 0xC0:
        count, pos = data[pos + 2], pos + 3
    elif code == 0xD0:
        count, pos = struct.unpack_from(">I", data, pos + 5)[0], pos + 9
    else:
        return None
    offsets = []
    try:
        for _ in range(count):
            offsets.append(pos)
            pos = codec.skip(data, pos)
    except codec.CodecError:
        return None
    return offsets if pos == end else None


def _encode_list(items: bytes, count: int) -> bytes:
    if len(items) + 1 <= 255 and count <= 255:
        return bytes((0xC0, len(items) + 1, count)) + items
    return b"\xd0" + struct.pack(">II", len(items) + 4, count) + items


def push(transport: Transport, data: bytes) -> bytes:
    """Push as much as proton takes; return the rest (normally nothing: proton consumes whole
    frames as they are pushed, and a rewritten head is at most a few bytes longer)."""
    while data:
        capacity = transport.capacity()
        if capacity <= 0:
            return b"" if capacity < 0 else data  # < 0: the input side is closed
        transport.push(data[:capacity])
        data = data[capacity:]
    return b""
