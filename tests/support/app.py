"""The app wired to real local services for tests: settings, runtimes, and a queue reader.

`app_settings` builds the app settings the Functions host would give the app (queue names of
this run's broker, fresh tables in Azurite, the fake remote services' URLs). `QueueReader`
keeps one receiver per queue for the whole session (opening one costs about a second) and
takes the next message for a given order, discarding leftovers of earlier tests.

`QueueReader` is the one user of the SDK's sync client: its receivers outlive the event loop
of each test (one per test), and a test awaits nothing while it reads, so blocking its loop
then holds nothing up.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from azure.functions import AsgiFunctionApp, FunctionApp
from azure.servicebus import ServiceBusClient, ServiceBusReceivedMessage, ServiceBusReceiver

from adapters.retention_settings import RetentionSettings
from adapters.settings import QUEUE_SETTINGS, SERVICE_URL_SETTINGS
from adapters.store.records import OrderRecords
from devstack.host import LocalHost
from domain.messages import utc_now
from domain.signing import SIGNING_KEYS_SETTING
from service.composition import PatternRoot
from service.operations.composition import OperationsRoot
from service.runtime import Runtime, new_instance_id
from tests.support.keys import new_key_text

EXAMPLE_SETTINGS = json.loads(
    (Path(__file__).resolve().parents[2] / "local.settings.json.example").read_text()
)["Values"]
APP_QUEUES = {role: EXAMPLE_SETTINGS[name] for role, name in QUEUE_SETTINGS.items()}
"""role -> queue name as declared in devstack/servicebus/Config.json."""


def app_settings(
    servicebus: Any, storage_connection: str, service_url: Callable[[str], str], tables: str
) -> dict[str, str]:
    env = {QUEUE_SETTINGS[role]: servicebus.queue(logical) for role, logical in APP_QUEUES.items()}
    env |= {name: service_url(service) for service, name in SERVICE_URL_SETTINGS.items()}
    env |= {
        "ServiceBusConnection": servicebus.connection_string,
        "StateStorage": storage_connection,
        "ORDERS_TABLE": f"{tables}orders",
        "ACTIVE_ORDERS_TABLE": f"{tables}active",
        "SUPERVISION_TABLE": f"{tables}supervision",
        "SUPERVISOR_SCHEDULE": "*/1 * * * * *",
        "STEP_TIMEOUT_SECONDS": "5",
        # CompleteBy is the claim plus 5 s, as these tests drive the Supervisor's deadlines; a
        # queue budget (the agent's own run budget within it) has its own tests.
        "STEP_QUEUE_SECONDS": "0",
        "PENDING_STALE_AFTER_SECONDS": "10",
        # The tests' processes share one clock, and these tests move it to exact deadlines;
        # the tolerated skew has tests of its own (tests/unit/test_skew_tolerance.py).
        "CLOCK_SKEW_TOLERANCE_SECONDS": "0",
        "RETRY_BASE_DELAY_SECONDS": "1",
        "RETRY_MAX_DELAY_SECONDS": "4",
        "FAILURE_THRESHOLD": "3",
        # A fresh key per call, as a deployment has its own: whatever reads these settings
        # (runtimes, a local host) signs and checks with it.
        SIGNING_KEYS_SETTING: new_key_text("test"),
    }
    return env


class Clock:
    """A clock tests can move forward (the Supervisor's view of deadlines)."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return utc_now() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


async def make_runtime(
    env: dict[str, str], role: str = "app", clock: Clock | None = None
) -> Runtime:
    """A Runtime on ``env`` whose tables exist; the caller closes it. Its settings are those
    either app reads (the operations app's), so either app's root may take them."""
    made = Runtime.from_settings(
        RetentionSettings.from_env(env),
        OrderRecords,
        instance_id=new_instance_id(role),
        clock=clock or Clock(),
    )
    await made.store.ensure_tables()
    return made


def like(rt: Runtime) -> dict[str, Any]:
    """What a composition root gives its Runtime so that it is like ``rt`` (its instance id and
    clock; its settings are ``rt.settings``): the Runtime of an in-process host's functions.

    The host runs its functions on an event loop of its own, and a Runtime's clients belong to
    the loop that opened them, so the functions cannot share the test's ``rt``: the root builds
    its own on the first invocation, and the test closes the root when the host stops
    (``host.at_stop(root.close)``)."""
    return {"instance_id": rt.instance_id, "clock": rt.clock}


def pattern_app(rt: Runtime) -> tuple[FunctionApp, PatternRoot]:
    """The pattern app's functions on a root of their own, its Runtime like ``rt``."""
    import function_app

    root = PatternRoot(rt.settings, **like(rt))
    return function_app.build(root), root


def operations_app(rt: Runtime) -> tuple[AsgiFunctionApp, OperationsRoot]:
    """The operations app's function on a root of its own, its Runtime like ``rt``."""
    import operations_app
    from dashboard.routes import router as dashboard
    from operator_api.app import build

    settings = rt.settings
    assert isinstance(settings, RetentionSettings), "the operations app's: make_runtime's"
    root = OperationsRoot(settings, **like(rt))
    return operations_app.serve(build(root, dashboard)), root


@asynccontextmanager
async def hosting(
    app: FunctionApp, root: PatternRoot | OperationsRoot, rt: Runtime, **host: Any
) -> AsyncIterator[LocalHost]:
    """``app`` (:func:`pattern_app`, :func:`operations_app`) on a started local host, its
    ``root`` closed on the host's loop when it stops; after, the host stopped and ``rt``
    closed."""
    local = LocalHost(app, **host)
    local.at_stop(root.close)
    local.start()
    try:
        yield local
    finally:
        local.stop(timeout=30)
        await rt.close()


def _order_of(message: ServiceBusReceivedMessage) -> object:
    try:
        data = json.loads(b"".join(message.body))
    except ValueError:
        return None
    return data.get("order_id") if isinstance(data, dict) else None


class QueueReader:
    """Reads app queues through long-lived receivers; messages of other orders are discarded."""

    def __init__(self, connection_string: str) -> None:
        self._client = ServiceBusClient.from_connection_string(connection_string)
        self._receivers: dict[str, ServiceBusReceiver] = {}
        self._lock = threading.Lock()

    def _receiver(self, queue: str) -> ServiceBusReceiver:
        with self._lock:
            if queue not in self._receivers:
                receiver = self._client.get_queue_receiver(queue)
                # Its link opened now, with the SDK's own retries: opened by the first receive,
                # it would have to open within that receive's wait (half a second for a check
                # that nothing came), which a loaded machine does not always manage.
                receiver.__enter__()
                self._receivers[queue] = receiver
            return self._receivers[queue]

    def take(self, queue: str, order_id: str | None, wait: float = 10.0) -> bytes | None:
        """The body of the next message on `queue` about `order_id` (None: any), completed."""
        message = self.take_message(
            queue, lambda m: order_id is None or _order_of(m) == order_id, wait
        )
        return None if message is None else b"".join(message.body)

    def take_message(
        self,
        queue: str,
        wanted: Callable[[ServiceBusReceivedMessage], bool],
        wait: float = 10.0,
    ) -> ServiceBusReceivedMessage | None:
        """The next message on `queue` that is `wanted`, whole (properties too), completed."""
        receiver = self._receiver(queue)
        deadline = utc_now() + timedelta(seconds=wait)
        while (left := (deadline - utc_now()).total_seconds()) > 0:
            for message in receiver.receive_messages(max_message_count=1, max_wait_time=left):
                receiver.complete_message(message)
                if wanted(message):
                    return message
        return None

    def expect(self, queue: str, order_id: str | None, wait: float = 10.0) -> bytes:
        raw = self.take(queue, order_id, wait)
        assert raw is not None, f"no message for {order_id} on {queue} within {wait}s"
        return raw

    def peek_scheduled(self, queue: str, order_id: str) -> list[tuple[int, bytes, datetime]]:
        """(sequence number, body, due time) of each scheduled message about ``order_id``."""
        receiver = self._receiver(queue)
        found = []
        sequence = 1
        while batch := receiver.peek_messages(max_message_count=250, sequence_number=sequence):
            for message in batch:
                raw = b"".join(message.body)
                due = message.scheduled_enqueue_time_utc
                if due is not None and json.loads(raw).get("order_id") == order_id:
                    found.append((message.sequence_number, raw, due))
            sequence = batch[-1].sequence_number + 1
        return found

    def take_scheduled(self, queue: str, order_id: str) -> tuple[bytes, datetime]:
        """Take a scheduled message before its time: cancel it and return its body and due time.

        Tests check when a delayed message is due instead of sleeping until it arrives.
        """
        for sequence, raw, due in self.peek_scheduled(queue, order_id):
            with self._client.get_queue_sender(queue) as sender:
                sender.cancel_scheduled_messages(sequence)
            return raw, due
        raise AssertionError(f"no scheduled message for {order_id} on {queue}")

    def close(self) -> None:
        # Together: each close joins its receiver's keep-alive thread, which sleeps a second at
        # a time, so closing them one by one took about a second per queue read.
        receivers = list(self._receivers.values())
        with ThreadPoolExecutor(max_workers=max(1, len(receivers))) as pool:
            list(pool.map(ServiceBusReceiver.close, receivers))
        self._client.close()


UNHURRIED_TICK_S = 60.0
"""A Supervisor tick's budget where the budget is not what a test checks: on a loaded machine a
tick at the test settings' budget (three quarters of a short period) may run out before it
reaches the one row a test expects it to act on, and leave it for the next tick, as designed."""
