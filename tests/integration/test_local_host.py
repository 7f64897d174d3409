"""The local functions host (devstack.host) against the development Service Bus broker.

The app under test is tests/integration/host_app/function_app.py, loaded under a fresh module
name for each host (``app.get_functions()`` may be called once per FunctionApp object). Each
test uses its own queue from tests/integration/host_config.json.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import azure.functions as func
import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from devstack.host import HostConfigError, LocalHost
from devstack.stack import processes
from devstack.stack.processes import REPO_ROOT
from tests.support.app import EXAMPLE_SETTINGS
from tests.support.broker import ServiceBusNamespace
from tests.support.local_host import fresh_module, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.servicebus_config("tests/integration/host_config.json"),
]

APP_FILE = REPO_ROOT / "tests" / "integration" / "host_app" / "function_app.py"
EVERY_SECOND = "*/1 * * * * *"


# -- helpers -------------------------------------------------------------------------------


def send(namespace: ServiceBusNamespace, queue: str, *bodies: str, **properties: Any) -> None:
    with ServiceBusClient.from_connection_string(namespace.connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(
                [
                    ServiceBusMessage(
                        body, message_id=f"m{i}-{body}", application_properties=properties or None
                    )
                    for i, body in enumerate(bodies)
                ]
            )


def drain(
    namespace: ServiceBusNamespace, queue: str, sub_queue: ServiceBusSubQueue | None = None
) -> list[tuple[str, int | None, str | None]]:
    """Receive and complete everything there: (body, SDK delivery count, dead-letter reason)."""
    found = []
    with ServiceBusClient.from_connection_string(namespace.connection_string) as client:
        with client.get_queue_receiver(queue, sub_queue=sub_queue) as receiver:
            while batch := receiver.receive_messages(max_message_count=50, max_wait_time=1.5):
                for message in batch:
                    found.append((str(message), message.delivery_count, message.dead_letter_reason))
                    receiver.complete_message(message)
    return found


def dead_letters(namespace: ServiceBusNamespace, queue: str) -> int:
    """How many dead letters ``queue`` holds (peeked: they stay)."""
    with ServiceBusClient.from_connection_string(namespace.connection_string) as client:
        with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as peeker:
            return len(peeker.peek_messages(max_message_count=10))


def host_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("host-")]


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 30
    while (extra := [t for t in threading.enumerate() if t not in before and t.is_alive()]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert not extra, f"threads left running: {[t.name for t in extra]}"


@pytest.fixture
def make_host(
    servicebus: ServiceBusNamespace, no_leaked_threads: None
) -> Iterator[Callable[..., tuple[LocalHost, types.ModuleType]]]:
    """``make_host(queue, async_queue, **LocalHost kwargs)`` -> (unstarted host, app module);
    the queues are logical names from host_config.json."""
    hosts: list[LocalHost] = []

    def factory(
        queue: str = "host-basic", async_queue: str = "host-async", **kwargs: Any
    ) -> tuple[LocalHost, types.ModuleType]:
        module = fresh_module(APP_FILE)
        settings = {
            "ServiceBusConnection": servicebus.connection_string,
            "HOST_TEST_QUEUE": servicebus.queue(queue),
            "HOST_TEST_ASYNC_QUEUE": servicebus.queue(async_queue),
            "HOST_TEST_SCHEDULE": EVERY_SECOND,
        }
        kwargs.setdefault("host_json", None)
        host = LocalHost(module, settings=settings, **kwargs)
        hosts.append(host)
        return host, module

    yield factory
    for host in hosts:
        host.stop(timeout=30)


# -- Service Bus triggers ------------------------------------------------------------------


def test_messages_are_processed_and_completed(make_host, servicebus):
    queue = servicebus.queue("host-basic")
    host, app = make_host("host-basic", concurrency_override=2, functions=["on_message"])
    send(servicebus, queue, *[f"order-{i}" for i in range(5)], tenant="contoso")
    with host:
        wait_until(lambda: host.stats()["on_message"].successes == 5, 60, "5 successes")
    assert sorted(r["body"] for r in app.RECORDS) == [f"order-{i}" for i in range(5)]
    assert {r["delivery_count"] for r in app.RECORDS} == {1}
    assert all(r["properties"] == {"tenant": "contoso"} for r in app.RECORDS)
    assert {r["message_id"] for r in app.RECORDS} == {f"m{i}-order-{i}" for i in range(5)}
    stats = host.stats()["on_message"]
    assert (stats.invocations, stats.failures, stats.settle_errors) == (5, 0, 0)
    assert drain(servicebus, queue) == []
    assert drain(servicebus, queue, ServiceBusSubQueue.DEAD_LETTER) == []


def test_exception_abandons_until_dead_lettered_at_max_delivery_count(make_host, servicebus):
    queue = servicebus.queue("host-deadletter")  # MaxDeliveryCount 3
    host, app = make_host("host-deadletter", concurrency_override=1, functions=["on_message"])
    send(servicebus, queue, "fail-always")
    with host:
        wait_until(lambda: host.stats()["on_message"].failures == 3, 60, "3 failed deliveries")
        # Dead-lettered: no 4th delivery can come after this.
        wait_until(lambda: dead_letters(servicebus, queue) == 1, 60, "the dead letter")
    assert [r["delivery_count"] for r in app.RECORDS] == [1, 2, 3]
    assert host.stats()["on_message"].invocations == 3
    assert drain(servicebus, queue) == []
    dead = drain(servicebus, queue, ServiceBusSubQueue.DEAD_LETTER)
    assert [(body, reason) for body, _, reason in dead] == [
        ("fail-always", "MaxDeliveryCountExceeded")
    ]


def test_concurrency_runs_exactly_n_at_once(make_host, servicebus):
    queue = servicebus.queue("host-concurrency")
    host, app = make_host("host-concurrency", concurrency_override=4, functions=["on_message"])
    assert [f.concurrency for f in host.functions] == [4]
    send(servicebus, queue, *["sleep:1.0"] * 8)
    with host:
        wait_until(lambda: host.stats()["on_message"].successes == 8, 60, "8 successes")
    assert app.max_active == 4  # four at once, never five (not timed: a loaded machine is slow)


def test_lock_is_renewed_while_the_function_runs(make_host, servicebus):
    queue = servicebus.queue("host-short-lock")  # LockDuration PT5S
    # Two receivers: without renewal the second one would get the message again after 5 s.
    host, app = make_host("host-short-lock", concurrency_override=2, functions=["on_message"])
    send(servicebus, queue, "sleep:8")
    with host:
        wait_until(lambda: host.stats()["on_message"].successes == 1, 60, "the slow run")
        time.sleep(1.0)
    assert app.STARTED == ["sleep:8"]
    stats = host.stats()["on_message"]
    assert (stats.invocations, stats.settle_errors) == (1, 0)
    assert drain(servicebus, queue) == []


def test_stop_lets_in_flight_runs_finish(make_host, servicebus):
    queue = servicebus.queue("host-stop-finish")
    host, app = make_host("host-stop-finish", concurrency_override=2, functions=["on_message"])
    send(servicebus, queue, "wait")
    host.start()
    wait_until(lambda: app.STARTED == ["wait"], 60, "the run to start")
    # The run ends only once released, a second into the stop: stop must wait for it.
    released = threading.Timer(1.0, app.RELEASE.set)
    began = time.monotonic()
    released.start()
    assert host.stop(timeout=60) is True
    assert [r["body"] for r in app.RECORDS] == ["wait"]
    assert app.RECORDS[0]["ended"] > began
    assert host.stats()["on_message"].successes == 1
    assert host_threads() == []
    assert drain(servicebus, queue) == []


def test_stop_abandons_runs_still_going_at_the_deadline(make_host, servicebus):
    queue = servicebus.queue("host-stop-abandon")
    host, app = make_host("host-stop-abandon", concurrency_override=2, functions=["on_message"])
    send(servicebus, queue, "wait")
    host.start()
    wait_until(lambda: app.STARTED == ["wait"], 60, "the run to start")
    assert host.stop(timeout=0.5) is False
    assert app.RECORDS == [], "stop waited for the run it gave up on"
    assert host.stats()["on_message"].abandoned_on_stop == 1
    with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        with client.get_queue_receiver(queue) as receiver:
            (again,) = receiver.receive_messages(max_message_count=1, max_wait_time=30)
            assert str(again) == "wait"
            assert again.delivery_count == 1  # abandoned once: this is the 2nd delivery
            app.RELEASE.set()  # the straggler returns; the host must not settle it again
            wait_until(lambda: host_threads() == [], 60, "the straggler thread to end")
            receiver.complete_message(again)  # still ours: the host did not complete it
    assert [r["body"] for r in app.RECORDS] == ["wait"]
    assert host.stats()["on_message"].settle_errors == 0


def test_async_function_is_awaited_on_the_loop_and_no_thread_receives(make_host, servicebus):
    queue = servicebus.queue("host-async")
    host, app = make_host(concurrency_override=2, functions=["on_message_async"])
    send(servicebus, queue, "wait", "wait", "a")
    host.start()
    # Two receivers: both runs start on the one loop, neither ending before it is released.
    wait_until(lambda: app.STARTED.count("wait") == 2, 60, "two runs at once")
    app.RELEASE.set()
    wait_until(lambda: len(app.RECORDS) == 3, 60, "three async runs")
    assert {r["thread"] for r in app.RECORDS} == {"host-async-loop"}
    assert host_threads() == ["host-async-loop"]  # receiving and settling are coroutines there
    assert host.stop(timeout=60) is True
    assert host.stats()["on_message_async"].successes == 3
    assert drain(servicebus, queue) == []


def test_async_run_past_the_deadline_is_abandoned_and_not_settled_again(make_host, servicebus):
    queue = servicebus.queue("host-async-abandon")
    host, app = make_host(
        async_queue="host-async-abandon", concurrency_override=2, functions=["on_message_async"]
    )
    send(servicebus, queue, "wait")
    host.start()
    wait_until(lambda: app.STARTED == ["wait"], 60, "the run to start")
    assert host.stop(timeout=0.5) is False
    assert host.stats()["on_message_async"].abandoned_on_stop == 1
    assert host.stats()["on_message_async"].settle_errors == 0
    with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        with client.get_queue_receiver(queue) as receiver:
            (again,) = receiver.receive_messages(max_message_count=1, max_wait_time=30)
            assert str(again) == "wait"
            # Abandoned once: no other receiver of the host picked it up after the abandon.
            assert again.delivery_count == 1
            receiver.complete_message(again)
    assert host_threads() == []


# -- timer triggers ------------------------------------------------------------------------


def test_timer_fires_on_its_schedule(make_host):
    host, app = make_host(functions=["on_timer"])
    assert [(f.trigger, f.target) for f in host.functions] == [
        ("timerTrigger", f"schedule={EVERY_SECOND!r}")
    ]
    with host:
        wait_until(lambda: len(app.TIMER_RUNS) >= 2, 60, "two timer runs")
    assert not any(run["past_due"] for run in app.TIMER_RUNS)
    # Scheduled on the loop, a sync function runs on a thread of the timer's own.
    assert {run["thread"] for run in app.TIMER_RUNS} == {"host-timer-on_timer"}
    assert host.stats()["on_timer"].successes == len(app.TIMER_RUNS)


def test_timer_skips_ticks_that_fall_during_a_long_run(make_host):
    host, app = make_host(functions=["on_timer"])
    app.TIMER_SLEEP = 2.2
    with host:
        wait_until(
            lambda: len(app.TIMER_RUNS) >= 2 and host.stats()["on_timer"].skipped_ticks >= 2,
            60,
            "two runs of 2.2 s on a schedule of every second",
        )
    runs = app.TIMER_RUNS
    for previous, following in itertools.pairwise(runs):
        assert following["started"] >= previous["ended"]  # never two at once


def test_run_on_startup_async_function_with_context(make_host):
    host, app = make_host(functions=["on_startup"])
    with host:
        wait_until(lambda: len(app.STARTUP_RUNS) == 1, 60, "the startup run")
    (run,) = app.STARTUP_RUNS
    assert run["function"] == "on_startup"
    assert run["thread"] == "host-async-loop"  # awaited on the loop, as the worker does
    assert run["past_due"] is False
    assert run["next"]["Next"].startswith(str(time.gmtime().tm_year + 1))


# -- configuration errors ------------------------------------------------------------------


def test_missing_setting_is_a_clear_error():
    with pytest.raises(HostConfigError) as caught:
        LocalHost(fresh_module(APP_FILE), settings={"ServiceBusConnection": "Endpoint=sb://x/;"})
    message = str(caught.value)
    assert "'on_message'" in message
    assert "'queueName'" in message
    assert "'HOST_TEST_QUEUE'" in message


def test_missing_connection_is_a_clear_error():
    with pytest.raises(HostConfigError, match=r"'on_message'.*'ServiceBusConnection'"):
        LocalHost(
            fresh_module(APP_FILE), settings={"HOST_TEST_QUEUE": "q"}, functions=["on_message"]
        )


def _module_with(register: Callable[[func.FunctionApp], None]) -> types.ModuleType:
    module = types.ModuleType(f"inline_app_{uuid.uuid4().hex}")
    module.app = func.FunctionApp()  # type: ignore[attr-defined]
    register(module.app)  # type: ignore[attr-defined]
    return module


def test_unsupported_trigger_is_a_clear_error():
    def register(app: func.FunctionApp) -> None:
        @app.queue_trigger(arg_name="item", queue_name="work", connection="AzureWebJobsStorage")
        def storage_queue_worker(item: func.QueueMessage) -> None:
            pass

    with pytest.raises(HostConfigError, match=r"'storage_queue_worker'.*'queueTrigger'"):
        LocalHost(_module_with(register), settings={})


def test_output_binding_is_a_clear_error():
    def register(app: func.FunctionApp) -> None:
        @app.service_bus_queue_trigger(arg_name="msg", queue_name="in", connection="SB")
        @app.service_bus_queue_output(arg_name="out", queue_name="out", connection="SB")
        def forwarder(msg: func.ServiceBusMessage, out: func.Out[str]) -> None:
            pass

    with pytest.raises(HostConfigError, match=r"'forwarder'.*'out'.*'serviceBus'"):
        LocalHost(_module_with(register), settings={"SB": "Endpoint=sb://x/;"})


# -- several host processes ----------------------------------------------------------------


def test_two_host_processes_share_one_queue(servicebus, tmp_path):
    queue = servicebus.queue("host-shared")
    records = tmp_path / "records.jsonl"
    settings = tmp_path / "local.settings.json"
    settings.write_text(
        json.dumps(
            {
                "IsEncrypted": False,
                "Values": {
                    "ServiceBusConnection": servicebus.connection_string,
                    "HOST_TEST_QUEUE": queue,
                    "HOST_TEST_ASYNC_QUEUE": servicebus.queue("host-async"),
                    "HOST_TEST_SCHEDULE": EVERY_SECOND,
                    "HOST_TEST_RECORD_FILE": str(records),
                },
            }
        )
    )
    argv = [
        sys.executable, "-m", "devstack.host",
        "--app", "tests.integration.host_app.function_app",
        "--settings", str(settings),
        "--functions", "on_message",
        "--concurrency", "2",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    logs = [tmp_path / f"host-{i}.log" for i in range(2)]
    stats_files = [tmp_path / f"host-{i}.stats.json" for i in range(2)]
    procs = [
        processes.spawn([*argv, "--stats-file", str(stats)], log_path=log, cwd=REPO_ROOT, env=env)
        for log, stats in zip(logs, stats_files, strict=True)
    ]
    try:
        for log in logs:
            wait_until(lambda log=log: "host started" in log.read_text(), 60, f"{log.name}")
        send(servicebus, queue, *["sleep:0.25"] * 40)  # ids m0-... to m39-...
        wait_until(
            lambda: records.exists() and len(records.read_text().splitlines()) >= 40,
            60,
            "40 records",
        )
        time.sleep(1.0)  # a duplicate delivery would land here
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=30) for proc in procs]
    finally:
        for proc in procs:
            processes.stop(proc)
    outputs = [log.read_text() for log in logs]
    assert codes == [0, 0], outputs
    for output in outputs:
        assert f"on_message: serviceBusTrigger queue={queue} concurrency=2" in output
        assert "on_message: invocations=" in output
    entries = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(entries) == 40
    assert len({e["message_id"] for e in entries}) == 40  # none processed twice
    assert len({e["pid"] for e in entries}) == 2  # both hosts took a share
    for stats_file in stats_files:
        stats = json.loads(stats_file.read_text())
        mine = sum(1 for e in entries if e["pid"] == stats["pid"])
        assert stats["functions"]["on_message"]["successes"] == mine
    assert drain(servicebus, queue) == []


def test_the_app_with_wrong_settings_does_not_start_and_names_every_one(tmp_path):
    """As the Functions host would: the app refuses to load, so nothing is received and
    dead-lettered on its account, and the error names every wrong setting at once."""
    settings = tmp_path / "local.settings.json"
    values = EXAMPLE_SETTINGS | {
        "STEP_TIMEOUT_SECONDS": "soon",
        "PAYMENT_SERVICE_URL": "payment.local",
    }
    settings.write_text(json.dumps({"IsEncrypted": False, "Values": values}))
    argv = [sys.executable, "-m", "devstack.host", "--settings", str(settings), "--http-port", "-1"]
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("ServiceBusConnection", "StateStorage"))
    }
    done = subprocess.run(
        argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "2 app settings are wrong" in done.stderr
    assert "STEP_TIMEOUT_SECONDS" in done.stderr and "PAYMENT_SERVICE_URL" in done.stderr
