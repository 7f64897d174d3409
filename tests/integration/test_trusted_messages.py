"""Forged internal messages change nothing and raise a security alert (issue 15, item 5), and
a validly signed request the order never sent cannot pass its answer off as the genuine one
(issue 39, item 6).

Against Azurite, the development broker and the fake services: each forgery is sent to the real
queue through the SDK, received like the Functions host receives it, and handed to the trigger's
own code (``on_request`` / ``on_reply`` / ``on_command``, what the registered function runs
with the process Runtime). Genuine messages take the same path, so the signatures are shown to
survive the broker round trip. Each case checks that the order (state, ETag, timeline), the
remote services' ledgers and the queues are as before, that no Table request was made, and
that one ``untrusted_message`` alert names the queue, the MessageId and the problem.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient

from adapters.op_counts import COUNTS
from adapters.servicebus import Bus
from adapters.store.rows import OrderNotFound
from agent.functions import on_request
from devstack.host.servicebus_runner import to_function_message
from domain import signing
from domain.agents import AGENTS
from domain.lifecycle import UNREQUESTED_REASON
from domain.messages import AgentRequest, AgentResponse, DueRow, DueRows, SchedulerCommand, encode
from domain.signing import SIGNING_KEYS_SETTING
from domain.states import ProcessState
from scheduler.functions import on_command, on_reply
from service.intake import handle_submission
from tests.support.app import QueueReader, make_runtime
from tests.support.keys import new_key_text
from tests.support.pattern import effects, new_order, queue

pytestmark = pytest.mark.anyio

AGENT = {agent.name: agent for agent in AGENTS}


@pytest.fixture
def env(env):
    """The shared settings with a step budget no test here comes near: these tests wait out
    queues (a second each) between a step's claim and its genuine request, and the shared
    five seconds could pass on a loaded machine; no deadline is under test here."""
    return env | {"STEP_TIMEOUT_SECONDS": "60"}


@pytest.fixture
def sender(servicebus) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        yield client


def forge(
    client: ServiceBusClient,
    queue_name: str,
    body: bytes,
    message_id: str | None = None,
    **properties: Any,
) -> str:
    """Send ``body`` as an outsider would (no key, or the ``signature`` given); its MessageId."""
    message_id = message_id or f"forged-{uuid.uuid4().hex[:12]}"
    with client.get_queue_sender(queue_name) as s:
        s.send_messages(
            ServiceBusMessage(
                body, message_id=message_id, application_properties=properties or None
            )
        )
    return message_id


def forge_signed(client: ServiceBusClient, rt, queue_name: str, body: bytes) -> str:
    """Send ``body`` signed with the app's own key (a leaked key, or a bug upstream) under a
    MessageId of the sender's choosing; its MessageId."""
    message_id = f"forged-{uuid.uuid4().hex[:12]}"
    signature = signing.sign(
        rt.settings.keyring, queue=queue_name, message_id=message_id, body=body
    )
    return forge(client, queue_name, body, message_id, signature=signature)


def take(reader: QueueReader, queue_name: str, message_id: str) -> ServiceBusReceivedMessage:
    message = reader.take_message(queue_name, lambda m: m.message_id == message_id)
    assert message is not None, f"{message_id} never reached {queue_name}"
    return message


def take_for(reader: QueueReader, queue_name: str, order_id: str) -> ServiceBusReceivedMessage:
    message = reader.take_message(queue_name, lambda m: m.correlation_id == order_id)
    assert message is not None, f"nothing for {order_id} on {queue_name}"
    return message


def untrusted_alerts(rt, reader: QueueReader) -> list[dict]:
    found = []
    while (raw := reader.take(queue(rt, "alerts"), None, wait=1.0)) is not None:
        alert = json.loads(raw)
        if alert["reason"] == "untrusted_message":
            found.append(alert)
    return found


def all_alerts(rt, reader: QueueReader) -> list[dict]:
    found = []
    while (raw := reader.take(queue(rt, "alerts"), None, wait=1.0)) is not None:
        found.append(json.loads(raw))
    return found


