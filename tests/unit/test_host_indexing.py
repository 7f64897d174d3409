"""The local host's indexing, settings, host.json options and schedule arithmetic (no broker)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import types
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import azure.functions as func
import pytest
from azure.servicebus._pyamqp.aio._client_async import ReceiveClientAsync

from devstack.host import HostConfigError, LocalHost, load_settings
from devstack.host.indexing import ServiceBusTrigger, TimerTrigger, index_app
from devstack.host.ncrontab import NcrontabSchedule
from devstack.host.servicebus_runner import ClientPool, resolve_connection
from devstack.host.settings import load_servicebus_options, parse_timespan
from devstack.host.timer_runner import is_past_due, skip_missed
from devstack.stack.processes import REPO_ROOT

CONN = "Endpoint=sb://localhost:5672;SharedAccessKeyName=k;SharedAccessKey=s"


def app_with(register: Callable[[func.FunctionApp], None]) -> func.FunctionApp:
    app = func.FunctionApp()
    register(app)
    return app


def module_with(app: func.FunctionApp) -> types.ModuleType:
    module = types.ModuleType("inline_app")
    module.app = app  # type: ignore[attr-defined]
    return module


def sb_app(**trigger: object) -> func.FunctionApp:
    def register(app: func.FunctionApp) -> None:
        @app.service_bus_queue_trigger(arg_name="msg", queue_name="%Q%", connection="SB", **trigger)
        def worker(msg: func.ServiceBusMessage) -> None:
            pass

    return app_with(register)


# -- settings ------------------------------------------------------------------------------


def test_settings_file_values_are_overlaid_by_the_environment(tmp_path):
    path = tmp_path / "local.settings.json"
    path.write_text(json.dumps({"IsEncrypted": False, "Values": {"A": "file", "B": "file"}}))
    assert load_settings(path, environ={"B": "env", "C": "env"}) == {
        "A": "file",
        "B": "env",
        "C": "env",
    }
    assert load_settings(tmp_path / "missing.json", environ={"C": "env"}) == {"C": "env"}


def test_broken_settings_file_is_a_clear_error(tmp_path):
    path = tmp_path / "local.settings.json"
    path.write_text("{not json")
    with pytest.raises(HostConfigError, match=r"local.settings.json is not valid JSON"):
        load_settings(path, environ={})


def test_host_json_servicebus_options(tmp_path):
    path = tmp_path / "host.json"
    path.write_text(
        json.dumps(
            {
                "extensions": {
                    "serviceBus": {
                        "maxConcurrentCalls": 3,
                        "prefetchCount": 5,
                        "maxAutoLockRenewalDuration": "00:10:30",
                    }
                }
            }
        )
    )
    options = load_servicebus_options(path)
    assert (options.max_concurrent_calls, options.prefetch_count) == (3, 5)
    assert options.max_auto_lock_renewal_duration == 630
    assert options.auto_complete_messages is True
    assert load_servicebus_options(tmp_path / "none.json").max_concurrent_calls == 16
    assert load_servicebus_options(None).max_auto_lock_renewal_duration == 300


def test_the_projects_host_json_is_read():
    options = load_servicebus_options(REPO_ROOT / "host.json")
    assert options.auto_complete_messages is True
    assert options.max_concurrent_calls >= 1


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("00:05:00", 300), ("1.02:00:00", 93600), ("00:00:01.5", 1.5)],
)
def test_timespans(text, seconds):
    assert parse_timespan(text, what="x") == seconds


def test_bad_timespan_names_the_setting():
    with pytest.raises(HostConfigError, match=r"maxAutoLockRenewalDuration.*'5m'"):
        parse_timespan("5m", what="maxAutoLockRenewalDuration")


def test_host_json_concurrency_applies_and_override_wins(tmp_path):
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"extensions": {"serviceBus": {"maxConcurrentCalls": 3}}}))
    settings = {"Q": "orders", "SB": CONN}
    host = LocalHost(module_with(sb_app()), settings=settings, host_json=path)
    assert [(f.name, f.target, f.concurrency) for f in host.functions] == [
        ("worker", "queue=orders", 3)
    ]
    host = LocalHost(
        module_with(sb_app()), settings=settings, host_json=path, concurrency_override=7
    )
    assert [f.concurrency for f in host.functions] == [7]


def test_auto_complete_false_in_host_json_is_refused(tmp_path):
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"extensions": {"serviceBus": {"autoCompleteMessages": False}}}))
    with pytest.raises(HostConfigError, match=r"'worker'.*autoCompleteMessages=false"):
        LocalHost(module_with(sb_app()), settings={"Q": "q", "SB": CONN}, host_json=path)


# -- connections ---------------------------------------------------------------------------


def test_connection_string_and_identity_connections():
    assert resolve_connection("f", "SB", {"SB": CONN}).connection_string == CONN
    assert resolve_connection("f", "SB", {"AzureWebJobsSB": CONN}).setting == "AzureWebJobsSB"
    identity = resolve_connection(
        "f",
        "SB",
        {
            "SB__fullyQualifiedNamespace": "ns.servicebus.windows.net",
            "SB__credential": "managedidentity",
            "SB__clientId": "abc",
        },
    )
    assert identity.connection_string is None
    assert identity.fully_qualified_namespace == "ns.servicebus.windows.net"
    assert (identity.credential, identity.client_id) == ("managedidentity", "abc")


def test_missing_or_malformed_connection_is_a_clear_error():
    with pytest.raises(HostConfigError, match=r"'f'.*'SB' is not configured"):
        resolve_connection("f", "SB", {})
    with pytest.raises(HostConfigError, match=r"'f'.*'SB'.*no Endpoint="):
        resolve_connection("f", "SB", {"SB": "not-a-connection-string"})


# -- indexing ------------------------------------------------------------------------------


def test_servicebus_trigger_is_indexed_with_placeholders_resolved():
    (function,) = index_app(sb_app(), {"Q": "orders-1"})
    assert function.name == "worker"
    assert function.trigger == ServiceBusTrigger("orders-1", "SB", "message")
    assert (function.trigger_param, function.wants_context) == ("msg", False)


@pytest.mark.parametrize(
    ("trigger", "refusal"),
    [
        ({"is_sessions_enabled": True}, "isSessionsEnabled=true"),
        ({"cardinality": "many"}, "cardinality='MANY'"),
        ({"auto_complete_messages": False}, "autoCompleteMessages=false"),
    ],
)
def test_unsupported_servicebus_trigger_options_are_refused(trigger, refusal):
    with pytest.raises(HostConfigError, match=rf"'worker'.*{refusal}"):
        index_app(sb_app(**trigger), {"Q": "q"})


def test_topic_trigger_is_refused():
    def register(app: func.FunctionApp) -> None:
        @app.service_bus_topic_trigger(
            arg_name="msg", topic_name="t", subscription_name="s", connection="SB"
        )
        def on_topic(msg: func.ServiceBusMessage) -> None:
            pass

    with pytest.raises(HostConfigError, match=r"'on_topic'.*topic subscription"):
        index_app(app_with(register), {})


def test_str_and_bytes_parameters_and_context():
    def register(app: func.FunctionApp) -> None:
        @app.service_bus_queue_trigger(arg_name="body", queue_name="a", connection="SB")
        def as_text(body: str, context: func.Context) -> None:
            pass

        @app.service_bus_queue_trigger(arg_name="body", queue_name="b", connection="SB")
        def as_bytes(body: bytes) -> None:
            pass

    functions = {f.name: f for f in index_app(app_with(register), {})}
    assert isinstance(functions["as_text"].trigger, ServiceBusTrigger)
    assert functions["as_text"].trigger.body_as == "str"
    assert functions["as_text"].wants_context is True
    assert isinstance(functions["as_bytes"].trigger, ServiceBusTrigger)
    assert functions["as_bytes"].trigger.body_as == "bytes"


def test_unbound_parameter_is_refused():
    def register(app: func.FunctionApp) -> None:
        @app.service_bus_queue_trigger(arg_name="msg", queue_name="a", connection="SB")
        def needs_more(msg: func.ServiceBusMessage, extra: str) -> None:
            pass

    with pytest.raises(HostConfigError, match=r"'needs_more'.*'extra' has no binding"):
        index_app(app_with(register), {})


def test_timer_and_http_triggers():
    def register(app: func.FunctionApp) -> None:
        @app.timer_trigger(arg_name="t", schedule="%S%", run_on_startup=True)
        def tick(t: func.TimerRequest) -> None:
            pass

        @app.route(route="orders/{id}", methods=["GET"])
        def get_order(req: func.HttpRequest) -> func.HttpResponse:
            return func.HttpResponse("")

    functions = {f.name: f for f in index_app(app_with(register), {"S": "0 */5 * * * *"})}
    timer = functions["tick"].trigger
    assert isinstance(timer, TimerTrigger)
    assert (timer.schedule.expression, timer.run_on_startup) == ("0 */5 * * * *", True)
    assert functions["get_order"].trigger_type == "httpTrigger"
    assert functions["get_order"].trigger.describe() == "route=/api/orders/{id} methods=GET"


def test_http_trigger_is_logged_as_not_served(caplog):
    def register(app: func.FunctionApp) -> None:
        @app.route(route="ping")
        def ping(req: func.HttpRequest) -> func.HttpResponse:
            return func.HttpResponse("")

    host = LocalHost(module_with(app_with(register)), settings={}, host_json=None)
    assert [(f.name, f.served) for f in host.functions] == [("ping", False)]
    with caplog.at_level(logging.INFO, logger="devstack.host"):
        host.start()
        host.stop(timeout=1)
    assert "http trigger ping not served by the local host" in caplog.text


def test_bad_schedule_is_a_clear_error():
    def register(app: func.FunctionApp) -> None:
        @app.timer_trigger(arg_name="t", schedule="%S%")
        def tick(t: func.TimerRequest) -> None:
            pass

    with pytest.raises(HostConfigError, match=r"'tick'.*expected 6 fields"):
        index_app(app_with(register), {"S": "00:05:00"})


def test_subset_disabled_and_unknown_names():
    def register(app: func.FunctionApp) -> None:
        for name in ("a", "b", "c"):

            @app.function_name(name)
            @app.service_bus_queue_trigger(
                arg_name="msg", queue_name=f"%{name.upper()}%", connection="SB"
            )
            def worker(msg: func.ServiceBusMessage) -> None:
                pass

    # Only selected functions need their settings; Disabled ones are left out.
    names = [
        f.name
        for f in index_app(
            app_with(register),
            {"A": "qa", "B": "qb", "AzureWebJobs.b.Disabled": "true"},
            only={"a", "b"},
        )
    ]
    assert names == ["a"]
    with pytest.raises(HostConfigError, match=r"no function named 'zzz'.*a, b, c"):
        index_app(app_with(register), {}, only={"zzz"})


def test_second_indexing_of_one_app_object_is_explained():
    app = sb_app()
    index_app(app, {"Q": "q"})
    with pytest.raises(HostConfigError, match=r"only once per FunctionApp"):
        index_app(app, {"Q": "q"})


# -- schedules -----------------------------------------------------------------------------


def at(seconds: float) -> datetime:
    return datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC) + timedelta(seconds=seconds)


def test_ncrontab_seconds_come_first_and_five_fields_work():
    assert NcrontabSchedule("*/10 * * * * *").next_after(at(1)) == at(10)
    assert NcrontabSchedule("30 * * * * *").next_after(at(0)) == at(30)
    assert NcrontabSchedule("*/5 * * * *").next_after(at(0)) == at(300)
    with pytest.raises(ValueError, match=r"expected 6 fields"):
        NcrontabSchedule("* * * * * * 2025")
    with pytest.raises(ValueError, match=r"not a valid NCRONTAB"):
        NcrontabSchedule("99 * * * * *")


def test_skip_missed_counts_occurrences_that_fell_during_a_run():
    every_second = NcrontabSchedule("*/1 * * * * *")
    assert skip_missed(every_second, at(1), at(1.5)) == (at(2), 0)
    assert skip_missed(every_second, at(1), at(3.2)) == (at(4), 2)


def test_past_due_means_later_than_one_period():
    every_ten = NcrontabSchedule("*/10 * * * * *")
    assert not is_past_due(every_ten, at(10), at(12))
    assert not is_past_due(every_ten, at(10), at(20))
    assert is_past_due(every_ten, at(10), at(20.5))


# -- the app's own timers --------------------------------------------------------------------

_INDEX_APPS = """
import json, sys
from devstack.host.indexing import index_apps, load_app
from tests.support.app import EXAMPLE_SETTINGS
indexed = index_apps([load_app(entry) for entry in ("function_app", "operations_app")],
                     EXAMPLE_SETTINGS)
