"""The operator HTTP API of the operations app, called through its one HTTP function with
HttpRequest objects (as the Functions worker would, minus the host's function-key check: see
test_operations_app for the FUNCTION auth level of its binding), against Azurite, the broker
and the fakes."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from fastapi.routing import APIRoute

from adapters.op_counts import COUNTS
from domain.messages import encode
from domain.retention import acked_reason
from domain.states import ProcessState
from operator_api import http as api
from operator_api.http import router
from service.commands import handle_command
from service.intake import handle_submission
from tests.support.operations import OperationsApp, call, serving
from tests.support.pattern import (
    new_order,
    queue,
    run_agent_step,
)

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

HOSTILE_ID = "x' or PartitionKey ne '"


@pytest.fixture
async def handlers(operations, rt) -> AsyncIterator[OperationsApp]:
    """The operations app on a composition root of this test's, around its Runtime."""
    async with serving(operations, rt) as app:
        yield app


async def declined_order(rt, reader, fakes) -> str:
    """An order in Error at once: its first step is declined (nothing to undo)."""
    order = new_order()
    fakes.set_profile({"services": {"inventory": {"decline_order_ids": [order.order_id]}}})
    await handle_submission(encode(order), rt)
    await run_agent_step(rt, reader, order.order_id, "inventory")
    assert (await rt.store.load(order.order_id)).state is ProcessState.ERROR
    return order.order_id


async def sent_by_the_pattern_app(rt, reader, order_id: str) -> None:
    """What an operator's action wrote is sent by the pattern app: the operations app put one
    SendOwed on the commands queue (and nothing anywhere else), which the commands trigger takes."""
    asked = reader.expect(queue(rt, "commands"), order_id)
    assert json.loads(asked)["type"] == "SendOwed"
    await handle_command(asked, rt)


# ----------------------------------------------------------------------------------- orders


async def test_list_error_orders_page_by_page(rt, handlers, reader, fakes):
    errored = {await declined_order(rt, reader, fakes) for _ in range(3)}
    in_flight = new_order()
    await handle_submission(encode(in_flight), rt)  # claimed; its agent never answers

    seen, pages, continuation = [], 0, None
    while True:
        params = {"state": "Error", "limit": "1"}
        if continuation is not None:
            params["continuation"] = continuation
        status, page = await call(handlers, "list_orders", params=params)
        assert status == 200 and len(page["items"]) <= 1
        seen += [item["order_id"] for item in page["items"]]
        pages += 1
        continuation = page["continuation"]
        if continuation is None:
            break
    assert set(seen) == errored and len(seen) == 3 and pages <= 4

    COUNTS.reset()
    status, page = await call(handlers, "list_orders", params={"state": "error"})
    cost = COUNTS.snapshot()
    assert {i["order_id"] for i in page["items"]} == errored
    print("list 3 Error orders:", json.dumps(cost))
    assert cost == {"table.get": 4}, "one index query and one point read per order"

    status, page = await call(handlers, "list_orders", params={"state": "processing"})
    assert [i["order_id"] for i in page["items"]] == [in_flight.order_id]
    assert page["items"][0]["current_step"] == "reserve_inventory"
    status, page = await call(handlers, "list_orders", params={"state": "Pending"})
    assert (status, page["items"]) == (200, [])


async def test_show_order_with_steps_and_a_paged_timeline(rt, handlers, reader, fakes):
    order_id = await declined_order(rt, reader, fakes)
    status, shown = await call(handlers, "show_order", route={"order_id": order_id})
    assert status == 200
    assert shown["order"]["state"] == "Error" and shown["submitted"]["order_id"] == order_id
    assert [(s["state"], s["generation"], s["attempt"]) for s in shown["steps"]] == [
        ("Failed", 1, 1),
        ("Pending", 0, 0),
        ("Pending", 0, 0),
    ]
    assert shown["order"]["compensation_cause"] == "step_declined"
    # Created already claimed for its first step: no separate claim.
    assert [t["event"] for t in shown["timeline"]] == ["created", "error"]
    assert shown["timeline_continuation"] is None

    _, first = await call(
        handlers,
        "show_order",
        route={"order_id": order_id},
        params={"timeline_limit": "1"},
    )
    assert [t["seq"] for t in first["timeline"]] == [0]
    _, rest = await call(
        handlers,
        "show_order",
        route={"order_id": order_id},
        params={"timeline_after": str(first["timeline_continuation"])},
    )
    assert [t["seq"] for t in rest["timeline"]] == [1]
    assert rest["timeline_continuation"] is None


