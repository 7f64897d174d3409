"""The bindings the Functions host indexes match the declared queues, settings and host.json."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import sys

import pytest

from adapters.settings import (
    DEFAULT_PURGE_SCHEDULE,
    QUEUE_SETTINGS,
    SERVICEBUS_CONNECTION,
    purge_schedule,
)
from devstack.stack.processes import REPO_ROOT
from tests.support.app import EXAMPLE_SETTINGS
from tests.support.broker import entity_names, load_config

DECLARED_QUEUES = set(entity_names(load_config(REPO_ROOT / "devstack/servicebus/Config.json"))[0])


@pytest.fixture(scope="module")
def bindings() -> dict[str, list[dict]]:
    sys.modules.pop("function_app", None)
    module = importlib.import_module("function_app")
    return {
        f.get_function_name(): json.loads(f.get_function_json())["bindings"]
        for f in module.app.get_functions()
    }


def test_every_function_is_a_coroutine_function():
    """The app is async end to end: the worker awaits each function on its event loop, where the
    app's clients live (a sync function would run on the worker's thread pool, with none)."""
    sys.modules.pop("function_app", None)
    module = importlib.import_module("function_app")
    sync = [
        f.get_function_name()
        for f in module.app.get_functions()
        if not inspect.iscoroutinefunction(f.get_user_function())
    ]
    assert sync == []


def setting_of(value: str) -> str:
    match = re.fullmatch(r"%([A-Za-z0-9_]+)%", value)
    assert match, f"{value!r} must be an app setting reference (%NAME%), not a literal"
    return match.group(1)


def test_every_function_is_registered(bindings):
    assert set(bindings) == {
        "scheduler_intake",
        "scheduler_replies",
        "scheduler_commands",
        "inventory_agent",
        "payment_agent",
        "shipping_agent",
        "supervisor",
        "retention_purge",
        *OPERATOR_API_FUNCTIONS,
        *DASHBOARD_FUNCTIONS,
    }


OPERATOR_API_FUNCTIONS = {
    "operator_list_orders",
    "operator_show_order",
    "operator_resubmit_order",
    "operator_cancel_order",
    "operator_list_alerts",
    "operator_peek_alert",
    "operator_ack_alert",
    "operator_dead_letter_summary",
    "operator_list_dead_letters",
    "operator_supervisor",
    "operator_purge",
    "operator_purge_runs",
    "operator_archived_order",
    "operator_openapi",
    "operator_watch_order",
    "operator_restart_order",
    "operator_bulk_resubmit",
    "operator_bulk_cancel",
    "operator_replay_dead_letters",
    "operator_purge_dead_letters",
    "operator_dead_letter_log",
    "operator_health",
}


DASHBOARD_FUNCTIONS = {
    "dashboard_page",
    "dashboard_api_docs",
    "dashboard_static",
    "dashboard_vendor",
    "dashboard_summary",
    "dashboard_me",
    "dashboard_order_trace",
}


def test_every_http_function_requires_a_function_key(bindings):
    http = {
        name: binding
        for name, function_bindings in bindings.items()
        for binding in function_bindings
        if binding["type"] == "httpTrigger"
    }
    assert set(http) == OPERATOR_API_FUNCTIONS | DASHBOARD_FUNCTIONS
    for name, binding in http.items():
        assert binding["authLevel"] == "FUNCTION", f"{name} must need a function key"


def overlap(a: str, b: str) -> bool:
    """One URL could match both routes: as many segments, each equal or a parameter."""
    left, right = a.split("/"), b.split("/")
    return len(left) == len(right) and all(
        x == y or x.startswith("{") or y.startswith("{") for x, y in zip(left, right, strict=True)
    )


def test_overlap_sees_a_parameter_matching_a_literal():
    assert overlap("dead-letters/{queue}", "dead-letters/log")
    assert not overlap("dead-letters/{queue}", "dead-letter-log")
    assert not overlap("orders/{order_id}", "orders/{order_id}/watch")


def test_no_url_could_reach_two_http_functions(bindings):
    routes = [
        (name, method, binding["route"])
        for name, function_bindings in bindings.items()
        for binding in function_bindings
        if binding["type"] == "httpTrigger"
        for method in binding["methods"]
    ]
    clashes = [
        (a, b)
        for i, (a, method_a, route_a) in enumerate(routes)
        for b, method_b, route_b in routes[i + 1 :]
        if method_a == method_b and overlap(route_a, route_b)
    ]
    assert clashes == []
    assert ("operator_dead_letter_log", "GET", "dead-letter-log") in routes


def test_service_bus_triggers_name_declared_queues_through_settings(bindings):
    consumed = set()
    for name, function_bindings in bindings.items():
        for binding in function_bindings:
            if binding["type"] != "serviceBusTrigger":
                continue
            setting = setting_of(binding["queueName"])
            assert setting in QUEUE_SETTINGS.values(), f"{name} reads an unknown setting"
            assert binding["connection"] == SERVICEBUS_CONNECTION
            assert EXAMPLE_SETTINGS[setting] in DECLARED_QUEUES, f"{name}: queue not declared"
            consumed.add(setting)
    # Every queue the app sends to has a consumer, except the operators' alert queue.
    assert consumed == set(QUEUE_SETTINGS.values()) - {"OPERATOR_ALERTS_QUEUE"}


def test_every_queue_setting_names_a_declared_queue_and_back():
    named = {EXAMPLE_SETTINGS[setting] for setting in QUEUE_SETTINGS.values()}
    assert named <= DECLARED_QUEUES
    assert DECLARED_QUEUES - named == {"order-status"}, "the default status reply queue"


def test_supervisor_timer_reads_its_schedule_setting(bindings):
    (timer,) = bindings["supervisor"]
    assert timer["type"] == "timerTrigger"
    assert setting_of(timer["schedule"]) == "SUPERVISOR_SCHEDULE"
    assert len(EXAMPLE_SETTINGS["SUPERVISOR_SCHEDULE"].split()) == 6, "NCRONTAB has 6 fields"


def test_retention_timer_reads_its_schedule_setting(bindings):
    (timer,) = bindings["retention_purge"]
    assert timer["type"] == "timerTrigger" and timer["runOnStartup"] is False
    # Read from PURGE_SCHEDULE when the app is indexed (retention/functions.py says why);
    # the example settings leave it unset, so it is the default.
    assert timer["schedule"] == purge_schedule(os.environ) == DEFAULT_PURGE_SCHEDULE
    assert len(timer["schedule"].split()) == 6, "NCRONTAB has 6 fields"


def test_host_json_sets_the_service_bus_options():
    host = json.loads((REPO_ROOT / "host.json").read_text())
    assert host["extensionBundle"]["version"] == "[4.*, 5.0.0)"
    service_bus = host["extensions"]["serviceBus"]
    assert service_bus["autoCompleteMessages"] is True
    assert service_bus["maxConcurrentCalls"] >= 1
    assert re.fullmatch(r"\d\d:\d\d:\d\d", service_bus["maxAutoLockRenewalDuration"])
    assert "prefetchCount" in service_bus