def only_alert_for(rt, reader: QueueReader, queue_name: str, message_id: str, problem: str):
    alerts = [a for a in untrusted_alerts(rt, reader) if message_id in a["detail"]]
    assert len(alerts) == 1, alerts
    alert = alerts[0]
    assert alert["severity"] == "critical" and alert["order_id"] is None
    assert f"queue {queue_name}:" in alert["detail"]
    assert f"({problem})" in alert["detail"]
    return alert


async def snapshot(rt, order_id: str) -> tuple[Any, ...]:
    order = await rt.store.load(order_id)
    return order.etag, order.state, order.current_step, len(await rt.store.get_timeline(order_id))


def table_requests() -> int:
    return sum(n for kind, n in COUNTS.snapshot().items() if kind.startswith("table."))


async def deliver_genuine_step(rt, reader: QueueReader, order_id: str, service: str) -> None:
    await on_request(
        to_function_message(take_for(reader, queue(rt, service), order_id)),
        AGENT[service],
        rt,
    )
    await on_reply(to_function_message(take_for(reader, queue(rt, "responses"), order_id)), rt)


@pytest.fixture
async def at_payment(rt, reader, fakes):
    """An order whose inventory step went through the signed path; its payment request waits."""
    order = new_order()
    await handle_submission(encode(order), rt)
    await deliver_genuine_step(rt, reader, order.order_id, "inventory")
    request = take_for(reader, queue(rt, "payment"), order.order_id)
    assert (await rt.store.load(order.order_id)).current_step == "charge_payment"
    return order.order_id, request


def forged_reply(request: ServiceBusReceivedMessage, **outcome: Any) -> bytes:
    asked = json.loads(b"".join(request.body))
    fields = {k: asked[k] for k in ("order_id", "step", "operation", "attempt", "idempotency_key")}
    return encode(AgentResponse(**(fields | outcome)))


async def test_a_request_for_an_order_that_does_not_exist_calls_no_service(
    rt, reader, fakes, sender
):
    order_id = f"o-ghost-{uuid.uuid4().hex[:8]}"
    forged = AgentRequest(
        order_id=order_id,
        step="charge_payment",
        operation="do",
        action="charge",
        attempt=1,
        complete_by="2999-01-01T00:00:00Z",
        idempotency_key=f"{order_id}:charge_payment:do:1",
        payload={"amount_cents": 100_000, "currency": "EUR"},
    )
    payment = queue(rt, "payment")
    message_id = forge(sender, payment, encode(forged))
    before = table_requests()
    await on_request(to_function_message(take(reader, payment, message_id)), AGENT["payment"], rt)
    assert table_requests() == before
    assert effects(fakes, order_id) == []
    assert reader.take(queue(rt, "responses"), order_id, wait=1.0) is None
    with pytest.raises(OrderNotFound):
        await rt.store.load(order_id)
    alert = only_alert_for(rt, reader, payment, message_id, "unsigned")
    assert f"for order '{order_id}'" in alert["detail"]


async def test_a_forged_success_reply_marks_nothing_done(rt, reader, fakes, sender, at_payment):
    order_id, request = at_payment
    responses = queue(rt, "responses")
    before, ledger = await snapshot(rt, order_id), effects(fakes, order_id)
    message_id = forge(sender, responses, forged_reply(request, outcome="succeeded"))
    await on_reply(to_function_message(take(reader, responses, message_id)), rt)
    assert await snapshot(rt, order_id) == before
    assert effects(fakes, order_id) == ledger
    assert reader.take(queue(rt, "shipping"), order_id, wait=1.0) is None
    only_alert_for(rt, reader, responses, message_id, "unsigned")
    # The genuine request is still in flight and carries the order on: nothing was skipped.
    await on_request(to_function_message(request), AGENT["payment"], rt)
    await on_reply(to_function_message(take_for(reader, responses, order_id)), rt)
    await deliver_genuine_step(rt, reader, order_id, "shipping")
    assert (await rt.store.load(order_id)).state is ProcessState.PROCESSED
    assert [e[0] for e in effects(fakes, order_id)] == ["inventory", "payment", "shipping"]