async def test_resubmit_and_cancel_over_http(rt, handlers, reader, fakes):
    order_id = await declined_order(rt, reader, fakes)
    fakes.set_profile(None)
    status, done = await call(
        handlers,
        "resubmit_order",
        route={"order_id": order_id},
        body={"reason": "stock arrived"},
        headers={"X-MS-CLIENT-PRINCIPAL-NAME": "ann@example.com"},
    )
    assert status == 202, done
    assert (done["outcome"], done["generation"]) == ("resubmitted", 2)
    assert done["requested_by"] == "operator:ann@example.com"
    assert reader.take(queue(rt, "inventory"), order_id, wait=0.5) is None, "nothing sent yet"
    await sent_by_the_pattern_app(rt, reader, order_id)
    request = json.loads(reader.expect(queue(rt, "inventory"), order_id))
    assert request["idempotency_key"] == f"{order_id}:reserve_inventory:do:2"

    status, cancelled = await call(
        handlers,
        "cancel_order",
        route={"order_id": order_id},
        # The body's operator is the sender's claim; the platform's caller is recorded.
        body={"operator": "mallory", "reason": "customer changed their mind"},
        caller="bob",
    )
    # Cancel acts at once: the step in flight may have taken effect, so it is undone.
    assert (status, cancelled["outcome"], cancelled["state"]) == (
        202,
        "compensating",
        "Compensating",
    )
    assert (cancelled["step"], cancelled["generation"]) == ("reserve_inventory", 2)
    await sent_by_the_pattern_app(rt, reader, order_id)
    undo = json.loads(reader.expect(queue(rt, "inventory"), order_id))
    assert undo["operation"] == "undo"
    assert undo["undoes"] == f"{order_id}:reserve_inventory:do:2"
    timeline = await rt.store.get_timeline(order_id)
    assert [(t.event, t.actor) for t in timeline if t.actor.startswith("operator:")] == [
        ("resubmitted", "operator:ann@example.com"),
        ("compensation_started", "operator:bob"),
    ]
    assert "mallory" not in json.dumps([(t.actor, t.detail) for t in timeline])
    _, shown = await call(handlers, "show_order", route={"order_id": order_id})
    assert shown["order"]["compensation_cause"] == "cancelled"
    assert "operator:bob" in shown["order"]["compensation_reason"]
    inventory = shown["steps"][0]
    assert (inventory["state"], inventory["generation"], inventory["attempt"]) == (
        "Running",
        2,
        2,
    ), "the redone step counts its requests afresh: do, then undo"
    status, again = await call(
        handlers,
        "cancel_order",
        route={"order_id": order_id},
        body={"operator": "bob", "reason": "twice"},
    )
    assert status == 409 and "already being undone" in again["error"]["message"]
    status, refused = await call(
        handlers,
        "resubmit_order",
        route={"order_id": order_id},
        body={"operator": "bob", "reason": "again"},
    )
    assert status == 409 and refused["error"]["code"] == "wrong_state"
    assert "only Error orders" in refused["error"]["message"]


async def test_an_action_without_a_signed_in_caller_is_refused_and_changes_nothing(
    rt, handlers, reader, fakes
):
    order_id = await declined_order(rt, reader, fakes)
    before = await rt.store.load(order_id)
    for name in ("resubmit_order", "cancel_order"):
        status, refused = await call(
            handlers,
            name,
            route={"order_id": order_id},
            body={"operator": "mallory", "reason": "trust me"},
            caller=None,
        )
        assert (status, refused["error"]["code"]) == (401, "not_signed_in")
        assert "X-MS-CLIENT-PRINCIPAL-NAME" in refused["error"]["message"]
    after = await rt.store.load(order_id)
    assert (after.etag, after.state, after.generation) == (
        before.etag,
        before.state,
        before.generation,
    )


