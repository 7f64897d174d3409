"""The Runtime (service.runtime) and clients (adapters.clients), without a broker: what
``from_settings`` builds, where alerts and status updates go, that ``close`` closes everything,
and the async credentials (azure.identity.aio) the clients authenticate with. The broker round
trips are in tests/integration/test_bus.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from azure.identity.aio import DefaultAzureCredential, ManagedIdentityCredential
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.exceptions import ServiceBusError
from azure.storage.blob.aio import BlobServiceClient

from adapters import archive, clients
from adapters import servicebus as bus
from adapters.remote_http import RemoteHttp
from adapters.settings import Connection, Settings
from adapters.store import state_store
from adapters.tables import TableService
from adapters.tables.pipeline import BearerTokenPolicy
from domain import signing
from domain.messages import OperatorAlert, StatusUpdate, message_id_for
from service import runtime
from tests.support.app import EXAMPLE_SETTINGS
from tests.support.keys import new_key_text

pytestmark = pytest.mark.anyio

SERVICEBUS = (
    "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=RootManageSharedAccessKey;"
    "SharedAccessKey=unit;UseDevelopmentEmulator=true"
)


def app_env() -> dict[str, str]:
    return {
        **EXAMPLE_SETTINGS,
        "ServiceBusConnection": SERVICEBUS,
        signing.SIGNING_KEYS_SETTING: new_key_text("unit"),
    }


def settings() -> Settings:
    return Settings.from_env(app_env())


def alert(order_id: str = "o-alert") -> OperatorAlert:
    return OperatorAlert(
        order_id=order_id,
        severity="error",
        reason="step_failed",
        detail="the payment service refused",
        source="scheduler:unit",
    )


class FakeBatch:
    """A ServiceBusMessageBatch without a size limit."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    def add_message(self, message: Any) -> None:
        self.messages.append(message)


class FakeSender:
    """Records each message it sent (``sent``) and each send call (``calls``: a message or a
    batch's messages), and the options it was opened with."""

    def __init__(self, queue: str, **options: Any) -> None:
        self.queue = queue
        self.options = options
        self.sent: list[Any] = []
        self.calls: list[list[Any]] = []
        self.closed = False

    async def create_message_batch(self) -> FakeBatch:
        return FakeBatch()

    async def send_messages(self, message: Any) -> None:
        self._record(message)

    def _record(self, message: Any) -> None:
        messages = message.messages if isinstance(message, FakeBatch) else [message]
        self.calls.append(messages)
        self.sent.extend(messages)

    async def close(self) -> None:
        self.closed = True


class FakeClient:
    def __init__(self, conn: Connection, options: dict[str, Any]) -> None:
        self.conn = conn
        self.options = options
        self.senders: list[FakeSender] = []
        self.closed = False

    def get_queue_sender(self, queue: str, **options: Any) -> FakeSender:
        self.senders.append(FakeSender(queue, **options))
        return self.senders[-1]

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[FakeClient]:
    """The Service Bus clients adapters.clients builds, faked (no broker), in order."""
    built: list[FakeClient] = []

    def servicebus_client(conn: Connection, **options: Any) -> FakeClient:
        built.append(FakeClient(conn, options))
        return built[-1]

    monkeypatch.setattr(clients, "servicebus_client", servicebus_client)
    return built


@pytest.fixture
def closed_services(monkeypatch: pytest.MonkeyPatch) -> list[TableService]:
    """The Table services closed during the test."""
    closed: list[TableService] = []
    close = TableService.close

    async def recording_close(self: TableService) -> None:
        closed.append(self)
        await close(self)

    monkeypatch.setattr(TableService, "close", recording_close)
    return closed


@pytest.fixture
def closed_remote(monkeypatch: pytest.MonkeyPatch) -> list[RemoteHttp]:
    """The remote HTTP closed during the test."""
    closed: list[RemoteHttp] = []
    close = RemoteHttp.close

    async def recording_close(self: RemoteHttp) -> None:
        closed.append(self)
        await close(self)

    monkeypatch.setattr(RemoteHttp, "close", recording_close)
    return closed


