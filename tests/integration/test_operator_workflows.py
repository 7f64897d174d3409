"""Operator workflows against Azurite, the broker and the fakes, through the HTTP functions and
the operations the CLI calls: listing any state with filters, sorts and pages; watching an
order; restarting from a step; bulk actions; alerts that resolve; dead letters replayed (a
signed message still verifies) and purged; health."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from adapters.op_counts import COUNTS
from adapters.settings import Settings
from domain.messages import SchedulerCommand, encode
from domain.states import ProcessState
from orderctl.local import LocalOperations
from service import inbound
from service.commands import handle_command
from service.intake import handle_submission
from service.operations import orders
from service.operations.errors import InvalidRequest
from service.runtime import Runtime
from tests.integration.test_operator_api import declined_order, find_alert, sent_by_the_pattern_app
from tests.support.app import make_runtime
from tests.support.operations import OperationsApp, call, serving
from tests.support.pattern import new_order, queue, run_agent_step

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.integration,
    pytest.mark.servicebus_config("tests/integration/replay_config.json"),
]


@pytest.fixture
def env(env):
    """A step budget no test here comes near: orders are moved through their steps between operator
    calls that wait on the API, and the shared five seconds could pass on a loaded machine. No
    deadline is under test here."""
    return env | {"STEP_TIMEOUT_SECONDS": "60"}


HOUR = 3600


@pytest.fixture
async def handlers(operations, rt) -> AsyncIterator[OperationsApp]:
    """The operations app on a composition root of this test's, around its Runtime."""
    async with serving(operations, rt) as app:
        yield app


@pytest.fixture
async def ops(rt):
    operations = LocalOperations(rt)
    yield operations
    await operations.close()


async def processed_order(rt, reader, **fields) -> str:
    order = new_order(workflow="single_step", **fields)
    await handle_submission(encode(order), rt)
    await run_agent_step(rt, reader, order.order_id, "inventory")
    assert (await rt.store.load(order.order_id)).state is ProcessState.PROCESSED
    return order.order_id


async def listed(handlers, **params) -> dict:
    status, page = await call(handlers, "list_orders", params=params)
    assert status == 200, page
    return page


async def all_pages(handlers, **params) -> list[str]:
    seen, continuation = [], None
    for _ in range(20):
        page = await listed(
            handlers, **params, **({"continuation": continuation} if continuation else {})
        )
        seen += [item["order_id"] for item in page["items"]]
        continuation = page["continuation"]
        if continuation is None:
            return seen
    raise AssertionError("the listing never ended")


# ----------------------------------------------------------------------------------- orders


async def test_processed_orders_are_listed_filtered_sorted_and_paged(rt, handlers, reader):
    first = await processed_order(rt, reader, order_id="o-alpha-1")
    rt.clock.advance(2 * HOUR)  # type: ignore[attr-defined]
    second = await processed_order(rt, reader, order_id="o-beta-2")
    rt.clock.advance(60)  # type: ignore[attr-defined]
    third = await processed_order(rt, reader, order_id="o-beta-3")
    in_flight = new_order()
    await handle_submission(encode(in_flight), rt)

    COUNTS.reset()
    page = await listed(handlers, state="processed")
    assert {i["order_id"] for i in page["items"]} == {first, second, third}
    assert page["continuation"] is None and page["state"] == "Processed"
    cost = COUNTS.snapshot()
    print("list 3 Processed orders:", json.dumps(cost))
    assert cost == {"table.get": 1}, "one query of the process rows, no point reads"

    assert [
        i["order_id"] for i in (await listed(handlers, state="Processed", text="BETA"))["items"]
    ] in (
        [second, third],
        [third, second],
    )
    old = await listed(handlers, state="Processed", older_than="1h")
    assert [i["order_id"] for i in old["items"]] == [first]
    assert old["filters"] == {"older_than": "1h"}
    recent = await listed(handlers, state="Processed", newer_than="30m")
    assert {i["order_id"] for i in recent["items"]} == {second, third}
    assert (await listed(handlers, state="Processed", step="charge_payment"))["items"] == []
    by_step = await listed(handlers, state="Processed", step="reserve_inventory")
    assert [i["order_id"] for i in by_step["items"]] != []

    newest_first = await all_pages(handlers, state="Processed", sort="-created", limit="1")
    assert newest_first == [third, second, first]
    assert await all_pages(handlers, state="Processed", sort="id", limit="2") == sorted(
        [first, second, third]
    )
    by_index = await all_pages(handlers, state="Processed", limit="1")
    assert sorted(by_index) == sorted([first, second, third]) and len(by_index) == 3