@pytest.mark.parametrize(
    ("name", "params", "route", "body", "status", "code"),
    [
        ("list_orders", {}, {}, None, 400, "invalid_request"),
        ("list_orders", {"state": "Lost"}, {}, None, 400, "invalid_state"),
        ("list_orders", {"state": "Error", "sort": "x"}, {}, None, 400, "invalid_sort"),
        ("list_orders", {"state": "Error", "limit": "0"}, {}, None, 400, "invalid_limit"),
        (
            "list_orders",
            {"state": "Error", "limit": "x"},
            {},
            None,
            400,
            "invalid_request",
        ),
        (
            "list_orders",
            {"state": "Error", "continuation": "bm90LWEtY3Vyc29y"},
            {},
            None,
            400,
            "invalid_continuation",
        ),
        ("show_order", {}, {"order_id": "o-missing"}, None, 404, "order_not_found"),
        ("show_order", {}, {"order_id": HOSTILE_ID}, None, 400, "invalid_order_id"),
        ("show_order", {}, {"order_id": "x" * 65}, None, 400, "invalid_order_id"),
        (
            "show_order",
            {"timeline_limit": "5000"},
            {"order_id": "o-1"},
            None,
            400,
            "invalid_limit",
        ),
        (
            "cancel_order",
            {},
            {"order_id": HOSTILE_ID},
            {"operator": "a", "reason": "r"},
            400,
            "invalid_order_id",
        ),
        (
            "cancel_order",
            {},
            {"order_id": "o-missing"},
            {"operator": "a", "reason": "r"},
            404,
            "order_not_found",
        ),
        ("cancel_order", {}, {"order_id": "o-1"}, b"{not json", 400, "invalid_json"),
        ("cancel_order", {}, {"order_id": "o-1"}, b"[1, 2]", 400, "invalid_json"),
        ("cancel_order", {}, {"order_id": "o-1"}, b'{"reason": "\xff"}', 400, "invalid_json"),
        ("cancel_order", {}, {"order_id": "o-1"}, b"[" * 5000 + b"]" * 5000, 400, "invalid_json"),
        (
            "cancel_order",
            {},
            {"order_id": "o-1"},
            {"operator": "a", "reason": "r", "force": True},
            400,
            "invalid_request",
        ),
        (
            "cancel_order",
            {},
            {"order_id": "o-1"},
            {"operator": "a"},
            400,
            "invalid_reason",
        ),
        (
            "cancel_order",
            {},
            {"order_id": "o-1"},
            {"operator": 7, "reason": "r"},
            400,
            "invalid_request",
        ),
        ("resubmit_order", {}, {"order_id": "o-1"}, b"x" * 20_000, 413, "body_too_large"),
        (
            "peek_alert",
            {},
            {"sequence_number": "abc"},
            None,
            400,
            "invalid_sequence_number",
        ),
        ("peek_alert", {}, {"sequence_number": "0"}, None, 400, "invalid_sequence_number"),
        (
            "acknowledge_alert",
            {},
            {"sequence_number": "1"},
            {"operator": "a", "x": 1},
            400,
            "invalid_request",
        ),
        ("list_alerts", {"continuation": "-5"}, {}, None, 400, "invalid_continuation"),
        (
            "list_dead_letters",
            {},
            {"queue": "orders-$DeadLetterQueue"},
            None,
            404,
            "unknown_queue",
        ),
        ("dead_letter_log", {"limit": "0"}, {}, None, 400, "invalid_limit"),
        ("dead_letter_log", {"limit": "101"}, {}, None, 400, "invalid_limit"),
        ("dead_letter_log", {"limit": "ten"}, {}, None, 400, "invalid_request"),
        (
            "list_dead_letters",
            {"limit": "101"},
            {"queue": "orders"},
            None,
            400,
            "invalid_limit",
        ),
    ],
)
async def test_bad_requests_get_a_clear_4xx(rt, handlers, name, params, route, body, status, code):
    COUNTS.reset()
    got, answer = await call(handlers, name, params=params, route=route, body=body)
    assert (got, answer["error"]["code"]) == (status, code), answer
    assert set(answer) == {"error"} and answer["error"]["message"]
    if code in ("invalid_order_id", "invalid_json", "invalid_operator"):
        assert not any(k.startswith("table.") for k in COUNTS.snapshot()), "refused before I/O"


