"""Resume snapshots: the order as stored when a message was sent, travelling with it.

An AgentRequest is sent after the write that put it in the order's outbox, so the sender knows
the order exactly as stored then, ETag included. It attaches that state, compact and opaque, as
the request's ``resume`` field; the agent echoes it unchanged in its AgentResponse. The
Scheduler then decides on the answer without reading the order first and writes on condition
of that ETag (:func:`service.apply.handle`): the write succeeds only if the order is still exactly
the state the decision was made on, which is what a point read would have returned. A 412 means
the order moved on (the Supervisor released it, an operator cancelled it, another answer came
first): the Scheduler reads it and decides again.

Format: ``r1.`` and the unpadded base64url of the JSON ``{"t": etag, "d": [datetime
properties], "e": process row}``. The process row is the Table entity the state store writes
(:func:`adapters.store.rows.order_entity`, keys and empty properties left out) and is read back
with the store's own reader (:func:`adapters.store.rows.order_from_entity`), so a restored order
equals what a point read of that version of the row returns: the same normalisation (clipped
texts, absent values), and no second copy of the row's schema to drift from the store's. A
three-step order's is 2.7-4.0 KB (tests/integration/test_resume_snapshots.py; 96 characters
of it the traceparent stored at intake); it is not compressed (zlib would shrink it to about
a third, for CPU on every send and reply; Service Bus counts a message in 64 KiB chunks either
way).

The snapshot holds the order's outbox, and with it the request it travels in (never a
snapshot: ``resume`` is attached at send time and never stored); the agent checks the request
against it before calling (:func:`requests_in`, :mod:`service.consistency`). Messages between
the app's functions are signed (:mod:`domain.signing`), so a snapshot cannot be forged; it is
still validated like any input: bounded, well-formed, and naming the order the message is
about. Anything else is ignored, and the order is read as before.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from datetime import datetime
from typing import Final

from adapters.store.rows import (
    CorruptOrderState,
    get_json,
    order_entity,
    order_from_entity,
    utc,
)
from domain.messages import MAX_RESUME_CHARS, AgentRequest
from domain.order import Order

log = logging.getLogger("resume")

PREFIX: Final = "r1."
_ETAG: Final = re.compile(r"[\x21-\x7e]{1,256}", re.ASCII)
"""An ETag as the store hands it over, fit to go back in an If-Match header."""
_ROW_KEYS: Final = ("PartitionKey", "RowKey")
_REQUEST: Final = AgentRequest.MESSAGE_TYPE
_UNUSABLE: Final = (
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    RecursionError,
    CorruptOrderState,
)
"""What a malformed snapshot raises on its way through the decoders (none of it is a bug)."""


def snapshot(order: Order) -> str | None:
    """The resume token of ``order`` as stored (it must carry its ETag); None when it would
    not fit in :data:`domain.messages.MAX_RESUME_CHARS` (the answer is then applied after a
    read, as without one)."""
    if not _ETAG.fullmatch(order.etag):
        return None
    row = {k: v for k, v in order_entity(order).items() if v is not None and k not in _ROW_KEYS}
    times = sorted(k for k, v in row.items() if isinstance(v, datetime))
    for key in times:
        row[key] = row[key].isoformat()
    data = {"t": order.etag, "d": times, "e": row}
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    token = PREFIX + base64.urlsafe_b64encode(text.encode("utf-8")).rstrip(b"=").decode("ascii")
    if len(token) > MAX_RESUME_CHARS:
        log.info("order %s: snapshot of %d chars left out", order.order_id, len(token))
        return None
    return token


def restore(token: str | None, order_id: str) -> Order | None:
    """The order ``token`` holds, if it is a well-formed snapshot of order ``order_id``;
    else None (and the caller reads the order)."""
    if token is None:
        return None
    try:
        order = _decode(token)
    except _UNUSABLE as exc:
        log.warning("order %s: resume snapshot ignored: %s", order_id, exc)
        return None
    if order.order_id != order_id:
        log.warning("order %s: snapshot of order %.80r ignored", order_id, order.order_id)
        return None
    return order


def requests_in(token: str, order_id: str) -> tuple[dict[str, object], ...] | None:
    """The AgentRequests the outbox of snapshot ``token`` holds, as they were stored (each
    message's JSON object, not validated), if it is a well-formed snapshot of order
    ``order_id``; else None. Read without building the order: an agent checks the request it
    carries against them (:mod:`service.consistency`) on every call."""
    try:
        _, _, row = _unpack(token)
        if row.get("OrderID") != order_id:
            raise ValueError(f"a snapshot of order {str(row.get('OrderID'))[:80]!r}")
        items = json.loads(get_json(row, "Outbox") or "[]")
        held = tuple(item["message"] for item in items if item["type"] == _REQUEST)
        if not all(isinstance(message, dict) for message in held):
            raise ValueError("an outbox request is not a JSON object")
    except _UNUSABLE as exc:
        log.warning("order %s: resume snapshot unusable: %s", order_id, exc)
        return None
    return held


def _decode(token: str) -> Order:
    etag, times, row = _unpack(token)
    for key in times:
        value = row.get(key)
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"datetime property {str(key)[:40]!r} is not an ISO string")
        row[key] = utc(datetime.fromisoformat(value))
    return order_from_entity(row, etag)


def _unpack(token: str) -> tuple[str, list[object], dict[str, object]]:
    """The ETag, the names of the datetime properties and the process row of ``token``."""
    if not token.startswith(PREFIX) or len(token) > MAX_RESUME_CHARS:
        raise ValueError("not a resume snapshot of this version")
    packed = token[len(PREFIX) :]
    try:
        text = base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4))
    except binascii.Error as exc:
        raise ValueError(f"not base64url: {exc}") from None
    data = json.loads(text)
    etag, times, row = data["t"], data["d"], data["e"]
    if not isinstance(etag, str) or not _ETAG.fullmatch(etag):
        raise ValueError("no usable ETag")
    if not isinstance(row, dict) or not isinstance(times, list):
        raise ValueError("malformed")
    return etag, times, row
