"""Helpers for tests that stage the pattern message by message (fixtures: see
tests/integration/conftest.py).

:class:`Stage` plays the Functions host by hand over either adapter set: the real one (Azurite,
the development broker) or the in-memory one (:mod:`devstack.memory`), with the same fake remote
services over HTTP behind the agents. A scenario written against a Stage runs unchanged on both.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Literal

from adapters.servicebus import Bus
from devstack.fakes.remote_services import FakeServices
from devstack.memory import MemoryBus, MemoryStore, SendFailed
from domain.messages import MessageBase, OrderSubmitted, encode
from service.agent import handle_request
from service.commands import handle_command
from service.intake import handle_submission
from service.replies import handle_response
from service.runtime import Runtime, new_instance_id
from service.sweep import run_tick
from service.sweep_report import TickReport
from tests.support.app import Clock, QueueReader

UNDO_OF = {"reserve": "release", "charge": "refund", "create": "cancel"}
SERVICES = ("inventory", "payment", "shipping")
Adapters = Literal["memory", "real"]


def new_order(**overrides: Any) -> OrderSubmitted:
    fields = {
        "order_id": f"o-{uuid.uuid4().hex[:12]}",
        "customer_id": "c-1",
        "items": [{"sku": "SKU-1", "quantity": 2, "unit_price_cents": 1250}],
        "currency": "EUR",
    }
    return OrderSubmitted.model_validate(fields | overrides)


def queue(rt: Runtime, role: str) -> str:
    return rt.settings.queue(role)


def take_request(rt: Runtime, reader: QueueReader, order_id: str, service: str) -> dict:
    return json.loads(reader.expect(queue(rt, service), order_id))


async def run_agent_step(rt: Runtime, reader: QueueReader, order_id: str, service: str) -> dict:
    """Deliver the next request of ``service`` to its agent and the reply to the Scheduler."""
    request = reader.expect(queue(rt, service), order_id)
    await handle_request(request, service, rt)
    await handle_response(reader.expect(queue(rt, "responses"), order_id), rt)
    return json.loads(request)


async def run_command(rt: Runtime, reader: QueueReader, order_id: str) -> None:
    await handle_command(reader.expect(queue(rt, "commands"), order_id), rt)


def effects(fakes: FakeServices, order_id: str) -> list[tuple[str, str, str]]:
    """(service, operation, idempotency key) of each effect applied for ``order_id``."""
    return [
        (e["service"], e["operation"], e["idempotency_key"])
        for e in fakes.ledger()
        if e["order_id"] == order_id
    ]


def net_effects(fakes: FakeServices, order_id: str) -> dict[str, int]:
    """Per service: forward effects minus their undos (0: everything was undone)."""
    net: Counter[str] = Counter()
    for service, operation, _ in effects(fakes, order_id):
        net[service] += 1 if operation in UNDO_OF else -1
    return dict(net)


def tombstoned(fakes: FakeServices, order_id: str) -> set[str]:
    """Forward keys of ``order_id`` that a service refuses for ever (undone before applied)."""
    return {t["idempotency_key"] for t in fakes.tombstones() if t["order_id"] == order_id}


def alerts_for(rt: Runtime, reader: QueueReader, order_id: str, wait: float = 1.0) -> list[dict]:
    """Every alert about ``order_id`` now on the alerts queue (taken off it)."""
    found = []
    while (raw := reader.take(queue(rt, "alerts"), order_id, wait=wait)) is not None:
        found.append(json.loads(raw))
    return found


# ----------------------------------------------------------------------------------- Stage


class Fuse:
    """Sends left before every further send fails (None: never): a crash after the write."""

    def __init__(self) -> None:
        self.left: int | None = None
        self.refused = 0
        """Sends refused since the fuse was last set."""


class CrashingBus:
    """A bus (real or in-memory) that raises :class:`SendFailed` once its fuse has burnt."""

    def __init__(self, inner: Bus | MemoryBus, fuse: Fuse) -> None:
        self.inner = inner
        self.fuse = fuse

    async def send(
        self, queue: str, message: MessageBase, *, scheduled_at: datetime | None = None
    ) -> None:
        if self.fuse.left is not None:
            if self.fuse.left <= 0:
                self.fuse.refused += 1
                raise SendFailed(f"crashed before sending {type(message).__name__} to {queue}")
            self.fuse.left -= 1
        await self.inner.send(queue, message, scheduled_at=scheduled_at)

    async def close(self) -> None:
        await self.inner.close()


class Stage:
    """The app under test, one message at a time, over ``adapters`` (see the module docstring).

    Queues are read by role (``"inventory"``, ``"responses"``, ``"commands"``, ``"alerts"``)
    or, for the submitter's reply queue, by :attr:`status_queue`. A scheduled message (a
    delayed retry) is not taken by :meth:`take` before it is due; :meth:`take_scheduled` takes
    it early and says when it was due.
    """

    def __init__(
        self,
        adapters: Adapters,
        rt: Runtime,
        clock: Clock,
        fakes: FakeServices,
        status_queue: str,
        reader: QueueReader | None,
    ) -> None:
        self.adapters = adapters
        self.rt = rt
        self.clock = clock
        self.fakes = fakes
        self.status_queue = status_queue
        self._reader = reader
        self.fuse = Fuse()
        self._memory = rt.bus if isinstance(rt.bus, MemoryBus) else None
        self._taken: set[int] = set()
        rt.bus = CrashingBus(rt.bus, self.fuse)  # type: ignore[assignment]
        rt._status_bus = CrashingBus(rt.status_bus(), self.fuse)  # type: ignore[assignment]

    @classmethod
    def in_memory(
        cls, env: dict[str, str], clock: Clock, fakes: FakeServices, status_queue: str
    ) -> Stage:
        from adapters.settings import Settings

        settings = Settings.from_env(env)
        bus = MemoryBus()
        rt = Runtime(
            settings=settings,
            store=MemoryStore(clock),  # type: ignore[arg-type]
            bus=bus,  # type: ignore[arg-type]
            workflows=settings.workflows(),
            instance_id=new_instance_id("scheduler"),
            clock=clock,
        )
        rt._status_bus = bus  # type: ignore[assignment]
        return cls("memory", rt, clock, fakes, status_queue, None)

    # ------------------------------------------------------------------------------ queues

    def queue(self, role: str) -> str:
        return self.status_queue if role == "status" else self.rt.settings.queue(role)

    def take(self, role: str, order_id: str | None, wait: float = 10.0) -> bytes | None:
        """The next message due on ``role``'s queue about ``order_id`` (None: any), taken."""
        name = self.queue(role)
        if self._reader is not None:
            return self._reader.take(name, order_id, wait=wait)
        assert self._memory is not None
        now = self.clock()
        for i, sent in enumerate(self._memory.sent):
            if i in self._taken or sent.queue != name:
                continue
            if sent.scheduled_at is not None and sent.scheduled_at > now:
                continue
            if order_id is None or getattr(sent.message, "order_id", None) == order_id:
                self._taken.add(i)
                return encode(sent.message)
        return None

    def expect(self, role: str, order_id: str | None, wait: float = 10.0) -> bytes:
        raw = self.take(role, order_id, wait)
        assert raw is not None, f"no message for {order_id} on {self.queue(role)}"
        return raw

    def none_on(self, role: str, order_id: str | None) -> bool:
        """True if nothing (more) about ``order_id`` is on ``role``'s queue."""
        return self.take(role, order_id, wait=1.0) is None

    def all_on(self, role: str, order_id: str) -> list[dict]:
        """Every message about ``order_id`` now on ``role``'s queue, taken, in queue order."""
        found = []
        while (raw := self.take(role, order_id, wait=1.0)) is not None:
            found.append(json.loads(raw))
        return found

    def take_scheduled(self, role: str, order_id: str) -> tuple[bytes, datetime]:
        """A scheduled message about ``order_id`` before it is due: its body and due time."""
        name = self.queue(role)
        if self._reader is not None:
            return self._reader.take_scheduled(name, order_id)
        assert self._memory is not None
        for i, sent in enumerate(self._memory.sent):
            message = sent.message
            if i in self._taken or sent.queue != name or sent.scheduled_at is None:
                continue
            if getattr(message, "order_id", None) == order_id:
                self._taken.add(i)
                return encode(message), sent.scheduled_at
        raise AssertionError(f"no scheduled message for {order_id} on {name}")

    def scheduled(self, role: str, order_id: str) -> int:
        """How many scheduled messages about ``order_id`` wait on ``role``'s queue."""
        name = self.queue(role)
        if self._reader is not None:
            return len(self._reader.peek_scheduled(name, order_id))
        assert self._memory is not None
        return sum(
            1
            for i, sent in enumerate(self._memory.sent)
            if i not in self._taken
            and sent.queue == name
            and sent.scheduled_at is not None
            and getattr(sent.message, "order_id", None) == order_id
        )

    # ---------------------------------------------------------------------------- handlers

    async def submit(self, order: OrderSubmitted) -> None:
        await handle_submission(encode(order), self.rt)

    def request(self, service: str, order_id: str) -> bytes:
        """Take ``service``'s next request for the order off its queue (not delivered yet)."""
        return self.expect(service, order_id)

    async def agent(self, request: bytes, service: str) -> None:
        await handle_request(request, service, self.rt)

    async def reply(self, order_id: str) -> bytes:
        """Deliver the next agent reply about the order to the Scheduler; returns it."""
        body = self.expect("responses", order_id)
        await handle_response(body, self.rt)
        return body

    async def step(self, service: str, order_id: str) -> dict:
        """``service``'s next request to its agent, and the agent's reply to the Scheduler."""
        request = self.request(service, order_id)
        await self.agent(request, service)
        await self.reply(order_id)
        return json.loads(request)

    async def command(self, body: bytes) -> None:
        await handle_command(body, self.rt)

    async def tick(self) -> TickReport:
        return await run_tick(self.rt)

    async def crash(
        self, action: Callable[[], Awaitable[object]], *, after: int, raises: bool = True
    ) -> None:
        """Run ``action`` with every send after the first ``after`` failing: the process dies
        between its write and its sends. A handler must raise (so that its message comes
        again); the Supervisor's tick (``raises=False``) may log the failure and go on."""
        self.fuse.left, self.fuse.refused = after, 0
        raised = False
        try:
            await action()
        except SendFailed:
            raised = True
        finally:
            self.fuse.left = None
        assert self.fuse.refused, "nothing was left to send: no crash happened"
        assert raised or not raises, "the handler swallowed the failed send: its message is lost"