@pytest.fixture
def rt() -> Iterator[runtime.Runtime]:
    yield runtime.Runtime.from_settings(settings())


async def test_from_settings_builds_the_store_and_bus_and_opens_nothing(
    rt: runtime.Runtime, made: list[FakeClient]
) -> None:
    assert isinstance(rt.store, state_store.OrderStateStore)
    assert isinstance(rt.store._service, TableService)
    assert isinstance(rt.bus, bus.Bus)
    assert rt.workflows == rt.settings.workflows()
    assert made == [] and rt._remote_http is None and rt._status_bus is None
    await rt.close()


async def test_an_alert_is_logged_and_sent_signed_to_the_alerts_queue(
    rt: runtime.Runtime, made: list[FakeClient], caplog: pytest.LogCaptureFixture
) -> None:
    raised = alert()
    with caplog.at_level(logging.WARNING, logger="runtime"):
        await rt.alert(raised)
    assert "operator alert (error) for o-alert: step_failed" in caplog.text
    (client,) = made
    assert client.conn == rt.settings.servicebus and client.options == {}
    (sender,) = client.senders
    assert sender.queue == rt.settings.queue("alerts") == "operator-alerts"
    (message,) = sender.sent  # an AmqpAnnotatedMessage: what the SDK sends
    assert message.properties.subject == "OperatorAlert"
    assert message.properties.message_id == message_id_for(raised)
    assert message.properties.correlation_id == "o-alert"
    assert message.properties.content_type == "application/json"
    verdict = signing.verify(
        rt.settings.keyring,
        signing.signature_of(message.application_properties),
        queue="operator-alerts",
        message_id=message.properties.message_id,
        body=b"".join(message.body),
    )
    assert isinstance(verdict, signing.Verified)
    await rt.alert(alert("o-alert-2"))
    assert len(made) == 1 and len(sender.sent) == 2  # one client, one sender, reused
    await rt.close()


async def test_the_status_bus_is_its_own_quick_unsigned_bounded_bus(
    rt: runtime.Runtime, made: list[FakeClient]
) -> None:
    status_bus = rt.status_bus()
    assert isinstance(status_bus, bus.Bus) and status_bus is not rt.bus
    assert rt.status_bus() is status_bus
    assert status_bus._max_senders == runtime.STATUS_SENDERS
    update = StatusUpdate(order_id="o-status", sequence=0, state="Pending")
    await status_bus.send("reply-here", update)
    (client,) = made
    assert client.options == {"retry_total": 1, "retry_backoff_factor": 0.2}
    (message,) = client.senders[0].sent
    assert signing.signature_of(message.application_properties) is None
    await rt.close()
    assert client.closed and client.senders[0].closed


async def test_a_bus_opens_its_senders_without_the_sdks_keep_alive(
    rt: runtime.Runtime, made: list[FakeClient]
) -> None:
    await rt.alert(alert())
    await rt.status_bus().send(
        "reply-here", StatusUpdate(order_id="o", sequence=0, state="Pending")
    )
    assert [sender.options for client in made for sender in client.senders] == [
        {"keep_alive": 0},
        {"keep_alive": 0},
    ]
    await rt.close()


async def test_the_remote_http_is_one_built_from_the_settings_on_first_use(
    rt: runtime.Runtime, closed_remote: list[RemoteHttp]
) -> None:
    assert rt._remote_http is None
    http = rt.remote_http
    assert isinstance(http, RemoteHttp)
    assert rt.remote_http is http
    for service, url in rt.settings.service_urls.items():
        assert http.base_url(service) == url
        assert http._services[service].limits == rt.settings.remote_limits
    await rt.close()
    assert closed_remote == [http]


async def test_close_closes_both_buses_the_store_and_the_remote_http(
    rt: runtime.Runtime,
    made: list[FakeClient],
    closed_services: list[TableService],
    closed_remote: list[RemoteHttp],
) -> None:
    await rt.alert(alert())
    await rt.status_bus().send(
        "reply-here", StatusUpdate(order_id="o-close", sequence=0, state="Pending")
    )
    http = rt.remote_http
    await rt.close()
    assert [c.closed for c in made] == [True, True]
    assert all(s.closed for c in made for s in c.senders)
    assert closed_services == [rt.store._service]
    assert closed_remote == [http]


