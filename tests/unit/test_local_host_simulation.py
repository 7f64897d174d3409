"""The local host's simulated cold starts, the identity its HTTP server passes on, and its
per-function counters."""

from __future__ import annotations

import threading
from dataclasses import asdict

import pytest

from devstack.host.cold_start import ColdStarts, parse_cold_starts
from devstack.host.http_server import HttpServer
from devstack.host.settings import HostConfigError
from devstack.host.stats import FunctionStats, StatsCounter

FUNCTIONS = ("inventory_agent", "payment_agent", "scheduler_replies")


def test_delays_per_function_and_a_default_for_the_rest():
    assert parse_cold_starts("payment_agent:8, scheduler_replies:2.5", FUNCTIONS) == {
        "payment_agent": 8.0,
        "scheduler_replies": 2.5,
    }
    assert parse_cold_starts("*:3,payment_agent:0", FUNCTIONS) == {
        "inventory_agent": 3.0,
        "scheduler_replies": 3.0,
    }
    assert parse_cold_starts("", FUNCTIONS) == {}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("payment_agent", "must be <function>:<seconds>"),
        ("payment_agent:soon", "must be <function>:<seconds>"),
        ("payment_agent:-1", "must be <function>:<seconds>"),
        ("payment_agent:nan", "must be <function>:<seconds>"),
        ("payment_agent:601", "must be <function>:<seconds>"),
        ("paymnet_agent:5", "no function is named 'paymnet_agent'"),
    ],
)
def test_a_bad_setting_is_named_at_host_start(text, problem):
    with pytest.raises(HostConfigError, match="DEVHOST_COLD_START_SECONDS") as raised:
        parse_cold_starts(text, FUNCTIONS)
    assert problem in str(raised.value)


def test_the_first_call_pays_once_and_calls_meanwhile_wait_with_it():
    slept: list[float] = []
    release = threading.Event()

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        release.wait(30)

    starts = ColdStarts({"payment_agent": 8.0}, sleep=sleep)
    first = threading.Thread(target=starts.wait, args=("payment_agent",))
    first.start()
    while not slept:
        pass
    second_done = threading.Event()
    second = threading.Thread(target=lambda: (starts.wait("payment_agent"), second_done.set()))
    second.start()
    assert not second_done.wait(0.2), "a call during the cold start runs before the instance"
    release.set()
    first.join(30)
    second.join(30)
    assert second_done.is_set() and slept == [8.0]
    starts.wait("payment_agent")
    assert slept == [8.0], "paid once: a later call does not wait again"
    assert starts.wait("inventory_agent") == 0.0 and starts.pending == {}


def server(principal: str | None) -> HttpServer:
    return HttpServer([], invoker=None, stats={}, port=0, principal=principal)  # type: ignore[arg-type]


def test_a_client_cannot_choose_who_it_is():
    local = server("ann@example.com")
    try:
        passed = local._authenticated(
            {"x-ms-client-principal-name": "mallory", "X-MS-CLIENT-PRINCIPAL-ID": "1", "A": "b"}
        )
    finally:
        local._server.server_close()  # never started: nothing to shut down
    assert passed == {"A": "b", "X-MS-CLIENT-PRINCIPAL-NAME": "ann@example.com"}


def test_without_a_configured_principal_nobody_is_signed_in():
    local = server(None)
    try:
        assert local._authenticated({"X-MS-CLIENT-PRINCIPAL-NAME": "mallory"}) == {}
    finally:
        local._server.server_close()  # never started: nothing to shut down


# ---------------------------------------------------------------- per-function counters


def test_counters_from_many_threads_add_up():
    stats = StatsCounter()

    def work(ok: bool) -> None:
        for _ in range(500):
            stats.started()
            stats.add(redelivered=1)
            stats.finished(ok)

    threads = [threading.Thread(target=work, args=(n % 2 == 0,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    snapshot = stats.snapshot()
    assert (snapshot.invocations, snapshot.successes, snapshot.failures) == (4000, 2000, 2000)
    assert snapshot.in_flight == 0 and snapshot.redelivered == 4000
    assert snapshot.as_dict() == asdict(snapshot)


def test_an_unknown_counter_is_refused_and_nothing_is_counted():
    stats = StatsCounter()
    with pytest.raises(TypeError, match=r"unknown counter.*'lock_lsot'"):
        stats.add(redelivered=1, lock_lsot=1)
    assert stats.snapshot() == FunctionStats()