async def test_a_forged_decline_fails_nothing(rt, reader, fakes, sender, at_payment):
    order_id, _request = at_payment
    responses = queue(rt, "responses")
    before, ledger = await snapshot(rt, order_id), effects(fakes, order_id)
    body = forged_reply(_request, outcome="failed", transient=False, error_code="card_declined")
    # Signed, but with a key the app does not have: as unknown as no signature.
    outsider = "v1.k1." + "A" * 43
    message_id = forge(sender, responses, body, signature=outsider)
    await on_reply(to_function_message(take(reader, responses, message_id)), rt)
    assert await snapshot(rt, order_id) == before
    assert (await rt.store.load(order_id)).state is ProcessState.PROCESSING
    assert effects(fakes, order_id) == ledger
    assert reader.take(queue(rt, "inventory"), order_id, wait=1.0) is None  # no undo sent
    only_alert_for(rt, reader, responses, message_id, "unknown_key")


async def test_a_forged_command_from_mallory_changes_nothing(rt, reader, fakes, sender, at_payment):
    order_id, _request = at_payment
    commands = queue(rt, "commands")
    before, ledger = await snapshot(rt, order_id), effects(fakes, order_id)
    forged = SchedulerCommand(
        order_id=order_id,
        command="retry",
        attempt=1,
        failure_count=0,
        reason="because I can",
        requested_by="operator:mallory",
    )
    message_id = forge(sender, commands, encode(forged))
    await on_command(to_function_message(take(reader, commands, message_id)), rt)
    assert await snapshot(rt, order_id) == before
    assert effects(fakes, order_id) == ledger
    assert "mallory" not in json.dumps([t.actor for t in await rt.store.get_timeline(order_id)])
    alert = only_alert_for(rt, reader, commands, message_id, "unsigned")
    assert "'SchedulerCommand'" in alert["detail"]


async def test_forged_hand_outs_recover_nothing(rt, reader, sender, clock):
    """The Supervisor's own DueRows messages are signed: one an outsider sends, and a genuine
    one whose rows were changed after it was signed, are refused before any Table request,
    and the overdue order they name is not recovered by them."""
    order = new_order()
    await handle_submission(encode(order), rt)
    clock.advance(6)  # past its step deadline: a genuine hand-out would release it
    [row] = [r async for r in rt.store.all_active() if r.order_id == order.order_id]
    bucket = int(row.partition_key[1:])
    forged = DueRows(
        bucket=bucket,
        hand_out="f" * 32,
        rows=(DueRow(order_id=order.order_id, generation=1, found_due=row.due_at),),
        leased_until=clock(),
        dispatched_at=clock(),
        requested_by="supervisor:mallory",
    )
    commands = queue(rt, "commands")
    before = await snapshot(rt, order.order_id)
    unsigned = forge(sender, commands, encode(forged))
    # A genuine hand-out of another row, signed by the app, its body then changed to this row.
    genuine = Bus(lambda: None, keyring=rt.settings.keyring).prepare(  # type: ignore[arg-type]
        commands, forged.model_copy(update={"bucket": (bucket + 1) % 16})
    )
    altered = forge(
        sender,
        commands,
        encode(forged),
        genuine.message_id,
        signature=genuine.application_properties[signing.SIGNATURE_PROPERTY],
    )

    COUNTS.reset()
    for message_id in (unsigned, altered):
        await on_command(to_function_message(take(reader, commands, message_id)), rt)
    assert table_requests() == 0

    assert await snapshot(rt, order.order_id) == before
    alerts = untrusted_alerts(rt, reader)
    for message_id, problem in ((unsigned, "unsigned"), (altered, "bad_signature")):
        [alert] = [a for a in alerts if message_id in a["detail"]]
        assert alert["severity"] == "critical" and alert["order_id"] is None
        assert f"({problem})" in alert["detail"] and "'DueRows'" in alert["detail"]