async def test_close_of_a_runtime_that_opened_nothing(
    rt: runtime.Runtime,
    made: list[FakeClient],
    closed_services: list[TableService],
    closed_remote: list[RemoteHttp],
) -> None:
    await rt.close()
    assert made == [] and closed_services == [rt.store._service] and closed_remote == []


async def test_each_runtime_has_its_breakers_reporting_to_its_rows_and_its_refused_queues(
    rt: runtime.Runtime,
) -> None:
    """What the process shares between its invocations is the Runtime's, so a test's Runtime
    shares nothing with another's."""
    other = runtime.Runtime.from_settings(settings())
    assert rt.breakers is not other.breakers
    assert rt.breakers.get("payment") is rt.breakers.get("payment")
    assert rt.breakers.get("payment") is not other.breakers.get("payment")
    assert rt.breakers.reporter is not None and rt.breakers.reporter._table() is rt.store.circuits
    assert rt.refusing_queues is not other.refusing_queues
    await other.close()


class SlowSender(FakeSender):
    """Records how many sends overlap; ``stuck`` sends never finish."""

    def __init__(self, queue: str, stuck: bool = False) -> None:
        super().__init__(queue)
        self.stuck = stuck
        self.active = 0
        self.most = 0
        self.started = asyncio.Event()

    async def send_messages(self, message: Any) -> None:
        self.active += 1
        self.most = max(self.most, self.active)
        self.started.set()
        try:
            await asyncio.sleep(3600 if self.stuck else 0.01)
            self._record(message)
        finally:
            self.active -= 1


class SlowClient(FakeClient):
    def __init__(self, stuck: int = 0) -> None:
        super().__init__(Connection("sb"), {})
        self.stuck = stuck

    def get_queue_sender(self, queue: str, **options: Any) -> SlowSender:
        self.senders.append(SlowSender(queue, stuck=len(self.senders) < self.stuck))
        return self.senders[-1]  # type: ignore[return-value]


def ids_of(messages: list[Any]) -> list[str]:
    return [m.properties.message_id for m in messages]


async def test_sends_on_one_sender_take_turns_and_those_that_waited_go_together() -> None:
    client = SlowClient()
    status_bus = bus.Bus(lambda: client)  # type: ignore[arg-type,return-value]
    updates = [StatusUpdate(order_id="o-turns", sequence=n, state="Pending") for n in range(8)]
    await asyncio.gather(*(status_bus.send("q", u) for u in updates))
    (sender,) = client.senders
    assert sender.most == 1
    # The first goes alone, at once; the seven that arrived while it was in flight, together.
    assert [len(call) for call in sender.calls] == [1, 7]
    assert ids_of(sender.sent) == [message_id_for(u) for u in updates]
    await status_bus.close()


class FailingSender(SlowSender):
    async def send_messages(self, message: Any) -> None:
        await super().send_messages(message)
        if isinstance(message, FakeBatch):
            raise ServiceBusError("the broker refused the batch")


class FailingClient(SlowClient):
    def get_queue_sender(self, queue: str, **options: Any) -> FakeSender:
        self.senders.append(FailingSender(queue))
        return self.senders[-1]


async def test_a_batch_that_fails_fails_each_of_its_sends_and_forgets_its_sender() -> None:
    client = FailingClient()
    status_bus = bus.Bus(lambda: client)  # type: ignore[arg-type,return-value]
    updates = [StatusUpdate(order_id="o-fail", sequence=n, state="Pending") for n in range(4)]
    outcomes = await asyncio.gather(
        *(status_bus.send("q", u) for u in updates), return_exceptions=True
    )
    assert outcomes[0] is None  # alone: sent
    assert all(isinstance(o, ServiceBusError) for o in outcomes[1:])
    assert client.senders[0].closed
    await status_bus.send("q", updates[1])  # the next send opens a fresh sender
    assert len(client.senders) == 2 and ids_of(client.senders[1].sent) == [
        message_id_for(updates[1])
    ]
    await status_bus.close()


