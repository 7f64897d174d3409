"""Sending the app's messages through the azure-servicebus SDK.

Each message carries a deterministic MessageId (duplicate detection drops a resend), the order id
as CorrelationId, its type as Subject, and, for delayed retries, a scheduled enqueue time. One
client per process, opened lazily; one sender per queue, reused and guarded by a lock because
the Functions worker calls sync functions from several threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime

from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSender

from core.messages import MessageBase, encode, message_id_for
from core.op_counts import COUNTS

log = logging.getLogger("bus")


def to_servicebus_message(
    message: MessageBase, scheduled_at: datetime | None = None
) -> ServiceBusMessage:
    return ServiceBusMessage(
        encode(message),
        message_id=message_id_for(message),
        correlation_id=getattr(message, "order_id", None),
        subject=message.type,  # type: ignore[attr-defined]
        content_type="application/json",
        application_properties={"schema_version": message.schema_version},
        scheduled_enqueue_time_utc=scheduled_at,
    )


class Bus:
    def __init__(self, client_factory: Callable[[], ServiceBusClient]) -> None:
        self._client_factory = client_factory
        self._client: ServiceBusClient | None = None
        self._senders: dict[str, tuple[threading.Lock, ServiceBusSender]] = {}
        self._lock = threading.Lock()

    def send(self, queue: str, message: MessageBase, *, scheduled_at: datetime | None = None):
        lock, sender = self._sender(queue)
        with lock:
            sender.send_messages(to_servicebus_message(message, scheduled_at))
        COUNTS.add("servicebus.send")
        log.debug("sent %s to %s", message_id_for(message), queue)

    def _sender(self, queue: str) -> tuple[threading.Lock, ServiceBusSender]:
        with self._lock:
            if queue not in self._senders:
                if self._client is None:
                    self._client = self._client_factory()
                self._senders[queue] = (threading.Lock(), self._client.get_queue_sender(queue))
            return self._senders[queue]

    def close(self) -> None:
        with self._lock:
            for _, sender in self._senders.values():
                sender.close()
            self._senders.clear()
            if self._client is not None:
                self._client.close()
                self._client = None
