"""Fixtures for integration tests that stage the pattern message by message: the fake remote
services, a queue reader, app settings on fresh tables, a movable clock and a runtime.

Modules may define fixtures of the same names; theirs take precedence.
"""

from __future__ import annotations

import pytest

from agent.circuit import reset_breakers
from core.apply import forget_failures
from devstack.fakes.remote_services import FakeServices
from tests.support.app import AsyncTriggers, Clock, QueueReader, app_settings, make_runtime


@pytest.fixture(scope="module")
def fakes():
    services = FakeServices.start()
    yield services
    services.stop()


@pytest.fixture(scope="module")
def reader(servicebus):
    queue_reader = QueueReader(servicebus.connection_string)
    yield queue_reader
    queue_reader.close()


@pytest.fixture
def env(servicebus, azurite, fakes, unique_name):
    fakes.set_profile(None)
    reset_breakers()
    forget_failures()
    return app_settings(servicebus, azurite.connection_string, fakes.url, unique_name("t"))


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def rt(env, clock):
    runtime = make_runtime(env, "scheduler", clock)
    yield runtime
    runtime.close()


@pytest.fixture
def triggers(rt):
    """The async twin of ``rt`` and a loop to run the async triggers' code on."""
    side = AsyncTriggers(rt)
    yield side
    side.close()
