"""The composition roots (service.composition, service.operations.composition): each app's entry
point builds one per process and hands it down; nothing it deploys keeps its wiring in a
module global instead; a root builds its Runtime once, on first use, and opens nothing before.
"""

from __future__ import annotations

import ast
import importlib
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from starlette.requests import Request

from adapters import clients
from adapters.archive import BlobArchive
from adapters.remote_http import RemoteHttp
from adapters.retention_settings import RetentionSettings, retention_of
from adapters.servicebus import Bus
from adapters.settings import Settings
from adapters.store.records import OrderRecords
from adapters.store.state_store import OrderStateStore
from adapters.tables import TableService
from devstack.stack.processes import REPO_ROOT
from operator_api.app import build
from operator_api.http import context
from service.circuit import BreakerRegistry, CircuitBreaker, CircuitReporter
from service.composition import PatternRoot, Root
from service.operations.composition import OperationsRoot
from service.operations.context import OperatorContext
from service.operations.summary import Summary
from service.refusing_queues import RefusingQueues
from service.runtime import Runtime
from tests.support.operations import load
from tests.unit.test_runtime import app_env

pytestmark = pytest.mark.anyio

ENTRIES = ("function_app", "operations_app")
WIRING = (
    Root, Runtime, OperatorContext, Summary, BreakerRegistry, CircuitBreaker, CircuitReporter,
    RefusingQueues, Bus, TableService, OrderStateStore, BlobArchive, RemoteHttp,
)  # fmt: skip
"""What holds a process's clients or what its invocations share: a root's, never a module's."""
PROCESS_GLOBALS = {
    # OpenTelemetry's providers are process-wide by its design (set once, read by every tracer
    # and meter): whether this process configured them, and the instruments bound to them.
    ("adapters/telemetry.py", "_configured"),
    ("adapters/metrics.py", "_bound"),
}


def deployed() -> list[ModuleType]:
    """Our modules that either app's entry point loads (what the host imports)."""
    for entry in ENTRIES:
        importlib.import_module(entry)
    ours = []
    for module in list(sys.modules.values()):
        path = Path(getattr(module, "__file__", None) or "/")
        if path.is_relative_to(REPO_ROOT) and ".venv" not in path.parts:
            top = path.relative_to(REPO_ROOT).parts[0]
            if top not in ("tests", "devstack", "benchmarks", "orderctl"):
                ours.append(module)
    return sorted(ours, key=lambda m: m.__name__)


def test_the_apps_load_the_modules_this_test_reads() -> None:
    names = {m.__name__ for m in deployed()}
    assert {"function_app", "operations_app", "service.composition", "service.runtime"} <= names


def test_no_deployed_module_rebinds_a_global_but_the_process_wide_telemetry() -> None:
    """A ``global`` is how a lazily built singleton is kept (``runtime._current`` was one)."""
    found = set()
    for module in deployed():
        path = Path(module.__file__ or "")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Global):
                found |= {(str(path.relative_to(REPO_ROOT)), name) for name in node.names}
    assert found == PROCESS_GLOBALS


def test_no_deployed_module_holds_an_object_of_the_wiring() -> None:
    """Breakers, reporters, failure memories, contexts, summaries, clients: a root's, built on
    it for the process, never a module's (``circuit._registry`` and ``apply._failures`` were)."""
    held = [
        f"{module.__name__}.{name}: {type(value).__name__}"
        for module in deployed()
        for name, value in vars(module).items()
        if isinstance(value, WIRING)
    ]
    assert held == []


def test_every_function_of_the_pattern_app_holds_the_root_it_was_built_on() -> None:
    import function_app

    first, second = PatternRoot(), PatternRoot()
    for root in (first, second):
        functions = function_app.build(root).get_functions()
        assert len(functions) == 7
        for function in functions:
            held = [c.cell_contents for c in function.get_user_function().__closure__ or ()]
            assert root in held and (first if root is second else second) not in held