async def test_in_flight_and_error_listings_filter_by_step_age_and_text(
    rt, handlers, reader, fakes
):
    errored = await declined_order(rt, reader, fakes)
    in_flight = new_order()
    await handle_submission(encode(in_flight), rt)

    page = await listed(handlers, state="Error", text="OUT_OF_STOCK")
    assert [i["order_id"] for i in page["items"]] == [errored]
    assert (await listed(handlers, state="Error", text="no such words"))["items"] == []
    assert (await listed(handlers, state="Error", step="charge_payment"))["items"] == []
    processing = await listed(
        handlers, state="Processing", step="reserve_inventory", newer_than="5m"
    )
    assert [i["order_id"] for i in processing["items"]] == [in_flight.order_id]
    assert (await listed(handlers, state="Processing", older_than="5m"))["items"] == []


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"state": "Error", "older_than": "yesterday"}, "invalid_age"),
        ({"state": "Error", "older_than": "2h", "newer_than": "1h"}, "invalid_age"),
        ({"state": "Error", "step": "teleport"}, "unknown_step"),
        ({"state": "Error", "text": "x" * 201}, "invalid_text"),
        ({"state": "Error", "sort": "price"}, "invalid_sort"),
        ({"state": "Processed", "continuation": "bm90LWEtY3Vyc29y"}, "invalid_continuation"),
    ],
)
async def test_bad_filters_are_refused_with_what_to_write(rt, handlers, params, code):
    status, answer = await call(handlers, "list_orders", params=params)
    assert (status, answer["error"]["code"]) == (400, code), answer


async def test_a_sorted_cursor_is_refused_for_another_sort(rt, handlers, reader):
    for _ in range(2):
        await processed_order(rt, reader)
    page = await listed(handlers, state="Processed", sort="created", limit="1")
    assert page["continuation"]
    status, answer = await call(
        handlers,
        "list_orders",
        params={"state": "Processed", "sort": "-created", "continuation": page["continuation"]},
    )
    assert (status, answer["error"]["code"]) == (400, "invalid_continuation")


# ------------------------------------------------------------------------------------ watch


async def test_watch_returns_each_change_and_ends_when_the_order_is_done(rt, handlers, reader):
    order = new_order(workflow="single_step")
    await handle_submission(encode(order), rt)
    route = {"order_id": order.order_id}

    status, first = await call(handlers, "watch_order", route=route, params={"wait": "5"})
    assert status == 200 and first["changed"] and not first["terminal"]
    assert [t["event"] for t in first["detail"]["timeline"]] == ["created"]

    started = time.monotonic()
    status, quiet = await call(
        handlers, "watch_order", route=route, params={"after": "0", "wait": "0.6"}
    )
    assert status == 200 and not quiet["changed"] and quiet["detail"]["timeline"] == []
    assert time.monotonic() - started >= 0.5, "it waited for a change"

    await run_agent_step(rt, reader, order.order_id, "inventory")
    status, done = await call(handlers, "watch_order", route=route, params={"after": "0"})
    assert done["changed"] and done["terminal"]
    assert [t["event"] for t in done["detail"]["timeline"]] == ["processed"]
    step = done["detail"]["steps"][0]
    assert step["requests"] == 1 and step["duration_s"] is not None and step["started_at"]

    status, bad = await call(handlers, "watch_order", route=route, params={"wait": "61"})
    assert (status, bad["error"]["code"]) == (400, "invalid_wait")
    status, missing = await call(handlers, "watch_order", route={"order_id": "o-none"})
    assert (status, missing["error"]["code"]) == (404, "order_not_found")


