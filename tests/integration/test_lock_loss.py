"""Lock loss is counted, by the local host and by the development broker, and told apart from
a killed host.

The broker counts a lock that expired while its receiver was still attached as lost
(``lock_lost``), and one whose receiver's process died first as expected
(``expired_after_crash``); each redelivery is counted by what ended the delivery before it
(``redelivered_after``). The host counts what it sees: renewals that stopped early, settlements
refused with ``MessageLockLostError`` and messages that come back (``redelivered``).

The app is tests/integration/lock_loss_app (``hold:<seconds>`` sleeps on the first delivery
only); every queue here has a 5 s lock.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from devstack.host import LocalHost
from devstack.servicebus import stats as broker_stats
from devstack.stack import processes
from devstack.stack.processes import REPO_ROOT
from tests.support.broker import ServiceBusNamespace
from tests.support.local_host import fresh_module, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.servicebus_config("tests/integration/lock_loss_config.json"),
]

APP_MODULE = "tests.integration.lock_loss_app.function_app"
APP_FILE = REPO_ROOT / "tests" / "integration" / "lock_loss_app" / "function_app.py"
LOCK_S = 5.0
NO_LOSS = {"lock_renewal_failures": 0, "lock_lost_on_settle": 0, "lock_lost": 0}


# -- helpers -------------------------------------------------------------------------------


def send(namespace: ServiceBusNamespace, queue: str, body: str) -> None:
    with (
        ServiceBusClient.from_connection_string(namespace.connection_string) as client,
        client.get_queue_sender(queue) as sender,
    ):
        sender.send_messages(ServiceBusMessage(body))


def broker_counters(namespace: ServiceBusNamespace, queue: str) -> dict[str, Any]:
    """The broker's counters for one queue, from its stats file (written about every second)."""
    assert namespace.broker is not None
    path = broker_stats.default_stats_path(namespace.broker.port_file)
    assert path is not None
    document = broker_stats.read(path) or {}
    return document.get("queues", {}).get(queue, {})


def settled_counters(namespace: ServiceBusNamespace, queue: str, completed: int) -> dict[str, Any]:
    """The counters once the broker has recorded ``completed`` completions on ``queue``."""
    wait_until(
        lambda: broker_counters(namespace, queue).get("completed") == completed,
        30,
        f"{completed} completion(s) in the broker's stats file",
    )
    return broker_counters(namespace, queue)


def lock_counters(host: LocalHost) -> dict[str, int]:
    stats = host.stats()["on_message"]
    return {key: getattr(stats, key) for key in NO_LOSS}


@pytest.fixture
def local_broker(servicebus: ServiceBusNamespace) -> ServiceBusNamespace:
    if servicebus.broker is None:
        pytest.skip("counts lock loss at the development broker (its stats file)")
    return servicebus


@pytest.fixture
def make_host(
    local_broker: ServiceBusNamespace, tmp_path: Path
) -> Iterator[Callable[..., tuple[LocalHost, types.ModuleType]]]:
    """``make_host(queue, renewal="00:05:00", concurrency=1)`` -> (unstarted host, app)."""
    hosts: list[LocalHost] = []

    def factory(
        queue: str, *, renewal: str = "00:05:00", concurrency: int = 1
    ) -> tuple[LocalHost, types.ModuleType]:
        host_json = tmp_path / f"host-{len(hosts)}.json"
        options = {"maxAutoLockRenewalDuration": renewal, "prefetchCount": 0}
        host_json.write_text(json.dumps({"extensions": {"serviceBus": options}}))
        module = fresh_module(APP_FILE)
        settings = {
            "ServiceBusConnection": local_broker.connection_string,
            "LOCK_TEST_QUEUE": local_broker.queue(queue),
        }
        host = LocalHost(
            module, settings=settings, host_json=host_json, concurrency_override=concurrency
        )
        hosts.append(host)
        return host, module

    yield factory
    for host in hosts:
        host.stop(timeout=30)


