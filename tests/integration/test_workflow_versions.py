"""A new workflow version deployed while orders are in flight, against real Azurite, the
development broker and the fake remote services.

Orders are started on version 1 of the order workflow; then the "hosts" restart with version 2
current (a verify_address step in the middle; the charge undone by a void, not a refund), one
of them killed between a write and its sends during the switch. Every version-1 order must
finish or compensate by version 1, every new order runs version 2, and an order of a version
the deployment does not carry is parked with an alert, never guessed at.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from azure.servicebus import ServiceBusReceivedMessage
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver

from domain.messages import encode
from domain.states import ProcessState
from domain.workflows import ORDER_WORKFLOW, ORDER_WORKFLOW_V2, WORKFLOWS
from infra import predeploy as workflows_check
from service import migration, versions
from service.agent import handle_request
from service.commands import handle_command
from service.intake import handle_submission
from service.replies import handle_response
from service.runtime import Runtime
from service.sweep import run_tick
from tests.support.app import UNHURRIED_TICK_S, make_runtime
from tests.support.pattern import new_order

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

ROLES = ("orders", "inventory", "payment", "shipping", "responses", "commands")
V1_ORDERS = 100
V2_ORDERS = 20


class Crash(Exception):
    """The host died: what it wrote stays written, what it had not sent is not sent."""


class Pump:
    """Delivers this test's messages to the handlers of whichever runtime is the host now;
    other tests' leftovers on the shared queues are completed unread."""

    def __init__(self, connection_string: str, rt: Runtime, prefix: str) -> None:
        self._client = ServiceBusClient.from_connection_string(connection_string)
        self._receivers: dict[str, ServiceBusReceiver] = {
            role: self._client.get_queue_receiver(rt.settings.queue(role)) for role in ROLES
        }
        self._opened: set[str] = set()
        self.prefix = prefix
        self.handled = 0
        self.crashes = 0

    async def close(self) -> None:
        # Together: each close waits out its receiver's keep-alive sleep (up to a second).
        await asyncio.gather(*(receiver.close() for receiver in self._receivers.values()))
        await self._client.close()

    async def round(self, rt: Runtime) -> int:
        """Handle what is waiting on every queue once; how many messages were ours. The queues
        are read together (each read waits up to 0.3 s for a first message, and most find
        none), then what was read is handled queue by queue, in ROLES order."""
        batches = await asyncio.gather(*(self._receive(role) for role in ROLES))
        ours = 0
        for i, (role, batch) in enumerate(zip(ROLES, batches, strict=True)):
            receiver = self._receivers[role]
            for n, message in enumerate(batch):
                body = b"".join(message.body)
                if f'"order_id":"{self.prefix}' not in body.decode("utf-8", "replace"):
                    await receiver.complete_message(message)
                    continue
                try:
                    await handler(role)(body, rt)
                except Crash:
                    # A dead host settles nothing: what it held comes back for the next one.
                    self.crashes += 1
                    for held in batch[n:]:
                        await receiver.abandon_message(held)
                    for later, held_batch in zip(ROLES[i + 1 :], batches[i + 1 :], strict=True):
                        for held in held_batch:
                            await self._receivers[later].abandon_message(held)
                    self.handled += ours
                    return ours
                await receiver.complete_message(message)
                ours += 1
        self.handled += ours
        return ours

    async def _receive(self, role: str) -> list[ServiceBusReceivedMessage]:
        if role not in self._opened:
            # Its link opened apart (with the SDK's retries), not within a poll's wait.
            await self._receivers[role].__aenter__()
            self._opened.add(role)
        return await self._receivers[role].receive_messages(max_message_count=50, max_wait_time=0.3)


def handler(role: str) -> Callable[[bytes, Runtime], Awaitable[None]]:
    if role == "orders":
        return handle_submission
    if role == "responses":
        return handle_response
    if role == "commands":
        return handle_command
    return lambda body, rt: handle_request(body, role, rt)


def crash_after_writes(rt: Runtime, writes: int) -> None:
    """Kill ``rt``'s host at its next send after ``writes`` more order writes went through:
    the write is stored, its messages are not sent."""
    save, send = rt.store.save, rt.bus.send
    left = [writes]

    async def counting_save(*args, **kwargs):  # type: ignore[no-untyped-def]
        left[0] -= 1
        return await save(*args, **kwargs)

    async def dying_send(queue, message, **kwargs):  # type: ignore[no-untyped-def]
        if left[0] <= 0:
            raise Crash(f"host killed before sending to {queue}")
        return await send(queue, message, **kwargs)

    rt.store.save = counting_save  # type: ignore[method-assign]
    rt.bus.send = dying_send  # type: ignore[method-assign]