async def test_the_order_view_shows_each_steps_failures_and_reasons(rt, handlers, reader, fakes):
    order = new_order(workflow="single_step")
    fakes.set_profile({"default": {"fail_first_n": 1}})
    await handle_submission(encode(order), rt)
    await run_agent_step(rt, reader, order.order_id, "inventory")  # a 503 the agent retried
    status, shown = await call(handlers, "show_order", route={"order_id": order.order_id})
    assert status == 200
    step = shown["steps"][0]
    assert step["state"] == "Succeeded" and step["requests"] == 1 and step["failures"] == 0
    assert step["duration_s"] >= 0


# ---------------------------------------------------------------------------------- restart


async def test_restart_from_a_step_over_http(rt, handlers, reader, fakes):
    order_id = await declined_order(rt, reader, fakes)
    fakes.set_profile(None)
    route = {"order_id": order_id}

    status, unknown = await call(
        handlers, "restart_order", route=route, body={"step": "teleport", "reason": "r"}
    )
    assert (status, unknown["error"]["code"]) == (400, "unknown_step")
    assert "reserve_inventory, charge_payment, create_shipment" in unknown["error"]["message"]
    status, nameless = await call(handlers, "restart_order", route=route, body={"reason": "r"})
    assert (status, nameless["error"]["code"]) == (400, "invalid_step")

    status, done = await call(
        handlers,
        "restart_order",
        route=route,
        body={"step": "charge_payment", "reason": "card updated"},
        caller="ann",
    )
    assert status == 202, done
    assert (done["action"], done["outcome"], done["generation"]) == ("restart", "restarted", 2)
    assert done["step"] == "reserve_inventory", "reserve never succeeded: it is redone first"
    last = (await rt.store.get_timeline(order_id))[-1]
    assert (last.event, last.actor) == ("restarted", "operator:ann")
    assert "restart from charge_payment" in last.detail
    await sent_by_the_pattern_app(rt, reader, order_id)
    request = json.loads(reader.expect(queue(rt, "inventory"), order_id))
    assert request["idempotency_key"] == f"{order_id}:reserve_inventory:do:2"

    status, busy = await call(
        handlers,
        "restart_order",
        route=route,
        body={"step": "charge_payment", "reason": "r"},
    )
    assert (status, busy["error"]["code"]) == (409, "wrong_state")
    assert "only Error orders can be restarted" in busy["error"]["message"]


# ------------------------------------------------------------------------------------- bulk


async def test_bulk_resubmit_lists_first_then_acts_on_what_was_listed(rt, handlers, reader, fakes):
    errored = sorted([await declined_order(rt, reader, fakes) for _ in range(2)])
    fakes.set_profile(None)
    body = {"state": "Error", "text": "out_of_stock", "reason": "restocked"}

    status, preview = await call(handlers, "bulk_resubmit", body=body | {"dry_run": True})
    assert status == 200, preview
    assert sorted(i["order_id"] for i in preview["items"]) == errored
    assert {i["outcome"] for i in preview["items"]} == {"would_resubmit"}
    assert preview["acted"] == 0
    assert all([(await rt.store.load(o)).state is ProcessState.ERROR for o in errored])

    # One of them is resubmitted by someone else meanwhile: it no longer matches.
    await orders.resubmit(
        await handlers.root.context(), errored[0], operator="bob", reason="by hand"
    )
    status, done = await call(
        handlers, "bulk_resubmit", body=body | {"order_ids": errored}, caller="ann"
    )
    assert status == 200, done
    outcomes = {i["order_id"]: i["outcome"] for i in done["items"]}
    assert outcomes == {errored[0]: "skipped", errored[1]: "resubmitted"}
    assert done["acted"] == 1
    last = (await rt.store.get_timeline(errored[1]))[-1]
    assert (last.event, last.actor) == ("resubmitted", "operator:ann")

    status, empty = await call(handlers, "bulk_resubmit", body={"reason": "r"})
    assert (status, empty["error"]["code"]) == (400, "empty_filter")
    status, wrong = await call(handlers, "bulk_cancel", body={"state": "Error", "reason": "r"})
    assert (status, wrong["error"]["code"]) == (400, "invalid_state")
    status, nothing = await call(
        handlers,
        "bulk_cancel",
        body={"state": "Pending", "text": "no order has this", "reason": "r"},
    )
    assert (status, nothing["items"], nothing["more"]) == (200, [], False)