async def test_a_principal_that_is_not_a_valid_name_is_refused_before_io(rt, handlers):
    COUNTS.reset()
    status, answer = await call(
        handlers,
        "cancel_order",
        route={"order_id": "o-1"},
        body={"reason": "r"},
        caller="a b'; drop",
    )
    assert (status, answer["error"]["code"]) == (400, "invalid_operator")
    assert not any(k.startswith("table.") for k in COUNTS.snapshot())


async def test_a_purge_without_a_signed_in_caller_is_refused(rt, handlers):
    status, answer = await call(handlers, "purge", body={"dry_run": True}, caller=None)
    assert (status, answer["error"]["code"]) == (401, "not_signed_in")


async def test_a_hostile_id_is_named_in_the_message_and_touches_nothing(rt, handlers):
    status, answer = await call(handlers, "show_order", route={"order_id": HOSTILE_ID})
    assert status == 400
    assert "order id" in answer["error"]["message"] and '"\'"' in answer["error"]["message"]


async def test_hostile_text_in_an_answer_is_json_that_a_browser_never_sniffs(rt, handlers):
    """Echoed by a refused order id (400), and by the path nothing serves (404: the worker's
    ASGI bridge decodes %2F, so an id with a slash is two path segments)."""
    for hostile, status in (("<img src=x onerror=alert(1)>", 400), ("<script>x</script>", 404)):
        url = handlers.url("show_order", {"order_id": hostile})
        caller = {api.PRINCIPAL_HEADER: "ops@example.com"}
        response = await handlers.request("GET", url, headers=caller)
        assert response.status_code == status and hostile in response.get_body().decode()
        assert response.mimetype == "application/json"
        assert response.headers["X-Content-Type-Options"] == "nosniff"


async def test_a_continuation_of_one_state_is_refused_for_another(rt, handlers, reader, fakes):
    for _ in range(2):
        await declined_order(rt, reader, fakes)
    _, page = await call(handlers, "list_orders", params={"state": "Error", "limit": "1"})
    assert page["continuation"]
    status, answer = await call(
        handlers,
        "list_orders",
        params={"state": "Pending", "continuation": page["continuation"]},
    )
    assert (status, answer["error"]["code"]) == (400, "invalid_continuation")


# ----------------------------------------------------------------------------------- alerts


async def find_alert(handlers, order_id: str) -> dict:
    continuation = None
    while True:
        params = {"limit": "100"} | ({"continuation": continuation} if continuation else {})
        status, page = await call(handlers, "list_alerts", params=params)
        assert status == 200
        for item in page["items"]:
            if (item["alert"] or {}).get("order_id") == order_id:
                return item
        continuation = page["continuation"]
        if continuation is None:
            raise AssertionError(f"no alert for {order_id}")


async def test_alerts_are_listed_peeked_and_acknowledged(rt, handlers, reader, fakes):
    first = await declined_order(rt, reader, fakes)
    second = await declined_order(rt, reader, fakes)
    alert_a, alert_b = await find_alert(handlers, first), await find_alert(handlers, second)
    assert alert_a["alert"]["reason"] == "step_declined"
    assert alert_b["sequence_number"] > alert_a["sequence_number"]

    seq_b = str(alert_b["sequence_number"])
    status, peeked = await call(handlers, "peek_alert", route={"sequence_number": seq_b})
    assert (status, peeked) == (200, alert_b)

    # No reason: refused, and the alert stays.
    for body in ({}, {"reason": "   "}):
        status, refused = await call(
            handlers,
            "acknowledge_alert",
            route={"sequence_number": seq_b},
            body=body,
            caller="ann",
        )
        assert (status, refused["error"]["code"]) == (400, "invalid_reason"), refused
        assert "reason is required" in refused["error"]["message"]
    assert (await call(handlers, "peek_alert", route={"sequence_number": seq_b}))[0] == 200

    # B first: everything received ahead of it (A included) is deferred, not abandoned...
    status, ack = await call(
        handlers,
        "acknowledge_alert",
        route={"sequence_number": seq_b},
        body={"reason": "customer called, new card on file"},
        caller="ann",
    )
    assert status == 200
    assert (ack["order_id"], ack["acknowledged_by"], ack["recorded_in_timeline"]) == (
        second,
        "operator:ann",
        True,
    )
    status, gone = await call(handlers, "peek_alert", route={"sequence_number": seq_b})
    assert (status, gone["error"]["code"]) == (404, "alert_not_found")
    status, again = await call(
        handlers,
        "acknowledge_alert",
        route={"sequence_number": seq_b},
        body={"reason": "r"},
        caller="ann",
    )
    assert (status, again["error"]["code"]) == (404, "alert_not_found")

    # ...so A is still listed, and acknowledged by its sequence number in one step.
    assert await find_alert(handlers, first) == alert_a
    seq_a = str(alert_a["sequence_number"])
    status, ack = await call(
        handlers,
        "acknowledge_alert",
        route={"sequence_number": seq_a},
        body={"reason": "seen"},
        caller="ann",
    )
    assert status == 200 and ack["order_id"] == first
    with pytest.raises(AssertionError):
        await find_alert(handlers, first)
    acked = [t for t in await rt.store.get_timeline(first) if t.event == "alert_acknowledged"]
    assert [t.actor for t in acked] == ["operator:ann"]
    assert acked[0].to_state is ProcessState.ERROR, "acknowledging changes nothing else"
    assert acked[0].detail.endswith("acknowledged: seen")
    assert acked_reason(acked[0]) == "step_declined"  # retention still reads the alert's reason
    timeline = await rt.store.get_timeline(second)
    [acked_b] = [t for t in timeline if t.event == "alert_acknowledged"]
    assert acked_b.detail.endswith(": customer called, new card on file")


