"""Shared fixtures: local Azurite, the development Service Bus broker, unique names.

Session fixtures start each service once per run, on ports the service picks itself, and stop
it at the end (SIGTERM, then SIGKILL after 5 s). Environment overrides start nothing:

- ``AZURE_STORAGE_CONNECTION_STRING_TESTS``: storage account to use instead of Azurite.
- ``SERVICEBUS_CONNECTION_STRING_TESTS``: Service Bus to use instead of the local broker; the
  queues of the configs in use must exist there under their declared names.

A test module that needs more broker entities than ``devstack/servicebus/Config.json`` declares
marks itself, and the session broker loads those configs too::

    pytestmark = pytest.mark.servicebus_config("tests/contract/Config.json")
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, settings

from devstack.stack.broker import BrokerProcess
from devstack.stack.processes import REPO_ROOT, ServiceStartError
from tests.support import azurite as azurite_support
from tests.support import broker as broker_support
from tests.support.azurite import StorageAccount
from tests.support.broker import ServiceBusNamespace
from tests.support.names import unique_name as _unique_name

BrokerFactory = Callable[..., BrokerProcess]
T = TypeVar("T")

# Hypothesis times each example (200 ms) and its data generation: wall-time checks that a loaded
# machine fails at random (DeadlineExceeded, Flaky, FailedHealthCheck). Speed is benchmarked;
# a test's own @settings still choose how many examples it runs.
settings.register_profile(
    "loaded-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("loaded-machine")


@pytest.fixture
def anyio_backend() -> str:
    """Async tests (``@pytest.mark.anyio``) run on asyncio, as the Functions Python worker."""
    return "asyncio"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "servicebus_config(*paths): extra broker entity configs (emulator Config.json format, "
        "paths relative to the repository root) that the session `servicebus` fixture loads",
    )


def _start(start: Callable[[], T]) -> T:
    """Run ``start``; turn a ServiceStartError into a plain failure message (no traceback)."""
    try:
        return start()
    except ServiceStartError as error:
        message = str(error)
    pytest.fail(message, pytrace=False)


# -- storage -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageAccount]:
    """In-memory Azurite (blob, queue, table) for the whole run, or the external account."""
    external = azurite_support.external_account()
    if external is not None:
        yield external
        return
    process = azurite_support.AzuriteProcess(tmp_path_factory.mktemp("azurite"))
    account = _start(process.start)
    try:
        yield account
    finally:
        process.stop()


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """``unique_name("orders") -> "orders3k9x0q2a"``: lowercase alphanumeric, unique per call."""
    return _unique_name


# -- Service Bus ---------------------------------------------------------------------------


def _requested_configs(session: pytest.Session) -> list[Path]:
    paths: list[Path] = []
    if broker_support.DEFAULT_CONFIG.is_file():
        paths.append(broker_support.DEFAULT_CONFIG)
    for item in session.items:
        for mark in item.iter_markers("servicebus_config"):
            for arg in mark.args:
                path = Path(arg)
                path = (path if path.is_absolute() else REPO_ROOT / path).resolve()
                if path not in paths:
                    paths.append(path)
    return paths


@pytest.fixture(scope="session")
def servicebus(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceBusNamespace]:
    """The session's Service Bus: a local broker on suffixed copies of the configs in use.

    Use ``servicebus.queue("orders")`` for the actual queue name, and
    ``servicebus.connection_string`` for the SDK.
    """
    configs = _requested_configs(request.session)
    external = broker_support.external_namespace(configs)
    if external is not None:
        yield external
        return
    workdir = tmp_path_factory.mktemp("servicebus")
    namespace = _start(lambda: broker_support.start_local_namespace(configs, workdir))
    try:
        yield namespace
    finally:
        assert namespace.broker is not None
        namespace.broker.stop()


@pytest.fixture(autouse=True)
def _session_broker_alive(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail clearly, with the broker's log, when the session broker has died.

    Checked before each test that uses ``servicebus`` (instead of a connection-refused error
    deep in the SDK) and after it (so the test during which it died is the one reported).
    """
    if "servicebus" not in request.fixturenames:
        yield
        return
    namespace: ServiceBusNamespace = request.getfixturevalue("servicebus")
    broker = namespace.broker

    def check(when: str) -> None:
        if broker is not None and broker.exit_code is not None:
            pytest.fail(
                f"the session Service Bus broker died {when} (exit code {broker.exit_code}). "
                f"Last lines of {broker.log_path}:\n{broker.log_tail()}",
                pytrace=False,
            )

    check("before this test")
    yield
    check("during this test")


@pytest.fixture
def broker_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerFactory]:
    """Start private brokers: ``broker_factory(config_paths, data_dir=None, **kwargs)``.

    Each call returns a started :class:`BrokerProcess` with its own random key and log file;
    all are stopped when the test ends. Configs are used as given (no name suffix).
    """
    started: list[BrokerProcess] = []
    workdir = tmp_path_factory.mktemp("broker")

    def factory(
        config_paths: list[str | os.PathLike[str]] | tuple[str | os.PathLike[str], ...],
        data_dir: str | os.PathLike[str] | None = None,
        **kwargs: object,
    ) -> BrokerProcess:
        kwargs.setdefault("log_path", workdir / f"broker-{len(started)}.log")
        broker = BrokerProcess(config_paths, data_dir, **kwargs)  # type: ignore[arg-type]
        started.append(broker)
        return _start(broker.start)

    try:
        yield factory
    finally:
        for broker in started:
            broker.stop()
