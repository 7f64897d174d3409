"""Service Bus queue triggers: peek-lock receive, invoke, settle, renew the lock meanwhile.

Receiving and settling run on the host's event loop (the one its async functions run on), with
the asyncio Service Bus client: per function, N receivers (``maxConcurrentCalls``), each a
coroutine that takes one message at a time, invokes the function, then completes it on return
or abandons it on exception; the queue's MaxDeliveryCount dead-letters a message abandoned too
often. That is the shape of Azure's pair: the Functions host receives and settles, and the
Python worker awaits an async function on its loop, so no invocation changes thread. A sync
function runs on a thread of its receiver's own, as the worker runs sync functions on its
thread pool. An ``AutoLockRenewer`` keeps the lock while the function runs, for up to
``maxAutoLockRenewalDuration``.

**No keep-alive read beside the receive.** With ``prefetch_count`` 0 the SDK gives each receive
client a keep-alive coroutine that reads its connection every 5 seconds, waiting up to the
socket timeout for a frame while it holds the connection's socket lock. A message the broker
delivers meanwhile is read by that coroutine, queued, and left there until the receive call's
own read (waiting for the lock, then for a next frame) times out: up to ``SOCKET_TIMEOUT_S``
late. That was the paced benchmark's tail (about 1 % of queue hops 100-200 ms late, the host's
loop busy with other work all the while). The host's receivers read their connection all the
time anyway (a receive is always in progress, and the lock renewer's requests go over it while
a function runs), so their keep-alive is switched off (:func:`receive_without_keep_alive`). In
Azure the Functions host receives in .NET: nothing of this runs there.

Lock loss is counted per function (``FunctionStats``): a renewal that stopped before the message
was settled, a settlement refused with ``MessageLockLostError`` (``lock_lost`` counts each such
message once), and every message that arrives with a delivery count above 1 (``redelivered``).
Receivers are opened at most ``MAX_CONCURRENT_OPENS`` at a time, and reopened with a backoff
after a connection error (a restarted broker, say).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from azure.core.credentials_async import AsyncTokenCredential
from azure.functions.servicebus import ServiceBusMessage as FunctionMessage
from azure.servicebus import ServiceBusReceivedMessage, ServiceBusReceiveMode
from azure.servicebus._pyamqp.aio._client_async import ReceiveClientAsync
from azure.servicebus.aio import AutoLockRenewer, ServiceBusClient, ServiceBusReceiver
from azure.servicebus.amqp import AmqpMessageBodyType
from azure.servicebus.exceptions import MessageLockLostError, ServiceBusError

from adapters.op_counts import COUNTS
from devstack.host.indexing import IndexedFunction, ServiceBusTrigger
from devstack.host.invoke import Invoker, SyncCalls
from devstack.host.settings import HostConfigError
from devstack.host.stats import StatsCounter

log = logging.getLogger("devstack.host.servicebus")

# Longest a receive waits for a message, plus at most one socket read (SOCKET_TIMEOUT_S):
# bounds how long stop() waits for idle receivers.
RECEIVE_WAIT_S = 1.0
# How long the AMQP client's socket reads wait. The SDK's 0.2 s woke each idle receiver five
# times a second (2 % of a core per host with nothing to do); data wakes a read at once.
SOCKET_TIMEOUT_S = 0.5
RECONNECT_BACKOFF_S = (1.0, 30.0)
# Receivers being opened at once, per host. Each open is a connection plus a CBS handshake
# (about a second); dozens at once overwhelm the development broker and time out.
MAX_CONCURRENT_OPENS = 8
STOP_POLL_S = 0.2  # how often a reconnect backoff looks whether stop was requested


# -- connections ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Connection:
    """Where a trigger's ``connection`` setting points: a connection string or a namespace."""

    setting: str
    connection_string: str | None = None
    fully_qualified_namespace: str | None = None
    credential: str | None = None  # "managedidentity" or None (DefaultAzureCredential)
    client_id: str | None = None


