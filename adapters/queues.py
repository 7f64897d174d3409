"""The Service Bus side of operator tools: peeking queues, acknowledging alerts, and replaying
or purging dead letters.

Acknowledging an alert completes its message, found by sequence number:

1. A deferred message is received directly by its sequence number and completed.
2. Otherwise the queue is received from its head in peek-lock mode; the alert is completed and
   every other message received on the way is *deferred*, not abandoned. Deferred messages stay
   in the queue, are still listed by peek, and are acknowledged later in one step (1) - while
   abandoning would raise their delivery count until Service Bus dead-letters them.

Nothing in the app consumes the alerts queue (operators are its only readers), so deferring
alerts changes nothing for anyone else. At most ``max_scan`` messages are received per ack.

Dead letters are settled by :meth:`QueueTools.settle_dead_letters`: the dead-letter queue is
received from its head in peek-lock mode; each message is completed once the caller has done
what it wanted (had the pattern app send it back: service/operations/dead_letter_settler.py),
and the others are held locked until the scan ends, then abandoned: they stay where they were,
and a scan never receives one twice. Dead letters are not dead-lettered again, so abandoning
them only raises their delivery count.

Peeks (listings, counts, finding an alert) reuse one receiver per queue and sub-queue, kept
open: opening a receiver's link costs about half a second on the development broker and closing
it as much again, while a peek on an open link takes milliseconds, so opening one per peek made
``GET /api/dead-letters`` (a peek of each of seven queues, one after the other) take seven
seconds. Each kept receiver has a lock of its own (a receiver takes one call at a time), so peeks
of different queues run at once, and :meth:`QueueTools.peek_each` opens the links of several
queues concurrently before peeking them.
A peek that fails on a kept receiver (its link closed while idle) is retried once on a new one.
Receiving (acknowledging, settling dead letters) opens a receiver of its own per call, one call
at a time, apart from the peeks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Final

from azure.servicebus import ServiceBusReceivedMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver
from azure.servicebus.exceptions import MessageNotFoundError, ServiceBusError

LINKS_AT_ONCE: Final = 8
"""Receivers' links opened (or closed) concurrently, at most."""
MAX_PEEK_RECEIVERS: Final = 32
"""Receivers kept open for peeks (the app has seven queues, each with its dead letters)."""
RECEIVE_BATCH: Final = 50
RECEIVE_WAIT_SECONDS: Final = 1.0
DEAD_LETTER_PROPERTIES: Final = frozenset({"DeadLetterReason", "DeadLetterErrorDescription"})
"""What Service Bus adds to a message it dead-letters: not part of the message sent."""


_PeekKey = tuple[str, bool]


class _Kept:
    """A receiver kept open for peeks, and the lock that gives it to one call at a time."""

    def __init__(self, receiver: ServiceBusReceiver) -> None:
        self.receiver = receiver
        self.lock = asyncio.Lock()
        self.opened = False

    async def open(self) -> None:
        """Open its link now (a peek would open it anyway: a failure here is left to it)."""
        async with self.lock:
            if not self.opened:
                with contextlib.suppress(ServiceBusError):
                    await self.receiver.__aenter__()
                    self.opened = True

    async def close(self) -> None:
        async with self.lock:
            with contextlib.suppress(Exception):  # closing: nothing left to do with it
                await self.receiver.close()