# ----------------------------------------------------------------------------- dead letters


async def test_dead_letters_per_queue(rt, handlers, servicebus):
    status, summary = await call(handlers, "dead_letter_summary")
    assert status == 200
    assert {q["queue"] for q in summary["queues"]} == set(rt.settings.queues)

    orders = queue(rt, "orders")  # nothing consumes it in these tests: handlers are called
    async with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        async with client.get_queue_sender(orders) as sender:
            poison = ServiceBusMessage(b'{"type": "Nonsense"}', message_id="poison-1")
            await sender.send_messages(poison)
        async with client.get_queue_receiver(orders, max_wait_time=5) as receiver:
            await dead_letter_one(receiver, "poison-1", error_description="type is not known")

    status, page = await call(handlers, "list_dead_letters", route={"queue": "orders"})
    assert status == 200 and page["entity"] == orders
    poison = [item for item in page["items"] if item["message_id"] == "poison-1"]
    assert len(poison) == 1
    assert (poison[0]["reason"], poison[0]["description"]) == ("SchemaInvalid", "type is not known")
    assert poison[0]["body"] == {"type": "Nonsense"}
    _, summary = await call(handlers, "dead_letter_summary")
    counts = {q["queue"]: q["count"] for q in summary["queues"]}
    assert counts["orders"] >= 1


async def dead_letter_one(receiver, message_id: str, **details: str) -> None:  # type: ignore[no-untyped-def]
    """Dead-letter the message ``message_id`` (SchemaInvalid); complete what earlier tests left
    on the queue before it (this worker's tests share it)."""
    while received := await receiver.receive_messages(max_message_count=1, max_wait_time=30):
        if received[0].message_id == message_id:
            await receiver.dead_letter_message(received[0], reason="SchemaInvalid", **details)
            return
        await receiver.complete_message(received[0])
    raise AssertionError(f"{message_id} was sent but never received")


async def dead_letter(rt, handlers, servicebus, body: bytes, message_id: str) -> int:
    """Put a message on the orders dead-letter queue; its sequence number there."""
    orders = queue(rt, "orders")  # nothing consumes it in these tests: handlers are called
    async with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        async with client.get_queue_sender(orders) as sender:
            await sender.send_messages(ServiceBusMessage(body, message_id=message_id))
        async with client.get_queue_receiver(orders, max_wait_time=5) as receiver:
            await dead_letter_one(receiver, message_id)
    _, page = await call(handlers, "list_dead_letters", route={"queue": "orders"},
                   params={"limit": "100"})  # fmt: skip
    [number] = [i["sequence_number"] for i in page["items"] if i["message_id"] == message_id]
    return number