# ----------------------------------------------------------------------------------- alerts


async def test_an_alert_resolves_when_its_order_is_resubmitted_and_finishes(
    rt, handlers, reader, fakes
):
    order_id = await declined_order(rt, reader, fakes)
    seq = str((await find_alert(handlers, order_id))["sequence_number"])
    _, alert = await call(handlers, "peek_alert", route={"sequence_number": seq})
    assert (alert["resolution"], alert["order_state"]) == ("open", "Error")

    fakes.set_profile(None)
    await orders.resubmit(
        await handlers.root.context(), order_id, operator="ann", reason="restocked"
    )
    _, alert = await call(handlers, "peek_alert", route={"sequence_number": seq})
    assert alert["resolution"] == "retrying"
    assert seq in await open_alerts(handlers)
    await sent_by_the_pattern_app(rt, reader, order_id)

    for service in ("inventory", "payment", "shipping"):
        await run_agent_step(rt, reader, order_id, service)
    _, alert = await call(handlers, "peek_alert", route={"sequence_number": seq})
    assert (alert["resolution"], alert["order_state"]) == ("resolved", "Processed")
    assert seq not in await open_alerts(handlers)


async def test_an_alert_whose_order_failed_again_is_superseded(rt, handlers, reader, fakes):
    order_id = await declined_order(rt, reader, fakes)  # still declined: the profile stays
    first = str((await find_alert(handlers, order_id))["sequence_number"])
    await orders.resubmit(
        await handlers.root.context(), order_id, operator="ann", reason="try again"
    )
    await sent_by_the_pattern_app(rt, reader, order_id)
    await run_agent_step(rt, reader, order_id, "inventory")
    assert (await rt.store.load(order_id)).state is ProcessState.ERROR
    alerts = [
        a for a in await all_alerts(handlers) if (a["alert"] or {}).get("order_id") == order_id
    ]
    assert [(str(a["sequence_number"]), a["resolution"]) for a in alerts] == [
        (first, "superseded"),
        (str(alerts[1]["sequence_number"]), "open"),
    ]
    assert first not in await open_alerts(handlers)


async def all_alerts(handlers, **params) -> list[dict]:
    found, continuation = [], None
    while True:
        query = {"limit": "100"} | params | ({"continuation": continuation} if continuation else {})
        status, page = await call(handlers, "list_alerts", params=query)
        assert status == 200
        found += page["items"]
        continuation = page["continuation"]
        if continuation is None:
            return found


async def open_alerts(handlers) -> set[str]:
    return {str(a["sequence_number"]) for a in await all_alerts(handlers, open="true")}


# ----------------------------------------------------------------------------- dead letters

REPLAY_WINDOW = timedelta(seconds=2)  # the replay-commands queue's duplicate detection window


@pytest.fixture
def replay_env(env, servicebus):
    """The commands queue is one whose duplicate detection window is 2 s (replay_config.json),
    so a test can wait it out."""
    return env | {"SCHEDULER_COMMANDS_QUEUE": servicebus.queue("replay-commands")}


@pytest.fixture
async def replay_rt(replay_env, clock):
    rt = await make_runtime(replay_env, "scheduler", clock)
    yield rt
    await rt.close()


async def dead_letter(servicebus, queue_name: str, message: ServiceBusMessage) -> None:
    async with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        async with client.get_queue_sender(queue_name) as sender:
            await sender.send_messages(message)
        async with client.get_queue_receiver(queue_name, max_wait_time=5) as receiver:
            while received := await receiver.receive_messages(
                max_message_count=1, max_wait_time=30
            ):
                if received[0].message_id == message.message_id:
                    await receiver.dead_letter_message(
                        received[0], reason="MaxDeliveryCountExceeded"
                    )
                    return
                await receiver.complete_message(received[0])  # a leftover of another test
    raise AssertionError(f"{message.message_id} was sent but never received")


async def dead_letter_number(ops: LocalOperations, role: str, message_id: str) -> int:
    page = await ops.list_dead_letters(role, limit=100)
    [found] = [i for i in page.items if i.message_id == message_id]
    return found.sequence_number


