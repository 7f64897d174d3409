"""The same `orderctl` operator commands against the local stack in process and, in remote mode
(`--api-url`), against a local functions host serving the operations app (the operator HTTP
API): each command's
outcome is the same, and its --json document has the same shape (the same models, read back
from the API's JSON).

Both backends see the same Azurite tables and broker queues: the in-process one through a
stack.json naming them (as `orderctl up` writes it), the remote one through the host, whose
functions use a Runtime like the test's (on the host's own event loop). The host names its
callers `remote-op` (DEVHOST_PRINCIPAL_NAME, as App Service Authentication would).

Each `orderctl` command runs its own event loop (``asyncio.run`` at its edge), so the tests,
which await the store on theirs, run each command on a thread of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from typer.testing import CliRunner

from devstack.host import LocalHost
from devstack.stack.local_stack import STATE_FILE, base_settings
from domain.messages import encode
from domain.states import ProcessState
from orderctl import cli
from orderctl.local import LocalOperations
from orderctl.options import OPERATOR
from orderctl.output import validate
from service.intake import handle_submission
from tests.support.app import operations_app
from tests.support.pattern import new_order, queue, run_agent_step

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture
def env(env):
    """A step budget no test here comes near: orders are moved through their steps between operator
    commands, and the shared five seconds could pass on a loaded machine. No deadline is under
    test here."""
    return env | {"STEP_TIMEOUT_SECONDS": "60"}


PRINCIPAL = "remote-op"
BACKENDS = ["local", "remote"]
runner = CliRunner()


def start_host(settings: dict[str, str], rt) -> LocalHost:  # type: ignore[no-untyped-def]
    """A functions host serving the operations app, on a free port, on a composition root of
    its own (its Runtime like ``rt``), closed on the host's loop when it stops."""
    app, root = operations_app(rt)
    host = LocalHost(app, settings=settings, host_json=None, http_port=0)
    host.at_stop(root.close)
    return host.start()