async def test_the_dead_letter_log_lists_replays_and_purges_with_their_reason(
    rt, handlers, servicebus, unique_name
):
    message_id = unique_name("poison")
    number = await dead_letter(rt, handlers, servicebus, b"{not json", message_id)
    status, empty = await call(handlers, "dead_letter_log")
    assert (status, empty) == (200, {"actions": []})

    act = {"sequence_numbers": [number], "reason": "intake fixed"}
    status, dry = await call(
        handlers, "replay_dead_letters", route={"queue": "orders"},
        body=act | {"dry_run": True}, caller="ann",
    )  # fmt: skip
    assert status == 200 and not dry["recorded_in_log"]
    status, replayed = await call(
        handlers, "replay_dead_letters", route={"queue": "orders"}, body=act, caller="ann"
    )
    # First sent less than 10 minutes ago: a replay would be dropped as a duplicate. Refused,
    # and the refusal is logged all the same.
    assert status == 200 and [i["outcome"] for i in replayed["items"]] == ["refused"]
    rt.clock.advance(1)  # type: ignore[attr-defined]
    reason = "not JSON: <b>drop</b> [red]it[/]"
    status, purged = await call(
        handlers, "purge_dead_letters", route={"queue": "orders"},
        body={"sequence_numbers": [number], "reason": reason}, caller="bob",
    )  # fmt: skip
    assert status == 200 and purged["recorded_in_log"]

    status, log = await call(handlers, "dead_letter_log", params={"limit": "5"})
    assert status == 200, log
    newest, oldest = log["actions"]  # the dry run is not logged
    assert (newest["actor"], newest["action"], newest["queue"], newest["reason"]) == (
        "operator:bob", "purge", "orders", reason
    )  # fmt: skip
    assert (newest["messages"], newest["counts"], newest["truncated"]) == (1, {"purged": 1}, False)
    assert newest["outcomes"] == [
        {"sequence_number": number, "message_id": message_id, "order_id": None,
         "outcome": "purged"}
    ]  # fmt: skip
    assert (oldest["actor"], oldest["action"], oldest["reason"]) == (
        "operator:ann", "replay", "intake fixed"
    )  # fmt: skip
    assert oldest["counts"] == {"refused": 1} and oldest["at"] < newest["at"]
    COUNTS.reset()
    started = time.perf_counter()
    _, one = await call(handlers, "dead_letter_log", params={"limit": "1"})
    took = time.perf_counter() - started
    assert one["actions"] == [newest]
    print(f"dead-letter log, 1 of 2 actions: {took * 1000:.1f} ms, {COUNTS.snapshot()}")
    assert COUNTS.snapshot() == {"table.get": 1}, "one query of one partition"
    COUNTS.reset()
    status, refused = await call(handlers, "dead_letter_log", params={"limit": "500"})
    assert (status, refused["error"]["code"]) == (400, "invalid_limit")
    assert "from 1 to 100" in refused["error"]["message"]
    assert not COUNTS.snapshot(), "refused before I/O"


# ---------------------------------------------------------------------------------- openapi


async def test_the_openapi_document_describes_every_route(rt, handlers):
    """Every route of the operator API (the dashboard's pages and files are not part of it)."""
    status, document = await call(handlers, "openapi")
    assert status == 200 and document["openapi"] == "3.1.0"
    routes = {
        (route.path, method.lower())
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }
    assert len(routes) == 22
    described = {(path, method) for path, item in document["paths"].items() for method in item}
    assert routes == described
    text = json.dumps(document)
    for ref in set(re.findall(r'"#/components/schemas/([^"]+)"', text)):
        assert ref in document["components"]["schemas"], f"dangling $ref {ref}"
    assert document["components"]["securitySchemes"]["functionKeyHeader"]["name"] == (
        "x-functions-key"
    )


async def test_the_supervisor_view_shows_lag_leases_and_the_bound(rt, handlers):
    from service.sweep import run_tick

    report = await run_tick(rt)
    status, view = await call(handlers, "show_supervisor")

    assert status == 200
    assert len(view["buckets"]) == 16
    assert view["holders"] == {rt.instance_id: report.held} and report.held == 16
    assert view["unswept_buckets"] == [] and view["oldest_sweep_s"] is not None
    assert all(b["swept_by"] == rt.instance_id for b in view["buckets"])
    bound = view["bound"]
    assert bound["detection_s"] == bound["period_s"] * 2 + bound["budget_s"] + bound["skew_s"]
    assert bound["lease_s"] == bound["period_s"] * 1.5