class QueueTools:
    def __init__(self, client_factory: Callable[[], ServiceBusClient]) -> None:
        self._factory = client_factory
        self._client: ServiceBusClient | None = None
        self._lock = asyncio.Lock()
        """Receiving (ack, settle): one call at a time."""
        self._kept: OrderedDict[_PeekKey, _Kept] = OrderedDict()

    async def peek(
        self, queue: str, *, from_sequence: int, limit: int, dead_letter: bool = False
    ) -> list[ServiceBusReceivedMessage]:
        """Up to ``limit`` messages with sequence number >= ``from_sequence``, not locked."""
        key = (queue, dead_letter)
        for attempt in range(2):
            kept = await self._peeker(queue, dead_letter)
            try:
                async with kept.lock:
                    kept.opened = True  # a peek opens the link if it is not open
                    return list(
                        await kept.receiver.peek_messages(
                            max_message_count=limit, sequence_number=from_sequence
                        )
                    )
            except ServiceBusError:
                await self._forget(key, kept)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def peek_each(
        self, queues: Collection[str], *, from_sequence: int, limit: int, dead_letter: bool = False
    ) -> list[list[ServiceBusReceivedMessage]]:
        """:meth:`peek` of each queue. Opening a receiver's link is what takes time, so the
        links not open yet are opened concurrently first; the peeks then take milliseconds
        each."""
        kept = [await self._peeker(queue, dead_letter) for queue in queues]
        closed = [k for k in kept if not k.opened]
        if len(closed) > 1:
            await _each(_Kept.open, closed)
        return [
            await self.peek(
                queue, from_sequence=from_sequence, limit=limit, dead_letter=dead_letter
            )
            for queue in queues
        ]

    async def _peeker(self, queue: str, dead_letter: bool) -> _Kept:
        key = (queue, dead_letter)
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
            return kept
        sub_queue = ServiceBusSubQueue.DEAD_LETTER if dead_letter else None
        kept = _Kept(self._bus_client().get_queue_receiver(queue, sub_queue=sub_queue))
        self._kept[key] = kept
        if len(self._kept) > MAX_PEEK_RECEIVERS:
            await self._kept.popitem(last=False)[1].close()
        return kept

    async def _forget(self, key: _PeekKey, kept: _Kept) -> None:
        if self._kept.get(key) is kept:
            del self._kept[key]
        await kept.close()

    def _bus_client(self) -> ServiceBusClient:
        """The client, built on first use."""
        if self._client is None:
            self._client = self._factory()
        return self._client

    async def complete(self, queue: str, sequence_number: int, *, max_scan: int) -> bool:
        """Complete the message ``sequence_number`` (see the module docstring); False if not
        found among the deferred messages or the first ``max_scan`` received."""
        async with self._lock, self._receiver(queue, None) as receiver:
            try:
                deferred = await receiver.receive_deferred_messages([sequence_number])
            except MessageNotFoundError:
                deferred = []
            if deferred:
                await receiver.complete_message(deferred[0])
                return True
            return await _complete_from_head(receiver, sequence_number, max_scan)

    async def settle_dead_letters(
        self,
        queue: str,
        act: Callable[[ServiceBusReceivedMessage], Awaitable[bool]],
        *,
        max_scan: int,
        enough: Callable[[], bool] = lambda: False,
    ) -> bool:
        """Receive up to ``max_scan`` dead letters of ``queue``, oldest first, and complete
        each one ``act`` returns True for (see the module docstring); stop early once
        ``enough()``. True if dead letters may be left unexamined."""
        async with self._lock, self._receiver(queue, ServiceBusSubQueue.DEAD_LETTER) as receiver:
            held: list[ServiceBusReceivedMessage] = []
            try:
                return await _settle(receiver, act, held, max_scan, enough)
            finally:
                for message in held:
                    with contextlib.suppress(ServiceBusError):  # its lock expires anyway
                        await receiver.abandon_message(message)

    def _receiver(self, queue: str, sub_queue: ServiceBusSubQueue | None) -> ServiceBusReceiver:
        return self._bus_client().get_queue_receiver(
            queue, sub_queue=sub_queue, max_wait_time=RECEIVE_WAIT_SECONDS
        )

    async def close(self) -> None:
        """Close the kept receivers (concurrently: each takes about as long as opening one),
        then the client."""
        async with self._lock:
            kept, self._kept = list(self._kept.values()), OrderedDict()
            client, self._client = self._client, None
        await _each(_Kept.close, kept)
        if client is not None:
            await client.close()


async def _each(call: Callable[[_Kept], Awaitable[None]], kept: list[_Kept]) -> None:
    """``call`` on each of ``kept``, at most ``LINKS_AT_ONCE`` at a time."""
    limit = asyncio.Semaphore(LINKS_AT_ONCE)

    async def one(receiver: _Kept) -> None:
        async with limit:
            await call(receiver)

    await asyncio.gather(*(one(k) for k in kept))


async def _complete_from_head(
    receiver: ServiceBusReceiver, sequence_number: int, max_scan: int
) -> bool:
    scanned = 0
    while scanned < max_scan:
        batch = await receiver.receive_messages(
            max_message_count=min(RECEIVE_BATCH, max_scan - scanned),
            max_wait_time=RECEIVE_WAIT_SECONDS,
        )
        if not batch:
            return False
        found = False
        for message in batch:
            scanned += 1
            if message.sequence_number == sequence_number:
                await receiver.complete_message(message)
                found = True
            else:
                await receiver.defer_message(message)
        if found:
            return True
    return False


async def _settle(
    receiver: ServiceBusReceiver,
    act: Callable[[ServiceBusReceivedMessage], Awaitable[bool]],
    held: list[ServiceBusReceivedMessage],
    max_scan: int,
    enough: Callable[[], bool],
) -> bool:
    scanned = 0
    while scanned < max_scan and not enough():
        batch = await receiver.receive_messages(
            max_message_count=min(RECEIVE_BATCH, max_scan - scanned),
            max_wait_time=RECEIVE_WAIT_SECONDS,
        )
        if not batch:
            return False
        for message in batch:
            scanned += 1
            if await act(message):
                await receiver.complete_message(message)
            else:
                held.append(message)
    return not enough()


def body_of(message: ServiceBusReceivedMessage) -> bytes:
    body = message.body
    return body if isinstance(body, bytes) else b"".join(body)


def properties_of(message: ServiceBusReceivedMessage) -> dict[str, Any]:
    """Its application properties as they were sent: names and text values as ``str`` (the SDK
    hands AMQP strings over as bytes), without what dead-lettering added."""
    found: dict[str, Any] = {}
    for key, value in (message.application_properties or {}).items():
        name = key.decode("utf-8", errors="replace") if isinstance(key, bytes) else str(key)
        if name in DEAD_LETTER_PROPERTIES:
            continue
        if isinstance(value, bytes):
            with contextlib.suppress(UnicodeDecodeError):
                value = value.decode("utf-8")
        found[name] = value
    return found