async def test_a_signed_request_for_a_key_never_sent_ends_in_an_unrequested_answer_alert(
    rt, reader, fakes, sender, at_payment
):
    """Issue 39: a request signed with the app's own key, without a snapshot (as one too large
    to carry it travels), for the next generation's key, at the attempt of the genuine payment
    request that was answered moments before. The agent carries such a request out unchecked
    (docs/how-it-works.md, "Trusted messages"); its answer was named like the genuine answer,
    so duplicate detection dropped it: a charge in the service's ledger, no alert, no trace on
    the order. Now the answer reaches the Scheduler, which changes nothing and raises one
    critical ``unrequested_answer`` alert naming the key, and the order carries on."""
    order_id, request = at_payment
    await on_request(to_function_message(request), AGENT["payment"], rt)
    responses = queue(rt, "responses")
    genuine_answer = take_for(reader, responses, order_id)
    await on_reply(to_function_message(genuine_answer), rt)
    assert (await rt.store.load(order_id)).current_step == "create_shipment"

    genuine = AgentRequest.model_validate_json(b"".join(request.body))
    never_sent = f"{order_id}:charge_payment:do:2"
    forged = AgentRequest.model_validate(
        genuine.model_dump() | {"idempotency_key": never_sent, "resume": None}
    )
    payment = queue(rt, "payment")
    message_id = forge_signed(sender, rt, payment, encode(forged))
    await on_request(to_function_message(take(reader, payment, message_id)), AGENT["payment"], rt)
    assert ("payment", "charge", never_sent) in effects(fakes, order_id)  # carried out unchecked

    answer = reader.take_message(responses, lambda m: m.correlation_id == order_id)
    assert answer is not None, "the forged request's answer was dropped as a copy of another"
    assert answer.message_id != genuine_answer.message_id
    before = await snapshot(rt, order_id)
    await on_reply(to_function_message(answer), rt)
    assert await snapshot(rt, order_id) == before
    alerts = [a for a in all_alerts(rt, reader) if a["reason"] == UNREQUESTED_REASON]
    assert len(alerts) == 1, alerts
    assert alerts[0]["severity"] == "critical" and alerts[0]["order_id"] == order_id
    assert f"key {never_sent}," in alerts[0]["detail"]
    assert alerts[0]["caused_by"] == f"responses/{answer.message_id}"

    await deliver_genuine_step(rt, reader, order_id, "shipping")
    order = await rt.store.load(order_id)
    assert order.state is ProcessState.PROCESSED
    assert order.step("charge_payment").forward_key(order_id) == genuine.idempotency_key


async def test_messages_named_by_the_earlier_id_rule_are_handled_in_a_rolling_deploy(
    rt, reader, fakes, sender, at_payment
):
    """Issue 39 changed the rule for request and answer ids. During a rolling deploy an
    instance of the previous version names the payment request and its answer
    ``req:<order>:<step>:<operation>:<attempt>`` and ``rsp:...``; this version names them by
    key and attempt. The signature covers whichever MessageId a message came with, so each is
    handled; a message sent under both names arrives twice, and the second changes nothing:
    one charge, one transition, no alert."""
    order_id, request = at_payment
    body = b"".join(request.body)
    genuine = AgentRequest.model_validate_json(body)
    earlier = f"{order_id}:{genuine.step}:{genuine.operation}:{genuine.attempt}"
    payment, responses = queue(rt, "payment"), queue(rt, "responses")
    signature = signing.sign(
        rt.settings.keyring, queue=payment, message_id=f"req:{earlier}", body=body
    )
    forge(sender, payment, body, f"req:{earlier}", signature=signature)
    assert request.message_id != f"req:{earlier}"
    await on_request(
        to_function_message(take(reader, payment, f"req:{earlier}")), AGENT["payment"], rt
    )
    answer = take_for(reader, responses, order_id)
    await on_reply(to_function_message(answer), rt)
    after = await snapshot(rt, order_id)
    assert after[2] == "create_shipment"

    # The same answer as an agent of the previous version named it, and the request resent
    # under this version's name: both arrive, both change nothing.
    answered = encode(AgentResponse.model_validate_json(b"".join(answer.body)))
    signature = signing.sign(
        rt.settings.keyring, queue=responses, message_id=f"rsp:{earlier}", body=answered
    )
    forge(sender, responses, answered, f"rsp:{earlier}", signature=signature)
    await on_reply(to_function_message(take(reader, responses, f"rsp:{earlier}")), rt)
    await on_request(to_function_message(request), AGENT["payment"], rt)
    assert reader.take(responses, order_id, wait=1.0) is None  # a copy of the answer above
    assert await snapshot(rt, order_id) == after
    assert [e for e in effects(fakes, order_id) if e[0] == "payment"] == [
        ("payment", "charge", genuine.idempotency_key)
    ]
    assert all_alerts(rt, reader) == []