def resolve_connection(function: str, setting: str, settings: Mapping[str, str]) -> Connection:
    """Resolve a trigger's ``connection`` the way the Functions host does.

    ``<setting>`` (or ``AzureWebJobs<setting>``) holding a connection string, or the identity
    form ``<setting>__fullyQualifiedNamespace`` (+ ``__credential``, ``__clientId``).
    """
    for name in (setting, f"AzureWebJobs{setting}"):
        value = settings.get(name, "").strip()
        if value:
            if "endpoint=" not in value.lower():
                raise HostConfigError(
                    f"function {function!r}: app setting {name!r} (the trigger's connection) "
                    "does not hold a Service Bus connection string (no Endpoint=)"
                )
            return Connection(setting=name, connection_string=value)
    namespace = settings.get(f"{setting}__fullyQualifiedNamespace", "").strip()
    if namespace:
        return Connection(
            setting=setting,
            fully_qualified_namespace=namespace,
            credential=settings.get(f"{setting}__credential", "").strip().lower() or None,
            client_id=settings.get(f"{setting}__clientId", "").strip() or None,
        )
    raise HostConfigError(
        f"function {function!r}: the trigger's connection {setting!r} is not configured: set app "
        f"setting {setting!r} to a connection string, or {setting}__fullyQualifiedNamespace "
        "for an identity-based connection"
    )


async def _no_keep_alive(self: Any) -> None:
    """A receive client's keep-alive that does nothing (module docstring)."""


def receive_without_keep_alive() -> None:
    """Switch off the keep-alive reads of every SDK receive client in this process (module
    docstring): the local host's receivers and any other receiver of the process, all of which
    read their connection while they receive. Senders keep theirs."""
    ReceiveClientAsync._keep_alive_async = _no_keep_alive  # type: ignore[method-assign]


class ClientPool:
    """One asyncio ``ServiceBusClient`` per connection, shared by every receiver on it. Used on
    the host's event loop only."""

    def __init__(self) -> None:
        receive_without_keep_alive()
        self._clients: dict[Connection, ServiceBusClient] = {}
        self._credentials: list[AsyncTokenCredential] = []
        self._opening = asyncio.Semaphore(MAX_CONCURRENT_OPENS)

    async def open_receiver(
        self, connection: Connection, queue_name: str, prefetch: int
    ) -> ServiceBusReceiver:
        """An open PEEK_LOCK receiver on ``queue_name``."""
        async with self._opening:
            client = self._clients.get(connection)
            if client is None:
                client = self._clients[connection] = self._make_client(connection)
            receiver = client.get_queue_receiver(
                queue_name, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=prefetch
            )
            try:
                # Opens the link now; the SDK would on the first receive.
                await receiver.__aenter__()
            except BaseException:
                await receiver.close()
                raise
            return receiver

    async def close(self) -> None:
        """Close every client, and with it every receiver it opened, then their credentials."""
        clients, self._clients = list(self._clients.values()), {}
        credentials, self._credentials = self._credentials, []
        for closing in [*clients, *credentials]:
            try:
                await closing.close()
            except Exception:
                log.warning("closing a Service Bus client failed", exc_info=True)

    def _make_client(self, connection: Connection) -> ServiceBusClient:
        if connection.connection_string is not None:
            return ServiceBusClient.from_connection_string(
                connection.connection_string, socket_timeout=SOCKET_TIMEOUT_S
            )
        from azure.identity.aio import DefaultAzureCredential, ManagedIdentityCredential

        credential: AsyncTokenCredential
        if connection.credential == "managedidentity":
            credential = ManagedIdentityCredential(client_id=connection.client_id)
        else:
            credential = DefaultAzureCredential(managed_identity_client_id=connection.client_id)
        self._credentials.append(credential)
        assert connection.fully_qualified_namespace is not None
        return ServiceBusClient(
            connection.fully_qualified_namespace, credential, socket_timeout=SOCKET_TIMEOUT_S
        )


# -- messages ------------------------------------------------------------------------------


def _text(value: Any) -> Any:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def message_body(message: ServiceBusReceivedMessage) -> bytes:
    """The body as bytes: data sections joined; an AMQP value or sequence as UTF-8 / JSON."""
    body = message.body
    if message.body_type == AmqpMessageBodyType.DATA:
        return body if isinstance(body, bytes) else b"".join(body)
    if message.body_type == AmqpMessageBodyType.SEQUENCE:
        body = list(body)
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body, default=_text).encode("utf-8")


def _delivery_count(message: ServiceBusReceivedMessage) -> int | None:
    """1-based, as the Functions host reports it; the SDK gives the AMQP header's 0-based count."""
    return None if message.delivery_count is None else message.delivery_count + 1


