"""Sending the app's messages through the azure-servicebus SDK.

Each message carries a deterministic MessageId (duplicate detection drops a resend), the order id as
CorrelationId, its type as Subject, and, for delayed retries, a scheduled enqueue time. One client
per process, opened lazily; one sender per queue, reused. ``max_senders`` bounds the cache for
queues named from outside (submitters' reply queues): the least recently used sender is closed.
Each message carries the current trace context (``adapters.telemetry``), so the spans of one order
follow it across queues. A bus given a keyring signs each message for the queue it goes to
(:mod:`domain.signing`): an application property, no extra request.

**Sends to one queue are grouped** (a group commit). The triggers run concurrently, as coroutines
on one event loop, and one send at a time goes out on a queue's sender: a send that finds one in
flight waits, and the messages that waited meanwhile go out together, as one batch, when it is
done. Each sender still learns the outcome of its own message: the batch's. A lone send goes at
once, as a single message, so nothing waits that did not wait before; under load the sends that
queued up behind a round trip cost one transfer and one acknowledgement instead of one each (the
SDK's send is most of a send's CPU). A batch holds what fits in one message of the link's size;
the rest go in the next. Each message is added to its batch in its own sender's context, so the
SDK's span for it (when it traces sends) is a child of that sender's span, in that order's trace.
A send that fails fails every message of its batch (each was sent, or none: the broker takes a
batch whole), and its sender is closed and forgotten (the next send opens a fresh link).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient, ServiceBusSender
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageProperties
from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusError

from adapters import telemetry
from adapters.op_counts import COUNTS
from domain import signing
from domain.messages import MessageBase, ReplayDeadLetter, encode, message_id_for

log = logging.getLogger("bus")

NO_KEEP_ALIVE = 0
"""The SDK's keep-alive for a sender is off. Every 30 s it read the sender's connection for up
to the socket timeout (0.2 s) while holding the connection's socket lock, so a send made then
waited for it: measured against the dev broker, one send in 600 took 160-200 ms, every 30 s
exactly, and none with it off. What it was for, keeping an idle connection open, a send does
itself: the SDK opens the connection again when it finds it closed (one slower send after an
idle spell longer than the service's idle timeout)."""


@dataclass(eq=False)
class _Outgoing:
    """One message waiting to go out, in the context its sender called from."""

    message: AmqpAnnotatedMessage | ServiceBusMessage
    done: asyncio.Future[None]
    context: contextvars.Context = field(default_factory=contextvars.copy_context)


class _Link:
    """A queue's sender, the turn to send on it, and the messages waiting for that turn."""

    def __init__(self, sender: ServiceBusSender) -> None:
        self.sender = sender
        self.turn = asyncio.Lock()
        self.waiting: list[_Outgoing] = []


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
        self._senders: OrderedDict[str, _Link] = OrderedDict()
        # Guards the cache, never held across an await (a link's turn is).
        self._lock = threading.Lock()
        self._max_senders = max_senders

    async def send(
        self, queue: str, message: MessageBase, *, scheduled_at: datetime | None = None
    ) -> None:
        signed_for = None if self._keyring is None else (queue, self._keyring)
        await self._send(queue, to_amqp_message(message, scheduled_at, signed_for=signed_for))
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

    async def _send(self, queue: str, message: AmqpAnnotatedMessage | ServiceBusMessage) -> None:
        """Send ``message`` with whatever else waits for ``queue``'s sender (the module
        docstring: sends to one queue are grouped)."""
        outgoing = _Outgoing(message, asyncio.get_running_loop().create_future())
        while not outgoing.done.done():
            link = await self._link(queue)
            link.waiting.append(outgoing)
            try:
                async with link.turn:
                    if outgoing.done.done():
                        break  # sent with the group of an earlier turn
                    if self._senders.get(queue) is not link:
                        link.waiting.remove(outgoing)  # its sender failed: take a fresh one
                        continue
                    await self._flush(queue, link, outgoing)
            except BaseException:
                if outgoing in link.waiting:  # cancelled before its turn: it never goes
                    link.waiting.remove(outgoing)
                elif not outgoing.done.done():  # it goes in a turn that ends after this one
                    outgoing.done.add_done_callback(_retrieved)
                raise
        await outgoing.done

    def prepare(
        self, queue: str, message: MessageBase, scheduled_at: datetime | None = None
    ) -> ServiceBusMessage:
        """The Service Bus message this bus sends for ``message`` to ``queue`` (it sends the
        same as an AMQP message: :func:`to_amqp_message`)."""
        signed_for = None if self._keyring is None else (queue, self._keyring)
        return to_servicebus_message(message, scheduled_at, signed_for=signed_for)

    async def _flush(self, queue: str, link: _Link, mine: _Outgoing) -> None:
        """Send every message waiting on ``link`` (``mine`` among them), in batches that fit,
        and settle each one's outcome."""
        group, link.waiting = link.waiting, []
        try:
            if len(group) == 1:
                await link.sender.send_messages(group[0].message)
                _settle(group, None)
            else:
                await self._send_batches(link.sender, group)
        except BaseException as error:
            cut_short = not isinstance(error, Exception)
            failure = (
                ServiceBusError(f"the send to {queue} was interrupted") if cut_short else error
            )
            _settle([o for o in group if not o.done.done()], failure)
            if cut_short:
                mine.done.exception()  # its sender sees the interruption itself, not this
            await self._forget(queue, link)
            if cut_short:
                raise

    async def _send_batches(self, sender: ServiceBusSender, group: list[_Outgoing]) -> None:
        left = list(group)
        while left:
            batch = await sender.create_message_batch()
            members: list[_Outgoing] = []
            for outgoing in left:
                try:
                    outgoing.context.run(batch.add_message, outgoing.message)
                except MessageSizeExceededError:
                    break
                members.append(outgoing)
            if not members:  # too large for a batch of its own: alone, the SDK says why
                members, batch = [left[0]], left[0].message  # type: ignore[assignment]
            await sender.send_messages(batch)
            _settle(members, None)
            left = left[len(members) :]

    async def _link(self, queue: str) -> _Link:
        evicted: list[ServiceBusSender] = []
        with self._lock:
            if queue in self._senders:
                self._senders.move_to_end(queue)
            else:
                if self._client is None:
                    self._client = self._client_factory()
                sender = self._client.get_queue_sender(queue, keep_alive=NO_KEEP_ALIVE)
                self._senders[queue] = _Link(sender)
                while self._max_senders is not None and len(self._senders) > self._max_senders:
                    evicted.append(self._senders.popitem(last=False)[1].sender)
            link = self._senders[queue]
        for sender in evicted:
            await _close_quietly(sender)
        return link

    async def _forget(self, queue: str, link: _Link) -> None:
        with self._lock:
            if self._senders.get(queue) is link:
                del self._senders[queue]
        await _close_quietly(link.sender)

    async def close(self) -> None:
        with self._lock:
            senders = [link.sender for link in self._senders.values()]
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


def _settle(group: list[_Outgoing], error: BaseException | None) -> None:
    for outgoing in group:
        if error is None:
            outgoing.done.set_result(None)
            COUNTS.add("servicebus.send")
        else:
            outgoing.done.set_exception(error)


def _retrieved(done: asyncio.Future[None]) -> None:
    """Nobody awaits this outcome any more (its sender was cancelled): take it, so that a
    failure is not reported as never retrieved."""
    done.exception()


async def _close_quietly(sender: ServiceBusSender) -> None:
    try:
        await sender.close()
    except Exception as exc:  # closing a broken link may fail too; nothing is lost
        log.debug("closing a sender failed: %s", exc)


SCHEDULED_ENQUEUE_TIME = b"x-opt-scheduled-enqueue-time"
"""The message annotation Service Bus reads a scheduled enqueue time from."""


def to_servicebus_message(
    message: MessageBase,
    scheduled_at: datetime | None = None,
    *,
    signed_for: tuple[str, signing.Keyring] | None = None,
) -> ServiceBusMessage:
    """``signed_for``: (destination queue, keyring) to sign the message for that queue."""
    body, message_id, properties = _parts(message, signed_for)
    return ServiceBusMessage(
        body,
        message_id=message_id,
        correlation_id=getattr(message, "order_id", None),
        subject=message.type,  # type: ignore[attr-defined]
        content_type="application/json",
        application_properties=properties,
        scheduled_enqueue_time_utc=scheduled_at,
    )


def to_amqp_message(
    message: MessageBase,
    scheduled_at: datetime | None = None,
    *,
    signed_for: tuple[str, signing.Keyring] | None = None,
) -> AmqpAnnotatedMessage:
    """The same message as :func:`to_servicebus_message`, as the SDK's AMQP message, which is
    what the SDK sends: built directly, without the dozen property setters of a
    ``ServiceBusMessage`` (about 20 us of a send's CPU)."""
    body, message_id, properties = _parts(message, signed_for)
    return AmqpAnnotatedMessage(
        data_body=body,
        properties=AmqpMessageProperties(
            message_id=message_id,
            correlation_id=getattr(message, "order_id", None),
            subject=message.type,  # type: ignore[attr-defined]
            content_type="application/json",
        ),
        application_properties=properties,
        annotations=None if scheduled_at is None else {SCHEDULED_ENQUEUE_TIME: scheduled_at},
    )


def _parts(
    message: MessageBase, signed_for: tuple[str, signing.Keyring] | None
) -> tuple[bytes, str, dict[str | bytes, Any]]:
    """Body, MessageId and application properties (version, signature, trace context)."""
    body = encode(message)
    message_id = message_id_for(message)
    properties: dict[str | bytes, Any] = {"schema_version": message.schema_version}
    if signed_for is not None:
        queue, keyring = signed_for
        properties[signing.SIGNATURE_PROPERTY] = signing.sign(
            keyring, queue=queue, message_id=message_id, body=body
        )
    telemetry.inject(properties)
    return body, message_id, properties