async def test_an_empty_body_on_an_agent_queue_is_reported(rt, reader, fakes, sender):
    inventory = queue(rt, "inventory")
    message_id = forge(sender, inventory, b"")
    ledger = len(fakes.ledger())
    await on_request(
        to_function_message(take(reader, inventory, message_id)),
        AGENT["inventory"],
        rt,
    )
    assert len(fakes.ledger()) == ledger
    alert = only_alert_for(rt, reader, inventory, message_id, "unsigned")
    assert "body is empty" in alert["detail"]


async def test_a_genuine_request_replayed_onto_another_agents_queue_is_refused(
    rt, reader, fakes, sender, at_payment
):
    """The signature covers the queue: the app's own signed request is no use elsewhere."""
    order_id, request = at_payment
    shipping = queue(rt, "shipping")
    properties = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in (request.application_properties or {}).items()
    }
    with sender.get_queue_sender(shipping) as s:
        s.send_messages(
            ServiceBusMessage(
                b"".join(request.body),
                message_id=request.message_id,
                application_properties=properties,
            )
        )
    ledger = effects(fakes, order_id)
    await on_request(
        to_function_message(take(reader, shipping, request.message_id)),
        AGENT["shipping"],
        rt,
    )
    assert effects(fakes, order_id) == ledger
    only_alert_for(rt, reader, shipping, request.message_id, "bad_signature")


async def test_key_rotation_accepts_both_keys_then_refuses_the_retired_one(env, reader, fakes):
    """Instances mid-rotation hold [new, old]; one still on [old] and one already on [new]."""
    old, new = new_key_text("old"), new_key_text("new")
    on_old = await make_runtime(env | {SIGNING_KEYS_SETTING: old}, "old")
    rotating = await make_runtime(env | {SIGNING_KEYS_SETTING: f"{new},{old}"}, "rotating")
    on_new = await make_runtime(env | {SIGNING_KEYS_SETTING: new}, "new")
    try:
        order = new_order()
        await handle_submission(encode(order), on_old)  # the request is signed with the old key
        inventory = queue(on_old, "inventory")
        request = take_for(reader, inventory, order.order_id)
        assert (request.application_properties or {})[b"signature"].startswith(b"v1.old.")
        await on_request(to_function_message(request), AGENT["inventory"], rotating)
        reply = take_for(reader, queue(on_old, "responses"), order.order_id)
        assert (reply.application_properties or {})[b"signature"].startswith(b"v1.new.")
        await on_reply(to_function_message(reply), rotating)
        assert (await rotating.store.load(order.order_id)).current_step == "charge_payment"
        payment_request = take_for(reader, queue(on_old, "payment"), order.order_id)
        assert (payment_request.application_properties or {})[b"signature"].startswith(b"v1.new.")

        responses = queue(on_old, "responses")
        # An instance that holds only the new key accepts the newest signatures (the request
        # is taken at once: its run budget counts from the claim in these tests).
        await on_request(to_function_message(payment_request), AGENT["payment"], on_new)
        await on_reply(to_function_message(take_for(reader, responses, order.order_id)), on_new)
        assert (await on_new.store.load(order.order_id)).current_step == "create_shipment"
        # ... and refuses by name what an instance still on the retired key signs (another
        # attempt's MessageId: duplicate detection would drop a copy of the genuine reply's).
        stale = Bus(
            lambda: AsyncServiceBusClient.from_connection_string(env["ServiceBusConnection"]),
            keyring=on_old.settings.keyring,
        )
        try:
            await stale.send(
                responses,
                AgentResponse.model_validate_json(
                    forged_reply(payment_request, outcome="succeeded", attempt=99)
                ),
            )
        finally:
            await stale.close()
        stale_reply = take_for(reader, responses, order.order_id)
        before = await snapshot(on_new, order.order_id)
        await on_reply(to_function_message(stale_reply), on_new)
        assert await snapshot(on_new, order.order_id) == before
        only_alert_for(on_new, reader, responses, stale_reply.message_id, "unknown_key")

    finally:
        for runtime in (on_old, rotating, on_new):
            await runtime.close()
