"""The same `orderctl` operator commands against the local stack in process and, in remote mode
(`--api-url`), against a local functions host serving the operator HTTP API: each command's
outcome is the same, and its --json document has the same shape (the same models, read back
from the API's JSON).

Both backends see the same Azurite tables and broker queues: the in-process one through a
stack.json naming them (as `orderctl up` writes it), the remote one through the host, whose
functions use the test's Runtime. The host names its callers `remote-op`
(DEVHOST_PRINCIPAL_NAME, as App Service Authentication would).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from typer.testing import CliRunner

from core import runtime
from core.messages import encode
from core.states import ProcessState
from devstack import cli
from devstack.cli_output import validate
from devstack.host import LocalHost
from devstack.stack.local_stack import STATE_FILE, base_settings
from operator_api import functions as api
from operator_api.operations import Operations
from scheduler.intake import handle_submission
from tests.support.pattern import new_order, queue, run_agent_step

pytestmark = pytest.mark.integration

PRINCIPAL = "remote-op"
BACKENDS = ["local", "remote"]
OPERATOR_FUNCTIONS = sorted(name for name in dir(api) if name.startswith("operator_"))
runner = CliRunner()


def start_host(settings: dict[str, str]) -> LocalHost:
    """A functions host serving only the operator HTTP API, on a free port."""
    sys.modules.pop("function_app", None)  # get_functions() runs once per FunctionApp object
    host = LocalHost(
        "function_app", settings=settings, host_json=None, functions=OPERATOR_FUNCTIONS,
        http_port=0,
    )  # fmt: skip
    return host.start()


@pytest.fixture(autouse=True)
def no_remote_environment(monkeypatch):
    """The in-process runs must not be sent elsewhere by a developer's environment."""
    for name in ("ORDERCTL_API_URL", "ORDERCTL_FUNCTION_KEY", "ORDERCTL_AUTH", "ORDERCTL_SCOPE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def host() -> Iterator[LocalHost]:
    local = start_host({"DEVHOST_PRINCIPAL_NAME": PRINCIPAL})
    yield local
    local.stop(timeout=2)


@pytest.fixture
def installed(rt):
    """The test's Runtime is the one the host's functions use."""
    previous = runtime.install(rt)
    yield rt
    api.operations().close()
    runtime.install(previous)


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
        return f"operator:{PRINCIPAL if self.backend == 'remote' else cli.OPERATOR}"

    def __call__(self, *args: str, input: str | None = None) -> Any:
        if self.backend == "remote":
            argv = ["--api-url", self.api_url, *args]
        else:
            argv = [*args, "--workdir", str(self.workdir)]
        return runner.invoke(cli.app, argv, input=input, catch_exceptions=False)

    def json(self, *args: str, exit_code: int = 0) -> dict:
        """The command's one --json document, checked against its documented shape."""
        result = self(*args, "--json")
        assert result.exit_code == exit_code, result.output
        document = json.loads(result.stdout)
        value = validate(args[0], document)
        assert value.model_dump(mode="json") == document
        return document


@pytest.fixture(params=BACKENDS)
def orderctl(request, installed, host, workdir) -> Orderctl:
    return Orderctl(request.param, workdir, host.http.base_url)


@pytest.fixture
def both(installed, host, workdir) -> dict[str, Orderctl]:
    return {b: Orderctl(b, workdir, host.http.base_url) for b in BACKENDS}


def declined(rt, reader, fakes, order_id: str | None = None) -> str:
    """An order in Error at once: its first step is declined (nothing to undo)."""
    order = new_order(**({"order_id": order_id} if order_id else {}))
    fakes.set_profile({"services": {"inventory": {"decline_order_ids": [order.order_id]}}})
    handle_submission(encode(order), rt)
    run_agent_step(rt, reader, order.order_id, "inventory")
    assert rt.store.load(order.order_id).state is ProcessState.ERROR
    fakes.set_profile(None)
    return order.order_id


def drain(servicebus, queue_name: str) -> None:
    """Take every message left on a queue by earlier tests (alerts are listed by peeking)."""
    with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        with client.get_queue_receiver(queue_name, max_wait_time=1) as receiver:
            while batch := receiver.receive_messages(max_message_count=50, max_wait_time=1):
                for message in batch:
                    receiver.complete_message(message)


def shape(document: Any) -> Any:
    """A document's structure: the keys of every object, the shape of every list item, the
    JSON type of every value."""
    if isinstance(document, dict):
        return {key: shape(value) for key, value in document.items()}
    if isinstance(document, list):
        return [shape(value) for value in document]
    return type(document).__name__


# ---------------------------------------------------------------------- each backend alone


def test_status_and_orders(orderctl, rt, reader, fakes):
    order_id = declined(rt, reader, fakes)
    detail = orderctl.json("status", order_id)
    assert detail["order"]["order_id"] == order_id and detail["order"]["state"] == "Error"
    assert detail["steps"][0]["name"] == "reserve_inventory"

    page = orderctl.json("orders", "Error", "--text", order_id, "--sort", "-created")
    assert [o["order_id"] for o in page["items"]] == [order_id]
    assert page["filters"] == {"text": order_id} and page["sort"] == "-created"

    shown = orderctl("status", order_id)
    assert shown.exit_code == 0 and order_id in shown.stdout and "timeline" in shown.stdout

    watched = orderctl("status", order_id, "--watch", "--json")
    assert watched.exit_code == 3, "the order ended in Error"
    [line] = watched.stdout.splitlines()
    assert json.loads(line)["terminal"] is True

    missing = orderctl("status", "o-nowhere")
    assert missing.exit_code == 2
    assert missing.stderr.strip() == "error: order o-nowhere does not exist (order_not_found)"


def test_alerts_open_then_ack(orderctl, rt, reader, fakes, servicebus):
    drain(servicebus, queue(rt, "alerts"))
    order_id = declined(rt, reader, fakes)
    page = orderctl.json("alerts", "--open", "--limit", "100")
    [alert] = [i for i in page["items"] if (i["alert"] or {}).get("order_id") == order_id]
    assert alert["resolution"] == "open" and page["open_only"] is True

    unexplained = orderctl("ack", str(alert["sequence_number"]))
    assert unexplained.exit_code == 2 and "(invalid_reason)" in unexplained.stderr
    done = orderctl.json("ack", str(alert["sequence_number"]), "--reason", "refund issued")
    assert done["order_id"] == order_id and done["recorded_in_timeline"] is True
    assert done["acknowledged_by"] == orderctl.actor
    left = orderctl.json("alerts", "--open", "--limit", "100")
    assert order_id not in {(i["alert"] or {}).get("order_id") for i in left["items"]}


def test_resubmit_and_restart_from_a_step(orderctl, rt, reader, fakes):
    first, second = declined(rt, reader, fakes), declined(rt, reader, fakes)
    done = orderctl.json("resubmit", first, "--reason", "restocked")
    assert (done["action"], done["outcome"], done["requested_by"]) == (
        "resubmit", "resubmitted", orderctl.actor,
    )  # fmt: skip
    assert rt.store.get_timeline(first)[-1].actor == orderctl.actor

    again = orderctl.json("restart", second, "--from", "charge_payment", "--reason", "card")
    assert (again["action"], again["outcome"], again["generation"]) == ("restart", "restarted", 2)
    last = rt.store.get_timeline(second)[-1]
    assert (last.event, last.actor) == ("restarted", orderctl.actor)

    refused = orderctl("restart", first, "--from", "teleport", "--reason", "r")
    assert refused.exit_code == 2 and "(unknown_step)" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_bulk_dry_run_then_confirmed(orderctl, rt, reader, fakes):
    token = uuid.uuid4().hex[:8]
    orders = sorted(declined(rt, reader, fakes, f"o-bulk-{token}-{n}") for n in range(2))
    preview = orderctl.json("resubmit", "--text", token, "--dry-run")
    assert sorted(i["order_id"] for i in preview["items"]) == orders
    assert {i["outcome"] for i in preview["items"]} == {"would_resubmit"}
    assert all(rt.store.load(o).state is ProcessState.ERROR for o in orders)

    refused = orderctl("resubmit", "--text", token, "--reason", "r", input="n\n")
    assert refused.exit_code == 1 and "not confirmed" in refused.stderr
    assert all(rt.store.load(o).state is ProcessState.ERROR for o in orders)

    done = orderctl.json("resubmit", "--text", token, "--reason", "restocked", "--yes")
    assert {i["outcome"] for i in done["items"]} == {"resubmitted"} and done["acted"] == 2
    assert rt.store.get_timeline(orders[0])[-1].actor == orderctl.actor


def test_dead_letters_listed_replay_refused_then_purged(orderctl, rt, servicebus):
    orders_queue = queue(rt, "orders")
    message = ServiceBusMessage(encode(new_order()), message_id=f"m-{uuid.uuid4().hex[:12]}")
    with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        with client.get_queue_sender(orders_queue) as sender:
            sender.send_messages(message)
        with client.get_queue_receiver(orders_queue, max_wait_time=5) as receiver:
            while received := receiver.receive_messages(max_message_count=1, max_wait_time=5):
                if received[0].message_id == message.message_id:
                    receiver.dead_letter_message(received[0], reason="MaxDeliveryCountExceeded")
                    break
                receiver.complete_message(received[0])

    page = orderctl.json("dead-letters", "orders")
    [item] = [i for i in page["items"] if i["message_id"] == message.message_id]
    number = str(item["sequence_number"])

    early = orderctl.json("dead-letters", "replay", "orders", number, "--dry-run")
    assert [i["outcome"] for i in early["items"]] == ["refused"]
    assert "duplicate detection" in early["items"][0]["detail"]

    purged = orderctl.json(
        "dead-letters", "purge", "orders", number, "--yes", "--reason", "malformed test message"
    )
    assert [i["outcome"] for i in purged["items"]] == ["purged"] and purged["recorded_in_log"]
    left = orderctl.json("dead-letters", "orders")
    assert message.message_id not in {i["message_id"] for i in left["items"]}

    # The dry run is not logged; the purge is, with who ran it and why.
    [logged] = orderctl.json("dead-letter-log", "--limit", "5")["actions"]
    assert (logged["actor"], logged["action"], logged["queue"], logged["reason"]) == (
        orderctl.actor, "purge", "orders", "malformed test message"
    )  # fmt: skip
    assert logged["counts"] == {"purged": 1}
    assert [o["message_id"] for o in logged["outcomes"]] == [message.message_id]
    table = orderctl("dead-letter-log", "--wide")
    assert table.exit_code == 0, table.output
    assert "malformed test message" in table.stdout and "1 purged" in table.stdout


def test_health_and_supervisor(orderctl):
    health = orderctl.json("health")
    assert health["status"] == "ok"
    assert [c["name"] for c in health["checks"]] == ["settings", "table", "servicebus"]
    view = orderctl.json("supervisor")
    assert len(view["buckets"]) == 16
    table = orderctl("health")
    assert table.exit_code == 0 and "servicebus" in table.stdout


# -------------------------------------------------------------------------- both compared


def test_both_backends_print_the_same_documents(both, rt, reader, fakes):
    order_id = declined(rt, reader, fakes)
    ops = Operations(rt)
    try:  # a purge of a dead letter that is not there is logged all the same
        ops.purge_dead_letters("orders", operator="ann", sequence_numbers=[10**12], reason="x")
    finally:
        ops.close()
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
        local, remote = (both[b].json(*args) for b in BACKENDS)
        assert shape(local) == shape(remote), args
        if args[0] in ("status", "orders", "dead-letters", "dead-letter-log"):
            assert local == remote, args
        if args == ("dead-letters",):
            assert "orders" in {q["queue"] for q in remote["queues"]}
        if args == ("dead-letter-log",):
            assert [a["counts"] for a in remote["actions"]] == [{"not_found": 1}]
    people = [both[b]("status", order_id).stdout for b in BACKENDS]
    assert people[0] == people[1], "the same table for people"


def test_an_action_without_a_signed_in_caller_says_what_to_do(installed, rt, reader, fakes):
    anonymous = start_host({})
    try:
        order_id = declined(rt, reader, fakes)
        url = anonymous.http.base_url
        result = runner.invoke(cli.app, ["--api-url", url, "resubmit", order_id, "--reason", "r"])
        assert result.exit_code == 2
        [line] = result.stderr.strip().splitlines()
        assert "not_signed_in" in line and "--entra" in line and "DEVHOST_PRINCIPAL_NAME" in line
        assert rt.store.load(order_id).state is ProcessState.ERROR, "nothing changed"
        reads = runner.invoke(cli.app, ["--api-url", url, "status", order_id])
        assert reads.exit_code == 0, "reads need no signed-in caller"
    finally:
        anonymous.stop(timeout=2)