@pytest.fixture(autouse=True)
def no_remote_environment(monkeypatch):
    """The in-process runs must not be sent elsewhere by a developer's environment."""
    for name in ("ORDERCTL_API_URL", "ORDERCTL_FUNCTION_KEY", "ORDERCTL_AUTH", "ORDERCTL_SCOPE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def host(rt) -> Iterator[LocalHost]:
    """The operator HTTP API on a host of its own for each test (an HTTP-only host starts in
    a moment), so that its Runtime is this test's."""
    local = start_host({"DEVHOST_PRINCIPAL_NAME": PRINCIPAL}, rt)
    yield local
    local.stop(timeout=2)


@pytest.fixture
def workdir(tmp_path: Path, env: dict[str, str]) -> Path:
    """A stack.json as `orderctl up` writes it, naming this test's tables and queues; its
    supervisor is this process, so `orderctl` sees a running stack."""
    document = {
        "settings": base_settings() | env,
        "fakes_url": "",
        "pids": {},
        "api_url": "",
        "logs": {},
        "supervisor_pid": os.getpid(),
        "restarts": {},
        "persistent": False,
    }
    (tmp_path / STATE_FILE).write_text(json.dumps(document))
    return tmp_path


class Orderctl:
    """Runs `orderctl` against one backend: in process (``--workdir``) or remote
    (``--api-url`` of the host)."""

    def __init__(self, backend: str, workdir: Path, api_url: str) -> None:
        self.backend = backend
        self.workdir = workdir
        self.api_url = api_url

    @property
    def actor(self) -> str:
        return f"operator:{PRINCIPAL if self.backend == 'remote' else OPERATOR}"

    async def __call__(self, *args: str, input: str | None = None) -> Any:
        if self.backend == "remote":
            argv = ["--api-url", self.api_url, *args]
        else:
            argv = [*args, "--workdir", str(self.workdir)]
        return await invoke(argv, input=input)

    async def json(self, *args: str, exit_code: int = 0) -> dict:
        """The command's one --json document, checked against its documented shape."""
        result = await self(*args, "--json")
        assert result.exit_code == exit_code, result.output
        document = json.loads(result.stdout)
        value = validate(args[0], document)
        assert value.model_dump(mode="json") == document
        return document


async def invoke(argv: list[str], input: str | None = None) -> Any:
    """`orderctl` as the command it is (its event loop on a thread of its own)."""
    return await asyncio.to_thread(
        runner.invoke, cli.app, argv, input=input, catch_exceptions=False
    )


@pytest.fixture(params=BACKENDS)
def orderctl(request, host, workdir) -> Orderctl:
    return Orderctl(request.param, workdir, host.http.base_url)


@pytest.fixture
def both(host, workdir) -> dict[str, Orderctl]:
    return {b: Orderctl(b, workdir, host.http.base_url) for b in BACKENDS}


async def declined(rt, reader, fakes, order_id: str | None = None) -> str:  # type: ignore[no-untyped-def]
    """An order in Error at once: its first step is declined (nothing to undo)."""
    order = new_order(**({"order_id": order_id} if order_id else {}))
    fakes.set_profile({"services": {"inventory": {"decline_order_ids": [order.order_id]}}})
    await handle_submission(encode(order), rt)
    await run_agent_step(rt, reader, order.order_id, "inventory")
    assert (await rt.store.load(order.order_id)).state is ProcessState.ERROR
    fakes.set_profile(None)
    return order.order_id


async def drain(servicebus, queue_name: str) -> None:  # type: ignore[no-untyped-def]
    """Take every message left on a queue by earlier tests (alerts are listed by peeking)."""
    async with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        async with client.get_queue_receiver(queue_name, max_wait_time=1) as receiver:
            while batch := await receiver.receive_messages(max_message_count=50, max_wait_time=1):
                for message in batch:
                    await receiver.complete_message(message)


def shape(document: Any) -> Any:
    """A document's structure: the keys of every object, the shape of every list item, the
    JSON type of every value."""
    if isinstance(document, dict):
        return {key: shape(value) for key, value in document.items()}
    if isinstance(document, list):
        return [shape(value) for value in document]
    return type(document).__name__


# ---------------------------------------------------------------------- each backend alone


async def test_status_and_orders(orderctl, rt, reader, fakes):
    order_id = await declined(rt, reader, fakes)
    detail = await orderctl.json("status", order_id)
    assert detail["order"]["order_id"] == order_id and detail["order"]["state"] == "Error"
    assert detail["steps"][0]["name"] == "reserve_inventory"

    page = await orderctl.json("orders", "Error", "--text", order_id, "--sort", "-created")
    assert [o["order_id"] for o in page["items"]] == [order_id]
    assert page["filters"] == {"text": order_id} and page["sort"] == "-created"

    shown = await orderctl("status", order_id)
    assert shown.exit_code == 0 and order_id in shown.stdout and "timeline" in shown.stdout

    watched = await orderctl("status", order_id, "--watch", "--json")
    assert watched.exit_code == 3, "the order ended in Error"
    [line] = watched.stdout.splitlines()
    assert json.loads(line)["terminal"] is True

    missing = await orderctl("status", "o-nowhere")
    assert missing.exit_code == 2
    assert missing.stderr.strip() == "error: order o-nowhere does not exist (order_not_found)"


async def test_alerts_open_then_ack(orderctl, rt, reader, fakes, servicebus):
    await drain(servicebus, queue(rt, "alerts"))
    order_id = await declined(rt, reader, fakes)
    page = await orderctl.json("alerts", "--open", "--limit", "100")
    [alert] = [i for i in page["items"] if (i["alert"] or {}).get("order_id") == order_id]
    assert alert["resolution"] == "open" and page["open_only"] is True

    unexplained = await orderctl("ack", str(alert["sequence_number"]))
    assert unexplained.exit_code == 2 and "(invalid_reason)" in unexplained.stderr
    done = await orderctl.json("ack", str(alert["sequence_number"]), "--reason", "refund issued")
    assert done["order_id"] == order_id and done["recorded_in_timeline"] is True
    assert done["acknowledged_by"] == orderctl.actor
    left = await orderctl.json("alerts", "--open", "--limit", "100")
    assert order_id not in {(i["alert"] or {}).get("order_id") for i in left["items"]}


async def test_resubmit_and_restart_from_a_step(orderctl, rt, reader, fakes):
    first, second = await declined(rt, reader, fakes), await declined(rt, reader, fakes)
    done = await orderctl.json("resubmit", first, "--reason", "restocked")
    assert (done["action"], done["outcome"], done["requested_by"]) == (
        "resubmit", "resubmitted", orderctl.actor,
    )  # fmt: skip
    assert (await rt.store.get_timeline(first))[-1].actor == orderctl.actor

    again = await orderctl.json("restart", second, "--from", "charge_payment", "--reason", "card")
    assert (again["action"], again["outcome"], again["generation"]) == ("restart", "restarted", 2)
    last = (await rt.store.get_timeline(second))[-1]
    assert (last.event, last.actor) == ("restarted", orderctl.actor)

    refused = await orderctl("restart", first, "--from", "teleport", "--reason", "r")
    assert refused.exit_code == 2 and "(unknown_step)" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


async def test_bulk_dry_run_then_confirmed(orderctl, rt, reader, fakes):
    token = uuid.uuid4().hex[:8]
    orders = sorted([await declined(rt, reader, fakes, f"o-bulk-{token}-{n}") for n in range(2)])
    preview = await orderctl.json("resubmit", "--text", token, "--dry-run")
    assert sorted(i["order_id"] for i in preview["items"]) == orders
    assert {i["outcome"] for i in preview["items"]} == {"would_resubmit"}
    assert all([(await rt.store.load(o)).state is ProcessState.ERROR for o in orders])

    refused = await orderctl("resubmit", "--text", token, "--reason", "r", input="n\n")
    assert refused.exit_code == 1 and "not confirmed" in refused.stderr
    assert all([(await rt.store.load(o)).state is ProcessState.ERROR for o in orders])

    done = await orderctl.json("resubmit", "--text", token, "--reason", "restocked", "--yes")
    assert {i["outcome"] for i in done["items"]} == {"resubmitted"} and done["acted"] == 2
    assert (await rt.store.get_timeline(orders[0]))[-1].actor == orderctl.actor


async def test_dead_letters_listed_replay_refused_then_purged(orderctl, rt, servicebus):
    orders_queue = queue(rt, "orders")
    message = ServiceBusMessage(encode(new_order()), message_id=f"m-{uuid.uuid4().hex[:12]}")
    async with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        async with client.get_queue_sender(orders_queue) as sender:
            await sender.send_messages(message)
        async with client.get_queue_receiver(orders_queue, max_wait_time=5) as receiver:
            while received := await receiver.receive_messages(
                max_message_count=1, max_wait_time=30
            ):
                if received[0].message_id == message.message_id:
                    await receiver.dead_letter_message(
                        received[0], reason="MaxDeliveryCountExceeded"
                    )
                    break
                await receiver.complete_message(received[0])

    page = await orderctl.json("dead-letters", "orders")
    [item] = [i for i in page["items"] if i["message_id"] == message.message_id]
    number = str(item["sequence_number"])

    early = await orderctl.json("dead-letters", "replay", "orders", number, "--dry-run")
    assert [i["outcome"] for i in early["items"]] == ["refused"]
    assert "duplicate detection" in early["items"][0]["detail"]

    purged = await orderctl.json(
        "dead-letters", "purge", "orders", number, "--yes", "--reason", "malformed test message"
    )
    assert [i["outcome"] for i in purged["items"]] == ["purged"] and purged["recorded_in_log"]
    left = await orderctl.json("dead-letters", "orders")
    assert message.message_id not in {i["message_id"] for i in left["items"]}

    # The dry run is not logged; the purge is, with who ran it and why.
    [logged] = (await orderctl.json("dead-letter-log", "--limit", "5"))["actions"]
    assert (logged["actor"], logged["action"], logged["queue"], logged["reason"]) == (
        orderctl.actor, "purge", "orders", "malformed test message"
    )  # fmt: skip
    assert logged["counts"] == {"purged": 1}
    assert [o["message_id"] for o in logged["outcomes"]] == [message.message_id]
    table = await orderctl("dead-letter-log", "--wide")
    assert table.exit_code == 0, table.output
    assert "malformed test message" in table.stdout and "1 purged" in table.stdout


async def test_health_and_supervisor(orderctl):
    health = await orderctl.json("health")
    assert health["status"] == "ok"
    assert [c["name"] for c in health["checks"]] == ["settings", "table", "servicebus"]
    view = await orderctl.json("supervisor")
    assert len(view["buckets"]) == 16
    table = await orderctl("health")
    assert table.exit_code == 0 and "servicebus" in table.stdout


# -------------------------------------------------------------------------- both compared


async def test_both_backends_print_the_same_documents(both, rt, reader, fakes):
    order_id = await declined(rt, reader, fakes)
    ops = LocalOperations(rt)
    try:  # a purge of a dead letter that is not there is logged all the same
        await ops.purge_dead_letters(
            "orders", operator="ann", sequence_numbers=[10**12], reason="x"
        )
    finally:
        await ops.close()
    reads = [
        ("status", order_id),
        ("orders", "Error", "--text", order_id),
        ("alerts", "--limit", "100"),
        ("dead-letters",),
        ("dead-letters", "orders"),
        ("health",),
        ("supervisor",),
        ("purges",),
        ("dead-letter-log",),
    ]
    for args in reads:
        local, remote = [await both[b].json(*args) for b in BACKENDS]
        assert shape(local) == shape(remote), args
        if args[0] in ("status", "orders", "dead-letters", "dead-letter-log"):
            assert local == remote, args
        if args == ("dead-letters",):
            assert "orders" in {q["queue"] for q in remote["queues"]}
        if args == ("dead-letter-log",):
            assert [a["counts"] for a in remote["actions"]] == [{"not_found": 1}]
    people = [(await both[b]("status", order_id)).stdout for b in BACKENDS]
    assert people[0] == people[1], "the same table for people"


async def test_an_action_without_a_signed_in_caller_says_what_to_do(rt, reader, fakes):
    anonymous = start_host({}, rt)
    try:
        order_id = await declined(rt, reader, fakes)
        url = anonymous.http.base_url
        result = await invoke(["--api-url", url, "resubmit", order_id, "--reason", "r"])
        assert result.exit_code == 2
        [line] = result.stderr.strip().splitlines()
        assert "not_signed_in" in line and "--entra" in line and "DEVHOST_PRINCIPAL_NAME" in line
        assert (await rt.store.load(order_id)).state is ProcessState.ERROR, "nothing changed"
        reads = await invoke(["--api-url", url, "status", order_id])
        assert reads.exit_code == 0, "reads need no signed-in caller"
    finally:
        anonymous.stop(timeout=2)