# -- the tests -----------------------------------------------------------------------------


def test_a_handler_longer_than_the_lock_without_renewal_loses_it(make_host, local_broker):
    queue = local_broker.queue("lock-loss-no-renewal")
    host, app = make_host("lock-loss-no-renewal", renewal="00:00:00")
    send(local_broker, queue, f"hold:{LOCK_S + 2}")
    with host:
        wait_until(lambda: host.stats()["on_message"].successes == 2, 60, "two runs")
    assert [r["delivery_count"] for r in app.RECORDS] == [1, 2]
    stats = host.stats()["on_message"]
    assert lock_counters(host) == {
        "lock_renewal_failures": 0,
        "lock_lost_on_settle": 1,
        "lock_lost": 1,
    }
    assert (stats.redelivered, stats.settle_errors) == (1, 1)
    counters = settled_counters(local_broker, queue, completed=1)
    assert counters["lock_lost"] == 1
    assert counters["expired_after_crash"] == 0
    assert counters["delivered"] == 2
    assert counters["redelivered_after"] == {"lock_lost": 1}


def test_renewal_holds_a_message_past_three_lock_durations(make_host, local_broker):
    queue = local_broker.queue("lock-loss-renewed")
    # Two receivers: had the lock been lost, the second would get the message again.
    host, app = make_host("lock-loss-renewed", concurrency=2)
    send(local_broker, queue, f"hold:{3 * LOCK_S + 1}")
    with host:
        wait_until(lambda: host.stats()["on_message"].successes == 1, 60, "the long run")
        time.sleep(1.0)  # a redelivery would land here
    assert [r["delivery_count"] for r in app.RECORDS] == [1]
    assert lock_counters(host) == NO_LOSS
    stats = host.stats()["on_message"]
    assert (stats.redelivered, stats.settle_errors) == (0, 0)
    counters = settled_counters(local_broker, queue, completed=1)
    assert (counters["lock_lost"], counters["expired_after_crash"]) == (0, 0)
    assert counters["refused_lock_lost"] == 0
    assert counters["redelivered_after"] == {}


def test_a_killed_host_is_a_crash_not_a_lock_loss(make_host, local_broker, tmp_path):
    queue = local_broker.queue("lock-loss-killed")
    records = tmp_path / "records.jsonl"
    settings = tmp_path / "local.settings.json"
    values = {
        "ServiceBusConnection": local_broker.connection_string,
        "LOCK_TEST_QUEUE": queue,
        "LOCK_TEST_RECORD_FILE": str(records),
    }
    settings.write_text(json.dumps({"IsEncrypted": False, "Values": values}))
    argv = [
        sys.executable, "-m", "devstack.host", "--app", APP_MODULE,
        "--settings", str(settings), "--concurrency", "1", "--http-port", "-1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "host.log"
    victim = processes.spawn(argv, log_path=log, cwd=REPO_ROOT, env=env)
    try:
        wait_until(lambda: "host started" in log.read_text(), 60, "the host process to start")
        send(local_broker, queue, "hold:60")
        wait_until(lambda: records.exists() and records.read_text(), 60, "the first delivery")
        os.killpg(victim.pid, signal.SIGKILL)  # mid-run: nothing settled, no AMQP close
        victim.wait(timeout=30)
    finally:
        processes.stop(victim)
    host, app = make_host("lock-loss-killed")
    with host:  # gets the message again once its lock has expired
        wait_until(lambda: host.stats()["on_message"].successes == 1, 60, "the redelivery")
    assert [r["delivery_count"] for r in app.RECORDS] == [2]
    assert lock_counters(host) == NO_LOSS
    assert host.stats()["on_message"].redelivered == 1
    counters = settled_counters(local_broker, queue, completed=1)
    assert (counters["lock_lost"], counters["expired_after_crash"]) == (0, 1)
    assert counters["redelivered_after"] == {"holder_crashed": 1}
