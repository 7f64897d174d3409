"""Sending the app's messages through the azure-servicebus SDK.

Each message carries a deterministic MessageId (duplicate detection drops a resend), the order id as
CorrelationId, its type as Subject, and, for delayed retries, a scheduled enqueue time. One client
per process, opened lazily; one sender per queue, reused and guarded by a lock held while it sends
(the triggers run concurrently, as coroutines on one event loop). A sender whose send failed is
closed and forgotten (the next send opens a fresh link). ``max_senders`` bounds the cache for queues
named from outside (submitters' reply queues): the least recently used sender is closed. Each
message carries the current trace context (``adapters.telemetry``), so the spans of one order follow
it across queues. A bus given a keyring signs each message for the queue it goes to
(:mod:`domain.signing`): an application property, no extra request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from asyncio import Lock
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any

from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient, ServiceBusSender

from adapters import telemetry
from adapters.op_counts import COUNTS
from domain import signing
from domain.messages import MessageBase, ReplayDeadLetter, encode, message_id_for

log = logging.getLogger("bus")


class Bus:
    def __init__(
        self,
        client_factory: Callable[[], ServiceBusClient],
        *,
        max_senders: int | None = None,
        keyring: signing.Keyring | None = None,
    ) -> None:
        self._client_factory = client_factory
        self._keyring = keyring
        self._client: ServiceBusClient | None = None
        self._senders: OrderedDict[str, tuple[Lock, ServiceBusSender]] = OrderedDict()
        # Guards the cache, never held across an await (a sender's own Lock is).
        self._lock = threading.Lock()
        self._max_senders = max_senders

    async def send(
        self, queue: str, message: MessageBase, *, scheduled_at: datetime | None = None
    ) -> None:
        await self._send(queue, self.prepare(queue, message, scheduled_at))
        if log.isEnabledFor(logging.DEBUG):  # the MessageId is a hash: not built for nothing
            log.debug("sent %s to %s", message_id_for(message), queue)

    async def send_copy(self, queue: str, copy: ReplayDeadLetter) -> None:
        """Send the dead letter ``copy`` carries to ``queue`` as it was first sent: the same
        body, MessageId, application properties (its signature among them) and headers."""
        await self._send(
            queue,
            ServiceBusMessage(
                copy.raw_body(),
                message_id=copy.message_id,
                correlation_id=copy.correlation_id,
                subject=copy.subject,
                content_type=copy.content_type,
                reply_to=copy.reply_to,
                application_properties=dict(copy.properties),  # type: ignore[arg-type]
            ),
        )

    async def _send(self, queue: str, message: ServiceBusMessage) -> None:
        lock, sender = await self._sender(queue)
        try:
            async with lock:
                await sender.send_messages(message)
        except BaseException:  # cancelled too: a send cut short leaves its link in doubt
            await self._forget(queue, sender)
            raise
        COUNTS.add("servicebus.send")

    def prepare(
        self, queue: str, message: MessageBase, scheduled_at: datetime | None = None
    ) -> ServiceBusMessage:
        """The Service Bus message this bus sends for ``message`` to ``queue``."""
        signed_for = None if self._keyring is None else (queue, self._keyring)
        return to_servicebus_message(message, scheduled_at, signed_for=signed_for)

    async def _sender(self, queue: str) -> tuple[Lock, ServiceBusSender]:
        evicted: list[ServiceBusSender] = []
        with self._lock:
            if queue in self._senders:
                self._senders.move_to_end(queue)
            else:
                if self._client is None:
                    self._client = self._client_factory()
                self._senders[queue] = (Lock(), self._client.get_queue_sender(queue))
                while self._max_senders is not None and len(self._senders) > self._max_senders:
                    evicted.append(self._senders.popitem(last=False)[1][1])
            entry = self._senders[queue]
        for sender in evicted:
            await _close_quietly(sender)
        return entry

    async def _forget(self, queue: str, sender: ServiceBusSender) -> None:
        with self._lock:
            entry = self._senders.get(queue)
            if entry is not None and entry[1] is sender:
                del self._senders[queue]
        await _close_quietly(sender)

    async def close(self) -> None:
        with self._lock:
            senders = [sender for _, sender in self._senders.values()]
            self._senders.clear()
            client, self._client = self._client, None
        # All at once: each close waits out its sender's keep-alive task, which sleeps a second
        # at a time, so closing them one by one took about a second per sender.
        try:
            closed = await asyncio.gather(*(s.close() for s in senders), return_exceptions=True)
        finally:
            if client is not None:
                await client.close()
        for outcome in closed:
            if isinstance(outcome, BaseException):
                raise outcome


async def _close_quietly(sender: ServiceBusSender) -> None:
    try:
        await sender.close()
    except Exception as exc:  # closing a broken link may fail too; nothing is lost
        log.debug("closing a sender failed: %s", exc)


def to_servicebus_message(
    message: MessageBase,
    scheduled_at: datetime | None = None,
    *,
    signed_for: tuple[str, signing.Keyring] | None = None,
) -> ServiceBusMessage:
    """``signed_for``: (destination queue, keyring) to sign the message for that queue."""
    body = encode(message)
    message_id = message_id_for(message)
    properties: dict[str | bytes, Any] = {"schema_version": message.schema_version}
    if signed_for is not None:
        queue, keyring = signed_for
        properties[signing.SIGNATURE_PROPERTY] = signing.sign(
            keyring, queue=queue, message_id=message_id, body=body
        )
    telemetry.inject(properties)
    return ServiceBusMessage(
        body,
        message_id=message_id,
        correlation_id=getattr(message, "order_id", None),
        subject=message.type,  # type: ignore[attr-defined]
        content_type="application/json",
        application_properties=properties,
        scheduled_enqueue_time_utc=scheduled_at,
    )