async def test_a_replayed_signed_message_keeps_body_id_and_signature_and_still_verifies(
    replay_rt, servicebus, reader
):
    rt = replay_rt
    order = new_order()
    await handle_submission(encode(order), rt)
    commands = queue(rt, "commands")
    command = SchedulerCommand(
        order_id=order.order_id,
        command="retry",
        attempt=1,
        failure_count=1,
        reason="test",
        requested_by="scheduler:test",
    )
    original = rt.bus.prepare(commands, command)
    await dead_letter(servicebus, commands, original)
    ops = LocalOperations(rt, duplicate_window=REPLAY_WINDOW)
    strict = LocalOperations(rt)  # this app's queues' window: 10 minutes
    try:
        number = await dead_letter_number(ops, "commands", original.message_id)
        early = await strict.replay_dead_letters(
            "commands", operator="ann", sequence_numbers=[number], reason="retry it"
        )
        assert [(i.outcome, i.sequence_number) for i in early.items] == [("refused", number)]
        assert "duplicate detection" in early.items[0].detail
        await asyncio.sleep(REPLAY_WINDOW.total_seconds() + 0.2)

        dry = await ops.replay_dead_letters(
            "commands", operator="ann", sequence_numbers=[number], dry_run=True
        )
        assert [i.outcome for i in dry.items] == ["would_replay"] and not dry.recorded_in_log
        with pytest.raises(InvalidRequest, match="reason is required"):
            await ops.replay_dead_letters("commands", operator="ann", sequence_numbers=[number])
        done = await ops.replay_dead_letters(
            "commands", operator="ann", sequence_numbers=[number], reason="the bug is fixed"
        )
        assert done.recorded_in_log
        [item] = done.items
        assert (item.outcome, item.order_id, item.recorded_in_timeline) == (
            "replayed",
            order.order_id,
            True,
        )
        assert not [
            i
            for i in (await ops.list_dead_letters("commands")).items
            if i.sequence_number == number
        ]
    finally:
        await ops.close()

    asked = reader.take_message(commands, lambda m: m.subject == "ReplayDeadLetter")
    assert asked is not None, "the operations app asks the pattern app to send it back"
    await handle_command(b"".join(asked.body), rt)
    replayed = reader.take_message(commands, lambda m: m.message_id == original.message_id)
    assert replayed is not None
    assert replayed.message_id == original.message_id
    assert b"".join(replayed.body) == b"".join(original.body) == encode(command)
    delivery = inbound.Delivery(
        body=b"".join(replayed.body),
        message_id=replayed.message_id,
        properties=replayed.application_properties or {},
    )
    assert inbound.check(rt.settings.keyring, commands, delivery) is None, "it still verifies"
    assert "DeadLetterReason" not in str(replayed.application_properties)
    last = (await rt.store.get_timeline(order.order_id))[-1]
    assert (last.event, last.actor) == ("dead_letter_replayed", "operator:ann")
    assert original.message_id in last.detail
    assert last.detail.endswith(": the bug is fixed")


