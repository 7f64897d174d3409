"""The bindings the Functions host indexes match the declared queues, settings and host.json: the
pattern app's (function_app.py: Service Bus and timer triggers, no HTTP trigger) and the
operations app's (operations_app.py: one HTTP function that hands every request to FastAPI, and
the retention purge's timer)."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import sys
from typing import Any

import pytest

from adapters.retention_settings import DEFAULT_PURGE_SCHEDULE, purge_schedule
from adapters.settings import (
    QUEUE_SETTINGS,
    SERVICEBUS_CONNECTION,
)
from devstack.stack.processes import REPO_ROOT
from tests.support.app import EXAMPLE_SETTINGS
from tests.support.broker import entity_names, load_config

DECLARED_QUEUES = set(entity_names(load_config(REPO_ROOT / "devstack/servicebus/Config.json"))[0])


def indexed(entry: str) -> dict[str, Any]:
    """The functions of the app ``entry`` (function_app, operations_app), by name, as the host
    indexes them (a fresh import: ``get_functions()`` runs once per FunctionApp object)."""
    sys.modules.pop(entry, None)
    return {f.get_function_name(): f for f in importlib.import_module(entry).app.get_functions()}


def bindings_of(entry: str) -> dict[str, list[dict]]:
    return {
        name: json.loads(f.get_function_json())["bindings"] for name, f in indexed(entry).items()
    }


@pytest.fixture(scope="module")
def bindings() -> dict[str, list[dict]]:
    return bindings_of("function_app")


@pytest.mark.parametrize("entry", ["function_app", "operations_app"])
def test_every_function_is_a_coroutine_function(entry):
    """The app is async end to end: the worker awaits each function on its event loop, where the
    app's clients live (a sync function would run on the worker's thread pool, with none)."""
    user_functions = {name: f.get_user_function() for name, f in indexed(entry).items()}
    sync = [name for name, f in user_functions.items() if not inspect.iscoroutinefunction(f)]
    assert user_functions and sync == []


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
    }


def test_the_pattern_app_has_no_http_trigger(bindings):
    """Its instances scale with the queues and serve no request from outside."""
    kinds = {binding["type"] for function in bindings.values() for binding in function}
    assert kinds == {"serviceBusTrigger", "timerTrigger"}


def test_the_operations_app_is_one_http_function_that_needs_a_function_key_and_a_timer():
    operations = bindings_of("operations_app")
    assert set(operations) == {"http_app_func", "retention_purge"}
    trigger, answer = operations["http_app_func"]
    assert (trigger["type"], trigger["route"], trigger["authLevel"]) == (
        "httpTrigger",
        "/{*route}",
        "FUNCTION",
    )
    assert answer["type"] == "http"
    (timer,) = operations["retention_purge"]
    assert timer["type"] == "timerTrigger"


def routes() -> list[tuple[str, str, str]]:
    """(name, method, path under /api/) of every route of the operations app."""
    from fastapi.routing import APIRoute

    from dashboard.routes import router as dashboard
    from operator_api.http import router as operator_api

    return [
        (route.name, method, route.path.lstrip("/"))
        for router in (operator_api, dashboard)
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    ]


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


def test_no_url_could_reach_two_routes():
    found = routes()
    clashes = [
        (a, b)
        for i, (a, method_a, route_a) in enumerate(found)
        for b, method_b, route_b in found[i + 1 :]
        if method_a == method_b and overlap(route_a, route_b)
    ]
    assert clashes == []
    assert ("dead_letter_log", "GET", "dead-letter-log") in found
    assert ("dashboard_page", "GET", "dashboard") in found


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


def test_retention_timer_reads_its_schedule_setting():
    (timer,) = bindings_of("operations_app")["retention_purge"]
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