def to_function_message(message: ServiceBusReceivedMessage) -> FunctionMessage:
    """The ``func.ServiceBusMessage`` the Functions host would pass for ``message``.

    ``delivery_count`` is 1-based, as the host reports it. Property keys and string values
    are ``str`` (the SDK may hand them over as ``bytes``).
    """
    properties = {_text(k): _text(v) for k, v in (message.application_properties or {}).items()}
    state = message.state
    return FunctionMessage(
        body=message_body(message),
        trigger_metadata=None,
        application_properties=properties,
        user_properties=dict(properties),
        content_type=message.content_type,
        correlation_id=message.correlation_id,
        dead_letter_error_description=message.dead_letter_error_description,
        dead_letter_reason=message.dead_letter_reason,
        dead_letter_source=message.dead_letter_source,
        delivery_count=_delivery_count(message),
        enqueued_sequence_number=message.enqueued_sequence_number,
        enqueued_time_utc=message.enqueued_time_utc,
        expires_at_utc=message.expires_at_utc,
        label=message.subject,
        subject=message.subject,
        locked_until=message.locked_until_utc,
        lock_token=None if message.lock_token is None else str(message.lock_token),
        message_id=str(message.message_id) if message.message_id is not None else "",
        partition_key=message.partition_key,
        reply_to=message.reply_to,
        reply_to_session_id=message.reply_to_session_id,
        scheduled_enqueue_time_utc=message.scheduled_enqueue_time_utc,
        sequence_number=message.sequence_number,
        session_id=message.session_id,
        state=None if state is None else int(state.value),
        time_to_live=message.time_to_live,
        to=message.to,
    )


def trigger_value(trigger: ServiceBusTrigger, message: FunctionMessage) -> Any:
    if trigger.body_as == "bytes":
        return message.get_body()
    if trigger.body_as == "str":
        return message.get_body().decode("utf-8")
    return message


# -- the runner ----------------------------------------------------------------------------