@pytest.fixture
async def hosts(env, clock, fakes) -> AsyncIterator[tuple[Runtime, Runtime]]:  # type: ignore[no-untyped-def]
    env |= {"STEP_TIMEOUT_SECONDS": "30"}  # a slow test machine must not expire steps
    v1 = await make_runtime(env | {"WORKFLOW_VERSIONS": "order=1"}, "v1", clock)
    v2 = await make_runtime(env | {"WORKFLOW_VERSIONS": "order=2"}, "v2", clock)
    yield v1, v2
    await v1.close()
    await v2.close()


@pytest.mark.timeout(600)
async def test_orders_in_flight_finish_on_their_version_across_a_deploy(  # type: ignore[no-untyped-def]
    hosts, servicebus, fakes, clock
):
    v1, v2 = hosts
    prefix = f"v{uuid.uuid4().hex[:8]}-"
    old = [new_order(order_id=f"{prefix}a{n:03d}").order_id for n in range(V1_ORDERS)]
    new = [new_order(order_id=f"{prefix}b{n:03d}").order_id for n in range(V2_ORDERS)]
    declined = [*old[::10], *new[::5]]  # shipping refuses these: they compensate
    fakes.set_profile({"services": {"shipping": {"decline_order_ids": declined}}})
    pump = Pump(servicebus.connection_string, v1, prefix)
    try:
        await pump.round(v1)  # open every link before the first deadline runs
        for order_id in old:
            await handle_submission(encode(new_order(order_id=order_id)), v1)
        while pump.handled < V1_ORDERS * 2:  # about half-way through version 1
            await pump.round(v1)
        crash_after_writes(v1, writes=3)  # the switch: a host dies mid-handler
        while pump.crashes == 0:
            await pump.round(v1)
        for order_id in new:  # the restarted hosts: version 2 is current
            await handle_submission(encode(new_order(order_id=order_id)), v2)
        await drain(pump, v2, [*old, *new], clock)
    finally:
        await pump.close()

    states = {o: await v2.store.load(o) for o in [*old, *new]}
    assert all(order.state.terminal for order in states.values()), Counter(
        order.state for order in states.values()
    )
    effects = effects_by_order(fakes.ledger(), prefix)
    for order_id in old:
        order = states[order_id]
        assert order.workflow == "order@1"
        assert tuple(s.name for s in order.steps) == ORDER_WORKFLOW.step_names
        assert "verify" not in effects[order_id] and "void" not in effects[order_id]
        if order_id in declined:
            assert order.state is ProcessState.ERROR
            assert effects[order_id] == Counter(reserve=1, charge=1, release=1, refund=1)
        else:
            assert order.state is ProcessState.PROCESSED
            assert effects[order_id] == Counter(reserve=1, charge=1, create=1)
    for order_id in new:
        order = states[order_id]
        assert order.workflow == "order@2"
        assert tuple(s.name for s in order.steps) == ORDER_WORKFLOW_V2.step_names
        if order_id in declined:  # refused at verify_address, before any shipment
            assert order.state is ProcessState.ERROR
            assert effects[order_id] == Counter(reserve=1, charge=1, release=1, void=1)
        else:
            assert order.state is ProcessState.PROCESSED
            assert effects[order_id] == Counter(reserve=1, charge=1, verify=1, create=1)
    assert pump.crashes == 1


async def drain(pump: Pump, rt: Runtime, order_ids: list[str], clock) -> None:  # type: ignore[no-untyped-def]
    """Deliver until every order is terminal; time moves on (and the Supervisor ticks) when
    nothing arrives, as a crash leaves an order to its deadline or its retry."""
    for _ in range(400):
        if await pump.round(rt) == 0:
            if all([(await rt.store.load(o)).state.terminal for o in order_ids]):
                return
            clock.advance(30)
            await run_tick(rt, budget_s=UNHURRIED_TICK_S)
    raise AssertionError("orders still in flight after 400 rounds")


def effects_by_order(ledger: list[dict], prefix: str) -> dict[str, Counter[str]]:
    found: dict[str, Counter[str]] = {}
    for entry in ledger:
        if entry["order_id"].startswith(prefix):
            found.setdefault(entry["order_id"], Counter())[entry["operation"]] += 1
    return found


async def test_an_order_of_a_version_not_carried_is_parked_with_an_alert(hosts, reader, clock):  # type: ignore[no-untyped-def]
    v1, v2 = hosts
    submitted = new_order(workflow_version=2)
    await handle_submission(encode(submitted), v2)
    stored = await v2.store.load(submitted.order_id)
    assert stored.workflow == "order@2"
    # A deployment that dropped version 2 (v1 here, with order@2 taken out of its registry).
    v1.workflows = {ref: flow for ref, flow in v1.workflows.items() if ref != "order@2"}
    clock.advance(120)  # past the step's deadline: the Supervisor looks at it
    report = await run_tick(v1)
    assert report.parked == 1 and report.retried == 0
    after = await v1.store.load(submitted.order_id)
    assert (after.etag, after.state, after.failure_count) == (stored.etag, stored.state, 0)
    alert = reader.expect(v1.settings.queue("alerts"), submitted.order_id)
    assert b"workflow_version_missing" in alert and b"order@2" in alert
    # Its index row waits PARKED_RECHECK before the next look: no alert every tick.
    assert (await run_tick(v1)).parked == 0


