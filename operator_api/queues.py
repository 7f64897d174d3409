"""The Service Bus side of operator tools: peeking queues and acknowledging alerts.

Acknowledging an alert completes its message, found by sequence number:

1. A deferred message is received directly by its sequence number and completed.
2. Otherwise the queue is received from its head in peek-lock mode; the alert is completed and
   every other message received on the way is *deferred*, not abandoned. Deferred messages stay
   in the queue, are still listed by peek, and are acknowledged later in one step (1) - while
   abandoning would raise their delivery count until Service Bus dead-letters them.

Nothing in the app consumes the alerts queue (operators are its only readers), so deferring
alerts changes nothing for anyone else. At most ``max_scan`` messages are received per ack.

The SDK's clients are not thread-safe; one lock serialises this object's use of its client.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Final

from azure.servicebus import (
    ServiceBusClient,
    ServiceBusReceivedMessage,
    ServiceBusReceiver,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import MessageNotFoundError

RECEIVE_BATCH: Final = 50
RECEIVE_WAIT_SECONDS: Final = 1.0


class QueueTools:
    def __init__(self, client_factory: Callable[[], ServiceBusClient]) -> None:
        self._factory = client_factory
        self._client: ServiceBusClient | None = None
        self._lock = threading.Lock()

    def peek(
        self, queue: str, *, from_sequence: int, limit: int, dead_letter: bool = False
    ) -> list[ServiceBusReceivedMessage]:
        """Up to ``limit`` messages with sequence number >= ``from_sequence``, not locked."""
        sub_queue = ServiceBusSubQueue.DEAD_LETTER if dead_letter else None
        with self._lock, self._receiver(queue, sub_queue) as receiver:
            return list(
                receiver.peek_messages(max_message_count=limit, sequence_number=from_sequence)
            )

    def complete(self, queue: str, sequence_number: int, *, max_scan: int) -> bool:
        """Complete the message ``sequence_number`` (see the module docstring); False if not
        found among the deferred messages or the first ``max_scan`` received."""
        with self._lock, self._receiver(queue, None) as receiver:
            try:
                deferred = receiver.receive_deferred_messages([sequence_number])
            except MessageNotFoundError:
                deferred = []
            if deferred:
                receiver.complete_message(deferred[0])
                return True
            return _complete_from_head(receiver, sequence_number, max_scan)

    def _receiver(self, queue: str, sub_queue: ServiceBusSubQueue | None) -> ServiceBusReceiver:
        if self._client is None:
            self._client = self._factory()
        return self._client.get_queue_receiver(
            queue, sub_queue=sub_queue, max_wait_time=RECEIVE_WAIT_SECONDS
        )

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def __enter__(self) -> QueueTools:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _complete_from_head(receiver: ServiceBusReceiver, sequence_number: int, max_scan: int) -> bool:
    scanned = 0
    while scanned < max_scan:
        batch = receiver.receive_messages(
            max_message_count=min(RECEIVE_BATCH, max_scan - scanned),
            max_wait_time=RECEIVE_WAIT_SECONDS,
        )
        if not batch:
            return False
        found = False
        for message in batch:
            scanned += 1
            if message.sequence_number == sequence_number:
                receiver.complete_message(message)
                found = True
            else:
                receiver.defer_message(message)
        if found:
            return True
    return False