class _Slot:
    """One receiver: its receiver, the message it is working on, and how it stands at stop."""

    def __init__(self, runner: ServiceBusRunner, index: int) -> None:
        self.runner = runner
        self.name = f"host-sb-{runner.function.name}-{index}"
        self.receiver: ServiceBusReceiver | None = None
        self.in_flight: ServiceBusReceivedMessage | None = None
        self.settled_at_stop = False  # stop abandoned in_flight: do not settle it again
        self.running = False  # the function is running
        self.not_receiving = asyncio.Event()  # cleared while a receive is in progress
        self.not_receiving.set()
        self._sync_calls: SyncCalls | None = None

    # Called by the AutoLockRenewer (this object stands in for the receiver there).
    async def renew_message_lock(self, message: ServiceBusReceivedMessage) -> Any:
        if self.in_flight is not message or self.receiver is None:
            return None  # settled meanwhile; the renewer sees that and stops
        COUNTS.add("servicebus.renew_lock")
        return await self.receiver.renew_message_lock(message)

    async def run(self) -> None:
        runner = self.runner
        backoff = RECONNECT_BACKOFF_S[0]
        try:
            while not runner.stopping.is_set() and not runner.closed:
                try:
                    if self.receiver is None:
                        self.receiver = await runner.clients.open_receiver(
                            runner.connection, runner.trigger.queue_name, runner.prefetch
                        )
                        continue  # stop may have come while it opened
                    self.not_receiving.clear()
                    try:
                        messages = await self.receiver.receive_messages(
                            max_message_count=1, max_wait_time=RECEIVE_WAIT_S
                        )
                    finally:
                        self.not_receiving.set()
                    backoff = RECONNECT_BACKOFF_S[0]
                except Exception as error:  # the SDK raises more than ServiceBusError
                    if runner.stopping.is_set():
                        break
                    log.warning(
                        "%s: receiving from %s failed (%r); reconnecting in %.0f s",
                        runner.function.name, runner.trigger.queue_name, error, backoff,
                    )  # fmt: skip
                    await self._close_receiver()
                    await runner.wait_for_stop(backoff)
                    backoff = min(backoff * 2, RECONNECT_BACKOFF_S[1])
                    continue
                for message in messages:
                    COUNTS.add("servicebus.receive")
                    await self.process(message)
        finally:
            if self._sync_calls is not None:
                self._sync_calls.close()
            await self._close_receiver()

    async def process(self, message: ServiceBusReceivedMessage) -> None:
        runner = self.runner
        self.in_flight, self.settled_at_stop = message, False
        if runner.closed:  # received as stop's deadline passed: not run
            await self.abandon_at_stop()
            return
        runner.hold_lock(message)
        try:
            # 00:00:00 turns renewal off, as in Azure. The slot stands in for the receiver, so
            # that a renewal after the message is settled is not sent.
            if runner.max_lock_renewal > 0:
                try:
                    runner.renewer.register(
                        self,  # type: ignore[arg-type]
                        message,
                        max_lock_renewal_duration=runner.max_lock_renewal,
                        on_lock_renew_failure=runner.on_lock_renew_failure,
                    )
                except ServiceBusError as error:
                    log.warning("%s: lock renewal not available: %s", runner.function.name, error)
            runner.stats.started()
            ok = await self._invoke(message)
            try:
                await self._settle(message, ok)
            finally:
                runner.stats.finished(ok)  # after settling: a counted success is completed
        finally:
            runner.forget_lock(message)

    async def _invoke(self, message: ServiceBusReceivedMessage) -> bool:
        runner = self.runner
        self.running = True
        try:
            converted = to_function_message(message)
            value = trigger_value(runner.trigger, converted)
            trace = converted.application_properties
            if runner.is_async:
                await runner.invoker.call_async(runner.function, value, trace=trace)
            else:
                if self._sync_calls is None:
                    self._sync_calls = SyncCalls(self.name)
                await self._sync_calls.call(
                    functools.partial(runner.invoker.call, runner.function, value, trace=trace)
                )
            return True
        except Exception:
            log.exception(
                "%s failed on message %s (delivery count %s); abandoning it",
                runner.function.name, message.message_id, _delivery_count(message),
            )  # fmt: skip
            return False
        finally:
            self.running = False

    async def _settle(self, message: ServiceBusReceivedMessage, ok: bool) -> None:
        name = self.runner.function.name
        self.in_flight = None
        if self.settled_at_stop:
            log.warning(
                "%s: message %s finished after the host's stop deadline; it was abandoned "
                "then and is not settled again", name, message.message_id,
            )  # fmt: skip
            return
        try:
            assert self.receiver is not None
            if ok:
                await self.receiver.complete_message(message)
            else:
                await self.receiver.abandon_message(message)
            COUNTS.add("servicebus.complete" if ok else "servicebus.abandon")
        except (ServiceBusError, OSError) as error:
            self.runner.stats.add(settle_errors=1)
            if isinstance(error, MessageLockLostError):
                self.runner.lock_lost(message, on_settle=True)
            log.warning(
                "%s: could not %s message %s (%s); the broker will deliver it again",
                name, "complete" if ok else "abandon", message.message_id, error,
            )  # fmt: skip

    async def abandon_at_stop(self) -> bool:
        """Stop's deadline has passed: abandon the message still in hand, if any."""
        message = self.in_flight
        if message is None or self.settled_at_stop or self.receiver is None:
            return False
        self.settled_at_stop = True
        try:
            await self.receiver.abandon_message(message)
        except (ServiceBusError, OSError) as error:
            log.warning("%s: abandon at stop failed: %s", self.runner.function.name, error)
        return True

    async def _close_receiver(self) -> None:
        receiver, self.receiver = self.receiver, None
        if receiver is not None:
            try:
                await receiver.close()
            except Exception:
                log.debug("closing a receiver failed", exc_info=True)