timers = {f.name: f.trigger.schedule.expression for f in indexed
          if type(f.trigger).__name__ == "TimerTrigger"}
json.dump(timers, sys.stdout)
"""


def _indexed_timers(env: dict[str, str]) -> dict[str, str]:
    """The timers of both apps as the local host indexes them (the operations app's beside its
    HTTP function), by name."""
    # A fresh interpreter: the purge's schedule is read from the environment at import.
    result = subprocess.run(
        [sys.executable, "-c", _INDEX_APPS],
        cwd=REPO_ROOT,
        env={k: v for k, v in os.environ.items() if k != "PURGE_SCHEDULE"} | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_the_local_host_indexes_the_supervisor_and_the_retention_purge():
    assert _indexed_timers({}) == {
        "supervisor": "*/15 * * * * *",  # local.settings.json.example
        "retention_purge": "0 30 2 * * *",  # the default: PURGE_SCHEDULE is not set
    }
    timers = _indexed_timers({"PURGE_SCHEDULE": "0 */5 * * * *"})
    assert timers["retention_purge"] == "0 */5 * * * *"


def test_the_hosts_receive_clients_read_their_connection_only_when_they_receive():
    """The SDK's keep-alive coroutine of a prefetch-0 receive client read its connection every
    5 s, holding the socket lock: a message arriving then waited for the receive call's own read
    to time out (devstack.host.servicebus_runner's docstring). The host switches it off."""

    class Connection:
        listened = 0

        async def listen(self, **_: object) -> None:
            Connection.listened += 1

    client = types.SimpleNamespace(
        _connection=Connection(),
        _shutdown=False,
        _keep_alive_interval=0,
        _socket_timeout=0.2,
        _link=types.SimpleNamespace(current_link_credit=1),
        _network_trace_params={},
    )
    ClientPool()  # what the host makes before its first receiver

    async def keep_alive() -> None:
        await asyncio.wait_for(ReceiveClientAsync._keep_alive_async(client), timeout=10)

    asyncio.run(keep_alive())
    assert Connection.listened == 0