def test_the_retention_timer_holds_the_root_the_operator_api_was_built_on() -> None:
    import operations_app

    first, second = OperationsRoot(), OperationsRoot()
    for root in (first, second):
        functions = operations_app.serve(build(root)).get_functions()
        (timer,) = [f for f in functions if f.get_function_name() == "retention_purge"]
        held = [c.cell_contents for c in timer.get_user_function().__closure__ or ()]
        assert root in held and (first if root is second else second) not in held


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The Service Bus clients built during the test (none is connected)."""
    built: list[Any] = []
    monkeypatch.setattr(clients, "servicebus_client", lambda *a, **k: built.append(a) or a)
    return built


async def test_a_root_builds_its_runtime_once_on_first_use_and_closes_it(made, caplog) -> None:
    caplog.set_level(logging.INFO, "runtime")
    root = PatternRoot(Settings.from_env(app_env()), instance_id="app@root-test")
    assert "runtime ready" not in caplog.text, "made when the app is imported: builds nothing"
    rt = root.runtime()
    assert root.runtime() is rt and rt.instance_id == "app@root-test"
    assert caplog.text.count("runtime ready as app@root-test") == 1
    assert made == [], "building the Runtime opens no client: the functions' loop does"
    await root.close()


async def test_only_the_operations_root_builds_the_store_that_reads_and_purges_for_operators(
    made,
) -> None:
    pattern = PatternRoot(Settings.from_env(app_env()))
    operations = OperationsRoot(Settings.from_env(app_env()))
    assert type(pattern.runtime().store) is OrderStateStore
    assert not hasattr(pattern.runtime().store, "get_timeline"), "the pattern app never reads one"
    assert isinstance(operations.runtime().store, OrderRecords)
    await pattern.close()
    await operations.close()


async def test_a_root_of_no_checked_settings_reads_the_environment_at_first_use(
    monkeypatch: pytest.MonkeyPatch, made
) -> None:
    root = PatternRoot(None)  # a tool that only indexes the functions: nothing was checked
    operations = OperationsRoot(None)
    for name, value in (app_env() | {"FAILURE_THRESHOLD": "7", "RETENTION_DAYS": "9"}).items():
        monkeypatch.setenv(name, value)
    assert root.runtime().settings.failure_threshold == 7
    assert type(root.runtime().settings) is Settings, "the purge is the operations app's"
    assert retention_of(operations.runtime().settings).days == 9
    await root.close()
    await operations.close()


async def test_the_operations_root_shares_one_context_and_closes_it_with_the_summary(
    monkeypatch: pytest.MonkeyPatch, made
) -> None:
    closed: list[object] = []

    async def close_context(self: OperatorContext) -> None:
        closed.append(self)

    async def close_summary(self: Summary, *, wait: bool = False) -> None:
        closed.append(self)

    async def close_archive(self: BlobArchive) -> None:
        closed.append(self)

    monkeypatch.setattr(OperatorContext, "close", close_context)
    monkeypatch.setattr(Summary, "close", close_summary)
    monkeypatch.setattr(BlobArchive, "close", close_archive)
    root = OperationsRoot(RetentionSettings.from_env(app_env()))
    ctx = await root.context()
    assert await root.context() is ctx and ctx.rt is root.runtime()
    archive = root.archive()
    assert ctx.archive() is archive is root.archive(), "one archive: the timer's and the API's"
    await root.close()
    assert closed == [root.summary, ctx, archive]


async def test_the_operator_api_takes_the_context_of_the_root_it_was_built_on(made) -> None:
    first = load(OperationsRoot(RetentionSettings.from_env(app_env())))
    second = load(OperationsRoot(RetentionSettings.from_env(app_env())))
    for app in (first, second):
        request = Request({"type": "http", "app": app.api, "headers": []})
        assert await context(request) is await app.root.context()
    assert await first.root.context() is not await second.root.context()
    for app in (first, second):
        await app.root.close()
