"""`<queue>/$management` request/response operations, as the azure-servicebus SDK uses them.

Each request names an `operation` application property; the reply carries `statusCode`,
`statusDescription` and, on failure, `errorCondition`, with the error Service Bus would give.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from proton import UNDESCRIBED, Array, Data, Message, symbol, timestamp

from devstack.servicebus import codec
from devstack.servicebus.queues import LockHolder, LockLost, NotFound, Queue, parse_incoming

log = logging.getLogger("servicebus.management")

VENDOR = "com.microsoft:"


class RequestError(Exception):
    def __init__(self, status: int, condition: str, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.condition = condition
        self.description = description


def handle(
    queue: Queue,
    request: Message,
    now: float,
    atomic: Callable[[], AbstractContextManager[None]],
    holder: LockHolder | None = None,
) -> Message:
    """Answer one request; ``holder`` is the link it came on, which holds the locks it takes."""
    props = _normalize(request.properties or {})
    operation = str(props.get("operation", ""))
    handler = _OPERATIONS.get(operation.removeprefix(VENDOR))
    try:
        if handler is None:
            raise RequestError(
                400,
                "amqp:not-implemented",
                f"The management operation {operation!r} is not supported by the development "
                f"broker (supported: {', '.join(VENDOR + name for name in _OPERATIONS)}).",
            )
        body = request.body
        if not isinstance(body, dict):
            raise RequestError(400, VENDOR + "argument-error", "The request body must be a map.")
        with atomic():
            status, result = handler(Request(queue, _normalize(body), now, holder))
    except RequestError as exc:
        log.info("%s on %s failed: %s", operation, queue.name, exc.description)
        return Message(
            properties={
                "statusCode": exc.status,
                "statusDescription": exc.description,
                "errorCondition": symbol(exc.condition),
            },
            body=None,
        )
    return Message(
        properties={"statusCode": status, "statusDescription": "OK" if status == 200 else ""},
        body=result,
    )


@dataclass(frozen=True, slots=True)
class Request:
    queue: Queue
    body: dict[str, Any]
    now: float
    holder: LockHolder | None


def _normalize(mapping: dict) -> dict[str, Any]:
    return {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in mapping.items()}


def _require(body: dict[str, Any], key: str) -> Any:
    if key not in body or body[key] is None:
        raise RequestError(
            400, VENDOR + "argument-error", f"The request body lacks the required field {key!r}."
        )
    return body[key]


def _tokens(body: dict[str, Any]) -> list[uuid.UUID]:
    raw = _require(body, "lock-tokens")
    values = list(raw.elements if isinstance(raw, Array) else raw)
    try:
        return [v if isinstance(v, uuid.UUID) else uuid.UUID(str(v)) for v in values]
    except ValueError as exc:
        raise RequestError(400, VENDOR + "argument-error", "lock-tokens must be UUIDs") from exc


def _longs(body: dict[str, Any], key: str) -> list[int]:
    raw = _require(body, key)
    values = list(raw.elements if isinstance(raw, Array) else raw)
    if not all(isinstance(v, int) for v in values):
        raise RequestError(400, VENDOR + "argument-error", f"{key} must be integers")
    return [int(v) for v in values]


def _lock_lost(exc: Exception) -> RequestError:
    return RequestError(410, VENDOR + "message-lock-lost", str(exc))


def _renew_lock(request: Request) -> tuple[int, Any]:
    queue, body, now = request.queue, request.body, request.now
    try:
        expirations = [queue.renew(token, now) for token in _tokens(body)]
    except LockLost as exc:
        raise _lock_lost(exc) from exc
    stamps = [timestamp(int(t * 1000)) for t in expirations]
    return 200, {"expirations": Array(UNDESCRIBED, Data.TIMESTAMP, *stamps)}


def _schedule(request: Request) -> tuple[int, Any]:
    queue, body, now = request.queue, request.body, request.now
    entries = _require(body, "messages")
    seqs = []
    for entry in entries:
        entry = _normalize(entry) if isinstance(entry, dict) else {}
        encoded = bytes(_require(entry, "message"))
        try:
            incoming = parse_incoming(encoded)
        except codec.CodecError as exc:
            raise RequestError(400, VENDOR + "argument-error", f"bad message: {exc}") from exc
        if incoming.scheduled_at is None:
            raise RequestError(
                400,
                VENDOR + "argument-error",
                "A scheduled message needs the x-opt-scheduled-enqueue-time annotation.",
            )
        seqs.append(queue.schedule(incoming, incoming.scheduled_at, now))
    return 200, {"sequence-numbers": Array(UNDESCRIBED, Data.LONG, *seqs)}


def _cancel_scheduled(request: Request) -> tuple[int, Any]:
    try:
        request.queue.cancel_scheduled(_longs(request.body, "sequence-numbers"))
    except NotFound as exc:
        raise RequestError(404, VENDOR + "message-not-found", str(exc)) from exc
    return 200, {}


def _peek(request: Request) -> tuple[int, Any]:
    queue, body, now = request.queue, request.body, request.now
    start = int(_require(body, "from-sequence-number"))
    count = int(_require(body, "message-count"))
    if count < 1:
        raise RequestError(400, VENDOR + "argument-error", "message-count must be at least 1")
    queue.tick(now)
    messages = queue.peek(start, count)
    if not messages:
        return 204, {}
    return 200, {"messages": [{"message": queue.render(m)} for m in messages]}


def _receive_by_sequence_number(request: Request) -> tuple[int, Any]:
    queue, now = request.queue, request.now
    try:
        seqs = _longs(request.body, "sequence-numbers")
        locked = queue.lock_deferred(seqs, now, request.holder)
    except NotFound as exc:
        raise RequestError(404, VENDOR + "message-not-found", str(exc)) from exc
    lock_duration = queue.settings.lock_duration.total_seconds()
    return 200, {
        "messages": [
            {"lock-token": token, "message": queue.render(message, token, now + lock_duration)}
            for message, token in locked
        ]
    }


def _update_disposition(request: Request) -> tuple[int, Any]:
    queue, body, now = request.queue, request.body, request.now
    status = str(_require(body, "disposition-status"))
    tokens = _tokens(body)
    try:
        for token in tokens:
            if status == "completed":
                queue.complete(token, now)
            elif status == "abandoned":
                queue.abandon(token, now)
            elif status == "defered":  # sic: the service's spelling
                queue.defer(token, now)
            elif status == "suspended":
                queue.dead_letter(
                    token,
                    now,
                    str(body.get("deadletter-reason") or ""),
                    str(body.get("deadletter-description") or ""),
                )
            else:
                raise RequestError(
                    400,
                    VENDOR + "argument-error",
                    f"disposition-status {status!r} is not one of completed, abandoned, "
                    "defered, suspended",
                )
    except LockLost as exc:
        raise _lock_lost(exc) from exc
    return 200, {}


_OPERATIONS: dict[str, Callable[[Request], tuple[int, Any]]] = {
    "renew-lock": _renew_lock,
    "schedule-message": _schedule,
    "cancel-scheduled-message": _cancel_scheduled,
    "peek-message": _peek,
    "receive-by-sequence-number": _receive_by_sequence_number,
    "update-disposition": _update_disposition,
}