class ServiceBusRunner:
    """Drives one Service Bus queue trigger with ``concurrency`` receivers on the host's loop.

    Its methods are called from the host's thread; what they do runs on the loop."""

    def __init__(
        self,
        function: IndexedFunction,
        connection: Connection,
        *,
        clients: ClientPool,
        renewer: AutoLockRenewer,
        invoker: Invoker,
        stats: StatsCounter,
        concurrency: int,
        prefetch: int,
        max_lock_renewal: float,
    ) -> None:
        assert isinstance(function.trigger, ServiceBusTrigger)
        self.function = function
        self.trigger: ServiceBusTrigger = function.trigger
        self.is_async = inspect.iscoroutinefunction(function.user_function)
        self.connection = connection
        self.clients = clients
        self.renewer = renewer
        self.invoker = invoker
        self.stats = stats
        self.prefetch = prefetch
        self.max_lock_renewal = max_lock_renewal
        self.stopping = threading.Event()
        self.closed = False  # stop's deadline has passed: receive nothing more
        self._held: dict[str, bool] = {}  # lock token of each message in hand -> lost yet?
        self._slots = [_Slot(self, i) for i in range(concurrency)]
        self._served: Future[Any] | None = None

    def start(self) -> None:
        self._served = self.invoker.submit(self._serve())

    async def _serve(self) -> None:
        await asyncio.gather(*(slot.run() for slot in self._slots))

    def request_stop(self) -> None:
        self.stopping.set()

    async def wait_for_stop(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if stop is requested meanwhile."""
        for _ in range(max(1, round(seconds / STOP_POLL_S))):
            if self.stopping.is_set():
                return
            await asyncio.sleep(min(seconds, STOP_POLL_S))

    def wait(self, timeout: float) -> bool:
        """Wait until every receiver has ended; False if some still run after ``timeout``."""
        if self._served is None:
            return True
        try:
            self._served.result(timeout)
        except TimeoutError:
            return False
        except BaseException:  # cancelled at the loop's close, or failed: ended either way
            pass
        return True

    def running(self) -> list[str]:
        """The receivers whose function is still running."""
        return [slot.name for slot in self._slots if slot.running]

    def close_receivers(self) -> None:
        """Stop's deadline: no receiver of this function receives again; returns once no
        receive is in progress (``RECEIVE_WAIT_S`` and one socket read at most).

        Done for every function before any message is abandoned, so an abandoned message
        cannot be picked up again by another receiver of this host that is still receiving.
        """
        self.closed = True

        async def receives_ended() -> None:
            await asyncio.gather(*(slot.not_receiving.wait() for slot in self._slots))

        try:
            self.invoker.run(receives_ended(), RECEIVE_WAIT_S + SOCKET_TIMEOUT_S + 1.0)
        except TimeoutError:
            log.warning("%s: a receive still had not returned at stop", self.function.name)

    def abandon_in_flight(self, timeout: float) -> int:
        async def abandon() -> int:
            results = await asyncio.gather(*(slot.abandon_at_stop() for slot in self._slots))
            return sum(results)

        abandoned = self.invoker.run(abandon(), timeout)
        if abandoned:
            self.stats.add(abandoned_on_stop=abandoned)
            log.warning(
                "%s: %d message(s) still in progress at the stop deadline were abandoned",
                self.function.name, abandoned,
            )  # fmt: skip
        return abandoned

    async def on_lock_renew_failure(self, message: Any, error: Exception | None) -> None:
        """The renewer gave up on a message it was renewing: the renewal was refused or failed
        (``error``), or the lock expired before it could renew (no error)."""
        self.lock_lost(message, on_settle=False)
        log.warning(
            "%s: lock renewal for message %s stopped: %s",
            self.function.name, getattr(message, "message_id", "?"),
            error or "the lock expired before it was renewed",
        )  # fmt: skip

    def hold_lock(self, message: ServiceBusReceivedMessage) -> None:
        """A message is in hand until :meth:`forget_lock`; count it if it is a redelivery."""
        self._held[str(message.lock_token)] = False
        if (message.delivery_count or 0) > 0:  # the SDK's count is 0-based
            self.stats.add(redelivered=1)

    def lock_lost(self, message: ServiceBusReceivedMessage, *, on_settle: bool) -> None:
        """Count a lock-loss symptom of a message in hand; ``lock_lost`` counts each message
        once. A renewer that finds the lock expired after the message was settled is ignored."""
        token = str(message.lock_token)
        if token not in self._held:
            return
        first, self._held[token] = not self._held[token], True
        if on_settle:
            self.stats.add(lock_lost_on_settle=1, lock_lost=int(first))
        else:
            self.stats.add(lock_renewal_failures=1, lock_lost=int(first))

    def forget_lock(self, message: ServiceBusReceivedMessage) -> None:
        """The message is settled, or its settlement failed: it is out of hand."""
        self._held.pop(str(message.lock_token), None)
