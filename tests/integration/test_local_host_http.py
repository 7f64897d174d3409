"""The local host serves HTTP triggers on /api/<route>, as the Functions host routes them."""

from __future__ import annotations

import importlib
import sys

import httpx
import pytest

from devstack.host import LocalHost

MODULE = "tests.integration.host_http_app.function_app"


@pytest.fixture
def host():
    sys.modules.pop(MODULE, None)  # get_functions() runs once per FunctionApp object
    local = LocalHost(importlib.import_module(MODULE), settings={}, host_json=None, http_port=0)
    local.start()
    yield local
    local.stop(timeout=2)


def test_routes_params_and_query_reach_the_function(host):
    response = httpx.get(f"{host.http.base_url}items/42?verbose=yes", timeout=5)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"item": "42", "verbose": "yes"}


def test_body_status_and_headers_come_back(host):
    response = httpx.post(f"{host.http.base_url}items/7/notes", content=b"hello", timeout=5)
    assert (response.status_code, response.content) == (201, b"hello")
    assert response.headers["x-item"] == "yes"


def test_unknown_route_wrong_method_and_failure_are_clear(host):
    missing = httpx.get(f"{host.http.base_url}nothing/here", timeout=5)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = httpx.delete(f"{host.http.base_url}items/42", timeout=5)
    assert wrong.status_code == 405 and "GET" in wrong.json()["error"]["message"]
    failed = httpx.get(f"{host.http.base_url}boom", timeout=5)
    assert failed.status_code == 500 and "boom" in failed.json()["error"]["message"]
    stats = host.stats()
    assert (stats["boom"].invocations, stats["boom"].failures) == (1, 1)
    assert stats["get_item"].invocations == 0


def test_http_triggers_are_not_served_unless_asked():
    sys.modules.pop(MODULE, None)
    local = LocalHost(importlib.import_module(MODULE), settings={}, host_json=None)
    assert not any(info.served for info in local.functions)