# ----------------------------------------------------------------------------------- purge

DAY = 24 * 3600


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        ({"state": "Processing"}, "invalid_request", "state: Input should be 'Processed'"),
        ({"older_than_days": 0}, "invalid_request", "older_than_days: Input should be greater"),
        ({"older_than_days": "7"}, "invalid_request", "older_than_days: Input should be a valid"),
        ({"dry_run": "yes"}, "invalid_request", "dry_run: Input should be a valid boolean"),
        ({"limit": 10_001}, "invalid_request", "limit: Input should be less than or equal"),
        ({"olderThan": 3}, "invalid_request", "olderThan: Extra inputs are not permitted"),
    ],
)
async def test_a_bad_purge_request_is_refused_with_what_to_fix(rt, handlers, body, code, message):
    status, answer = await call(handlers, "purge", body=body, caller="ann")
    assert status == 400, answer
    assert answer["error"]["code"] == code
    assert message in answer["error"]["message"]


async def test_purge_archives_and_deletes_finished_orders_and_records_the_run(
    rt, handlers, reader, fakes
):
    done = new_order(workflow="single_step")
    await handle_submission(encode(done), rt)
    await run_agent_step(rt, reader, done.order_id, "inventory")
    assert (await rt.store.load(done.order_id)).state is ProcessState.PROCESSED
    resolved, unresolved = (
        await declined_order(rt, reader, fakes),
        await declined_order(rt, reader, fakes),
    )
    seq = str((await find_alert(handlers, resolved))["sequence_number"])
    status, _ = await call(
        handlers,
        "acknowledge_alert",
        route={"sequence_number": seq},
        body={"reason": "done"},
        caller="ann",
    )
    assert status == 200
    in_flight = new_order()
    await handle_submission(encode(in_flight), rt)
    rt.clock.advance(31 * DAY)  # type: ignore[attr-defined]

    status, dry = await call(handlers, "purge", body={"dry_run": True}, caller="ann")
    assert status == 200, dry
    assert (dry["dry_run"], dry["purgeable"], dry["purged"], dry["archived"]) == (True, 2, 0, 0)
    assert dry["kept"] == {"unresolved_error": 1}
    assert dry["requested_by"] == "operator:ann" and dry["older_than_days"] == 30

    status, run = await call(handlers, "purge", body={"state": "all"}, caller="ann")
    assert status == 200, run
    assert (run["purged"], run["archived"], run["skipped_changed"]) == (2, 2, 0)
    for gone in (done.order_id, resolved):
        status, answer = await call(handlers, "show_order", route={"order_id": gone})
        assert (status, answer["error"]["code"]) == (404, "order_not_found")
    assert (await rt.store.load(unresolved)).state is ProcessState.ERROR
    assert (await rt.store.load(in_flight.order_id)).state is ProcessState.PROCESSING

    status, runs = await call(handlers, "list_purge_runs")
    assert status == 200
    assert [r["run_id"] for r in runs["runs"]] == [run["run_id"]], "dry runs are not recorded"

    status, back = await call(handlers, "show_archived_order", route={"order_id": resolved})
    assert status == 200, back
    assert back["order"]["order"]["state"] == "Error" and back["copies"] == 1
    events = [t["event"] for t in back["order"]["timeline"]]
    assert events[-1] == "alert_acknowledged"
    assert back["run_id"] == run["run_id"]
    status, back = await call(
        handlers,
        "show_archived_order",
        route={"order_id": done.order_id},
        params={"day": rt.clock().date().isoformat()},
    )
    assert (status, back["order"]["submitted"]["order_id"]) == (200, done.order_id)

    status, missing = await call(handlers, "show_archived_order", route={"order_id": unresolved})
    assert (status, missing["error"]["code"]) == (404, "not_archived")
    status, bad = await call(handlers, "show_archived_order", route={"order_id": HOSTILE_ID})
    assert (status, bad["error"]["code"]) == (400, "invalid_order_id")
    status, bad = await call(
        handlers, "show_archived_order", route={"order_id": "o-1"}, params={"day": "2025-13-01"}
    )
    assert (status, bad["error"]["code"]) == (400, "invalid_day")
