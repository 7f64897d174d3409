"""Fixtures for integration tests that stage the pattern message by message: the fake remote
services, a queue reader, app settings on fresh tables, a movable clock and a runtime.

Modules may define fixtures of the same names; theirs take precedence.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devstack.fakes.remote_services import FakeServices
from tests.support.app import Clock, QueueReader, app_settings, make_runtime
from tests.support.operations import OperationsApp, loaded


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
    return app_settings(servicebus, azurite.connection_string, fakes.url, unique_name("t"))


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
async def rt(env, clock):
    """A Scheduler's runtime on this test's tables (and its event loop: an async test's)."""
    runtime = await make_runtime(env, "scheduler", clock)
    yield runtime
    await runtime.close()


@pytest.fixture(scope="module")
def operations() -> Iterator[OperationsApp]:
    """The operations app as the worker calls it, one for the module's tests, closed after."""
    with loaded() as app:
        yield app