async def test_a_forged_or_altered_message_is_not_replayed_and_can_be_purged(replay_rt, servicebus):
    rt = replay_rt
    commands = queue(rt, "commands")
    order = new_order()
    await handle_submission(encode(order), rt)
    command = SchedulerCommand(
        order_id=order.order_id,
        command="retry",
        attempt=0,
        failure_count=0,
        reason="forged",
        requested_by="operator:eve",
    )
    unsigned = ServiceBusMessage(encode(command), message_id="forged-unsigned")
    genuine = rt.bus.prepare(commands, command)
    altered = ServiceBusMessage(
        encode(command).replace(b"forged", b"fooled"),
        message_id=genuine.message_id + "-x",
        application_properties=dict(genuine.application_properties or {}),
    )
    for message in (unsigned, altered):
        await dead_letter(servicebus, commands, message)
    ops = LocalOperations(rt, duplicate_window=timedelta(0))
    try:
        numbers = [
            await dead_letter_number(ops, "commands", m.message_id) for m in (unsigned, altered)
        ]
        refused = await ops.replay_dead_letters(
            "commands", operator="ann", sequence_numbers=numbers, reason="try"
        )
        assert [i.outcome for i in refused.items] == ["refused", "refused"]
        assert "unsigned" in refused.items[0].detail
        assert "bad_signature" in refused.items[1].detail
        assert all(i.order_id is None and not i.recorded_in_timeline for i in refused.items)
        still = {
            i.sequence_number for i in (await ops.list_dead_letters("commands", limit=100)).items
        }
        assert set(numbers) <= still, "refused ones stay"

        purged = await ops.purge_dead_letters(
            "commands", operator="ann", sequence_numbers=numbers, reason="forged: <b>drop</b>"
        )
        assert [i.outcome for i in purged.items] == ["purged", "purged"]
        # They name no trusted order: the dead-letter log is where the action is recorded.
        assert purged.recorded_in_log
        [logged, refusal] = (await ops.dead_letter_log(limit=5)).actions
        assert (logged.actor, logged.action, logged.queue) == ("operator:ann", "purge", "commands")
        assert logged.reason == "forged: <b>drop</b>"
        assert [(o.sequence_number, o.outcome, o.order_id) for o in logged.outcomes] == [
            (n, "purged", None) for n in sorted(numbers)
        ]
        assert (logged.messages, logged.counts) == (2, {"purged": 2})
        assert (refusal.action, refusal.reason, refusal.counts) == ("replay", "try", {"refused": 2})
        left = {
            i.sequence_number for i in (await ops.list_dead_letters("commands", limit=100)).items
        }
        assert not set(numbers) & left
        gone = await ops.purge_dead_letters(
            "commands", operator="ann", sequence_numbers=numbers, reason="again"
        )
        assert [i.outcome for i in gone.items] == ["not_found", "not_found"]
        assert [e.event for e in await rt.store.get_timeline(order.order_id)] == ["created"]
    finally:
        await ops.close()


async def test_an_empty_dead_letter_queue_has_nothing_to_replay(rt, handlers):
    status, done = await call(
        handlers,
        "replay_dead_letters",
        route={"queue": "shipping"},
        body={"all": True, "reason": "clean up"},
        caller="ann",
    )
    assert status == 200, done
    assert (done["items"], done["more"], done["entity"]) == (
        [],
        False,
        queue(rt, "shipping"),
    )
    status, vague = await call(
        handlers, "purge_dead_letters", route={"queue": "shipping"}, body={}, caller="ann"
    )
    assert (status, vague["error"]["code"]) == (400, "invalid_selection")
    for body in ({"all": True}, {"all": True, "reason": " "}):
        status, unexplained = await call(
            handlers,
            "purge_dead_letters",
            route={"queue": "shipping"},
            body=body,
            caller="ann",
        )
        assert (status, unexplained["error"]["code"]) == (400, "invalid_reason"), unexplained
    status, dry = await call(
        handlers,
        "purge_dead_letters",
        route={"queue": "shipping"},
        body={"all": True, "dry_run": True},
        caller="ann",
    )
    assert status == 200 and dry["recorded_in_log"] is False, "a dry run needs no reason"
    status, unknown = await call(
        handlers,
        "purge_dead_letters",
        route={"queue": "nowhere"},
        body={"all": True},
        caller="ann",
    )
    assert (status, unknown["error"]["code"]) == (404, "unknown_queue")
    status, nobody = await call(
        handlers,
        "replay_dead_letters",
        route={"queue": "shipping"},
        body={"all": True},
        caller=None,
    )
    assert (status, nobody["error"]["code"]) == (401, "not_signed_in")


# ----------------------------------------------------------------------------------- health


async def test_health_checks_the_table_and_the_bus(rt, handlers, env, unique_name):
    status, health = await call(handlers, "health")
    assert status == 200, health
    assert health["status"] == "ok"
    assert [c["name"] for c in health["checks"]] == ["settings", "table", "servicebus"]
    assert all(c["ok"] for c in health["checks"])

    broken = Runtime.from_settings(Settings.from_env(env | {"ORDERS_TABLE": unique_name("nope")}))
    ops = LocalOperations(broken)
    try:
        view = await ops.health()
    finally:
        await ops.close()
        await broken.close()
    table = next(c for c in view.checks if c.name == "table")
    assert view.status == "failing" and not table.ok and "does not exist" in table.detail
