"""What a handler needs to do its work, built once per process from the app settings.

Handlers take a Runtime explicitly, so the Azure host, the local host and tests all call the
same code. Each app's composition root builds the process's one (:mod:`service.composition`,
:mod:`service.operations.composition`); a test builds its own. Building one opens nothing: its
clients connect on first use, on the event loop that uses them.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from adapters import clients
from adapters.remote_http import RemoteHttp
from adapters.servicebus import Bus
from adapters.settings import Settings
from adapters.store import circuits
from adapters.store.state_store import OrderStateStore
from domain.messages import OperatorAlert, utc_now
from domain.workflows import Workflow, resolve
from service.circuit import BreakerRegistry, CircuitReporter
from service.refusing_queues import RefusingQueues


def new_instance_id(role: str = "app") -> str:
    """Who acts, as recorded in LockedBy and the timeline: host, process and a random part."""
    host = "".join(c for c in socket.gethostname() if c.isalnum() or c in "-.")[:40] or "host"
    return f"{role}@{host}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


log = logging.getLogger("runtime")

Store = TypeVar("Store", bound=OrderStateStore)

STATUS_SENDERS = 64
"""Reply-queue senders kept open per process (each holds an AMQP link)."""
CLOSE_FLUSH_S = 5.0
"""How long closing waits for the circuit rows still to be written."""


@dataclass
class Runtime(Generic[Store]):
    settings: Settings
    store: Store
    bus: Bus
    workflows: Mapping[str, Workflow]
    instance_id: str = field(default_factory=new_instance_id)
    clock: Callable[[], datetime] = utc_now
    rng: random.Random = field(default_factory=random.Random)
    _remote_http: RemoteHttp | None = None
    agent_clients: dict[str, Any] = field(default_factory=dict)
    """Remote-service clients the agents built on this runtime (see service.agent)."""
    breakers: BreakerRegistry = field(default_factory=BreakerRegistry)
    """One circuit breaker per remote service, shared by every client of it (service.circuit);
    :meth:`from_settings` reports their transitions to this instance's circuit rows."""
    refusing_queues: RefusingQueues = field(default_factory=RefusingQueues)
    """Submitters' reply queues that refused an update lately (service.apply)."""
    _status_bus: Bus | None = None
    _status_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        store_type: type[Store] = OrderStateStore,  # type: ignore[assignment]
        **overrides: object,
    ) -> Runtime[Store]:
        """The Runtime of ``settings``; its store a ``store_type`` (the operations app and the
        tools: :class:`adapters.store.records.OrderRecords`, which the pattern app never loads)."""
        workflows = settings.workflows()
        store = store_type(
            clients.table_service(settings.storage),
            orders_table=settings.orders_table,
            active_table=settings.active_table,
            supervision_table=settings.supervision_table,
            clock=overrides.get("clock", utc_now),  # type: ignore[arg-type]
            owns_service=True,  # the service is the store's alone: close() closes its pool
        )
        # The app's own messages are signed; status updates to submitters' queues are not.
        bus = Bus(lambda: clients.servicebus_client(settings.servicebus), keyring=settings.keyring)
        # The breakers' transitions go to this instance's circuit rows (the dashboard's).
        reporter = CircuitReporter(lambda: store.circuits, circuits.instance_id())
        breakers = BreakerRegistry(reporter=reporter)
        return cls(settings=settings, store=store, bus=bus, workflows=workflows,
                   breakers=breakers, **overrides)  # type: ignore[arg-type]  # fmt: skip

    @property
    def remote_http(self) -> RemoteHttp:
        """The worker's HTTP to the agents' remote services, their URLs, timeout and connection
        limit from the settings; built on first use, its session opened on the first call."""
        with self._status_lock:
            if self._remote_http is None:
                self._remote_http = RemoteHttp.from_settings(self.settings)
            return self._remote_http

    def actor(self, role: str) -> str:
        return f"{role}:{self.instance_id}"

    def workflow(self, ref: str) -> Workflow:
        """The definition an order recorded (``order@2``; a bare name is version 1), or
        :class:`domain.workflows.UnknownWorkflow` if this deployment does not carry it."""
        return resolve(self.workflows, ref)

    async def alert(self, alert: OperatorAlert) -> None:
        log.warning(
            "operator alert (%s) for %s: %s — %s",
            alert.severity,
            alert.order_id or "unknown order",
            alert.reason,
            alert.detail,
        )
        await self.bus.send(self.settings.queue("alerts"), alert)

    def status_bus(self) -> Bus:
        """The sender to submitters' reply queues, apart from the app's own messaging.

        Its client retries once, quickly: a reply queue that does not exist fails in about a
        second instead of the default retry schedule's fifteen, and an order never waits long
        for its submitter's queue. Its sender cache is bounded (queue names come from outside).
        """
        with self._status_lock:
            if self._status_bus is None:
                conn = self.settings.servicebus
                self._status_bus = Bus(
                    lambda: clients.servicebus_client(
                        conn, retry_total=1, retry_backoff_factor=0.2
                    ),
                    max_senders=STATUS_SENDERS,
                )
            return self._status_bus

    async def close(self) -> None:
        """Close its clients, once the circuit rows that wait are written (or
        :data:`CLOSE_FLUSH_S` has passed)."""
        if self.breakers.reporter is not None:
            await self.breakers.reporter.flush(timeout=CLOSE_FLUSH_S)
        await self.bus.close()
        if self._status_bus is not None:
            await self._status_bus.close()
        await self.store.close()
        if self._remote_http is not None:
            await self._remote_http.close()