async def test_a_submission_for_a_version_not_carried_is_refused_with_an_alert(hosts, reader):  # type: ignore[no-untyped-def]
    v1, _ = hosts
    submitted = new_order(workflow_version=9)
    await handle_submission(encode(submitted), v1)
    assert await v1.store.find(submitted.order_id) is None
    alert = reader.expect(v1.settings.queue("alerts"), submitted.order_id)
    assert b"unknown_workflow_version" in alert and b"order@9" in alert


async def test_the_deploy_check_refuses_to_drop_a_version_orders_need(hosts):  # type: ignore[no-untyped-def]
    v1, v2 = hosts
    for _ in range(3):
        await handle_submission(encode(new_order()), v1)
    await handle_submission(encode(new_order(workflow_version=2)), v2)
    in_use = await versions.versions_in_use(v1.store)
    assert in_use["order@1"].in_flight == 3 and in_use["order@2"].in_flight == 1
    ok, message = versions.check(in_use, WORKFLOWS)
    assert ok, message
    ok, message = versions.check(in_use, ["order@2", "single_step@1"])
    assert not ok
    assert "order@1: 3 in flight, 0 in Error" in message


async def test_the_predeploy_hook_exits_1_for_a_package_that_drops_a_needed_version(  # type: ignore[no-untyped-def]
    hosts, env, monkeypatch, capsys
):
    v1, _ = hosts
    await handle_submission(encode(new_order()), v1)
    hook_env = {
        "StateStorage": env["StateStorage"],
        "ORDERS_TABLE": env["ORDERS_TABLE"],
        "ACTIVE_ORDERS_TABLE": env["ACTIVE_ORDERS_TABLE"],
    }
    assert await hook(hook_env) == 0
    without_v1 = {ref: flow for ref, flow in WORKFLOWS.items() if ref != "order@1"}
    monkeypatch.setattr(workflows_check, "WORKFLOWS", without_v1)
    assert await hook(hook_env) == 1
    assert "order@1: 1 in flight" in capsys.readouterr().err
    assert await hook(hook_env | {"SKIP_WORKFLOW_CHECK": "1"}) == 0
    fresh = hook_env | {"ORDERS_TABLE": "nosuchorders", "ACTIVE_ORDERS_TABLE": "nosuchactive"}
    assert await hook(fresh) == 0  # a first deploy: nothing to keep


async def hook(env: dict[str, str]) -> int:
    """The predeploy hook run as azd runs it: a command of its own, with its own event loop
    (a thread here, since the test's loop is running)."""
    return await asyncio.to_thread(workflows_check.main, env)


async def test_migrate_moves_the_orders_the_new_version_keeps_and_refuses_the_rest(  # type: ignore[no-untyped-def]
    hosts, reader
):
    v1, v2 = hosts
    at_reserve = [new_order() for _ in range(3)]
    for submitted in at_reserve:
        await handle_submission(encode(submitted), v1)
    charged = new_order()
    await handle_submission(encode(charged), v1)
    inventory = v1.settings.queue("inventory")
    await handle_request(reader.expect(inventory, charged.order_id), "inventory", v1)
    await handle_response(reader.expect(v1.settings.queue("responses"), charged.order_id), v1)
    assert (await v1.store.load(charged.order_id)).current_step == "charge_payment"

    dry = await migration.migrate(v2, "order@1", "order@2", actor="operator:ann", reason="switch")
    assert (dry.examined, dry.migrated, dry.dry_run) == (4, 3, True)
    assert [(await v1.store.load(o.order_id)).workflow for o in at_reserve] == ["order@1"] * 3

    done = await migration.migrate(
        v2, "order@1", "order@2", actor="operator:ann", reason="switch", dry_run=False
    )
    assert (done.examined, done.migrated) == (4, 3)
    [(why, count)] = done.refused.items()
    assert count == 1 and "does not keep order@1's step charge_payment" in why
    for submitted in at_reserve:
        moved = await v2.store.load(submitted.order_id)
        assert moved.workflow == "order@2" and len(moved.steps) == 4
        events = [e.event for e in await v2.store.get_timeline(submitted.order_id)]
        assert events[-1] == "migrated"
    assert (await v2.store.load(charged.order_id)).workflow == "order@1"
    in_use = await versions.versions_in_use(v2.store)  # the index rows follow the migration
    assert in_use["order@2"].in_flight >= 3