async def test_a_send_cancelled_before_its_turn_never_goes() -> None:
    """...and one cancelled in flight is in doubt: its sender is forgotten."""
    client = SlowClient(stuck=1)
    status_bus = bus.Bus(lambda: client)  # type: ignore[arg-type,return-value]
    updates = [StatusUpdate(order_id="o-cut", sequence=n, state="Pending") for n in range(4)]
    first = asyncio.create_task(status_bus.send("q", updates[0]))
    while not client.senders:
        await asyncio.sleep(0)
    await client.senders[0].started.wait()  # type: ignore[attr-defined]
    waiting = [asyncio.create_task(status_bus.send("q", u)) for u in updates[1:]]
    await asyncio.sleep(0.01)
    waiting[0].cancel()  # cancelled while it waits for its turn
    first.cancel()  # cancelled in flight: the send is in doubt
    outcomes = await asyncio.gather(first, *waiting, return_exceptions=True)
    assert isinstance(outcomes[0], asyncio.CancelledError)
    assert isinstance(outcomes[1], asyncio.CancelledError)
    # The other two went out on a fresh sender: the one cut short was forgotten.
    assert outcomes[2:] == [None, None]
    assert client.senders[0].closed
    assert ids_of(client.senders[1].sent) == [message_id_for(u) for u in updates[2:]]
    await status_bus.close()


async def test_a_cancelled_send_forgets_its_sender() -> None:
    client = SlowClient(stuck=1)
    status_bus = bus.Bus(lambda: client)  # type: ignore[arg-type,return-value]
    update = StatusUpdate(order_id="o-cancel", sequence=0, state="Pending")
    task = asyncio.create_task(status_bus.send("q", update))
    while not client.senders:
        await asyncio.sleep(0)
    await client.senders[0].started.wait()  # type: ignore[attr-defined]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.senders[0].closed
    await status_bus.send("q", update)
    assert len(client.senders) == 2 and client.senders[1].sent
    await status_bus.close()


# -- clients and credentials ---------------------------------------------------------------

MANAGED = Connection("ServiceBusConnection", endpoint="sb-x.servicebus.windows.net", client_id="1")


async def test_servicebus_client_from_a_connection_string_is_the_asyncio_client() -> None:
    client = clients.servicebus_client(Connection("sb", connection_string=SERVICEBUS))
    assert isinstance(client, ServiceBusClient)
    await client.close()


async def test_servicebus_client_with_a_managed_identity_gets_an_async_credential() -> None:
    client = clients.servicebus_client(MANAGED, retry_total=1)
    try:
        assert isinstance(client, ServiceBusClient)
        assert isinstance(client._credential, ManagedIdentityCredential)
    finally:
        await client.close()
        await client._credential.close()


async def test_without_a_client_id_the_credential_is_the_default_chain() -> None:
    conn = Connection("ServiceBusConnection", endpoint="sb-x.servicebus.windows.net")
    client = clients.servicebus_client(conn)
    try:
        assert isinstance(client._credential, DefaultAzureCredential)
    finally:
        await client.close()
        await client._credential.close()


async def test_the_table_service_authenticates_with_the_async_credential() -> None:
    conn = Connection("StateStorage", endpoint="https://st.table.core.windows.net", client_id="1")
    service = clients.table_service(conn)
    try:
        assert isinstance(service, TableService)
        [policy] = [p for p in service._sender._policies if isinstance(p, BearerTokenPolicy)]
        assert isinstance(policy._credential, ManagedIdentityCredential)
    finally:
        await service.close()
        await policy._credential.close()


async def test_the_blob_service_authenticates_with_the_async_credential() -> None:
    conn = Connection("StateStorage", endpoint="https://st.blob.core.windows.net", client_id="1")
    client = archive.blob_service(conn)
    try:
        assert isinstance(client, BlobServiceClient)
        assert isinstance(client.credential, ManagedIdentityCredential)
    finally:
        await client.close()
        await client.credential.close()
