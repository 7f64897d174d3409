"""What deploys never imports the development stack: adapters/ (and the agent's client on it)
import nothing from devstack/ or the tests, and nothing either app's entry point loads
(``import function_app``, ``import operations_app``), however deep, is of the development stack
or a library only requirements-dev.txt installs. And the pattern app loads nothing of the
operations app: no operator API, dashboard or operator use case, no FastAPI, no retention purge,
archive (nor the Blob SDK) or retention settings."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.stack.processes import REPO_ROOT

DEV_ONLY = ("devstack", "tests", "benchmarks")
DEV_LIBRARIES = ("httpx", "httpcore", "httptools", "typer", "rich")
MODULES = sorted([*(REPO_ROOT / "adapters").rglob("*.py"), REPO_ROOT / "service/remote_calls.py"])


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_a_deployed_module_imports_nothing_of_the_development_stack(path: Path) -> None:
    dev = {name for name in imported(path) if name.split(".")[0] in DEV_ONLY}
    assert not dev, f"{path.relative_to(REPO_ROOT)} imports {sorted(dev)}"


OPERATIONS_ONLY = (
    "operations_app", "operator_api", "dashboard", "fastapi", "starlette", "retention",
)  # fmt: skip
OPERATOR_SERVICE = (
    "service.operations", "service.listing", "adapters.queues", "service.control",
    "service.migration", "domain.operator_actions", "service.purge", "adapters.archive",
    "adapters.store.records", "adapters.store.purge_log", "domain.retention",
    "adapters.retention_settings", "azure.storage.blob",
)  # fmt: skip


def loaded_by(entry: str) -> list[str]:
    code = f"import sys, {entry}; print('\\n'.join(sorted(sys.modules)))"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()


@pytest.mark.parametrize("entry", ["function_app", "operations_app"])
def test_what_the_host_imports_loads_nothing_of_the_development_stack(entry: str) -> None:
    dev = [name for name in loaded_by(entry) if name.split(".")[0] in (*DEV_ONLY, *DEV_LIBRARIES)]
    assert not dev, f"import {entry} loads {dev}"


def test_the_pattern_app_loads_nothing_of_the_operations_app() -> None:
    loaded = loaded_by("function_app")
    operator = [
        name
        for name in loaded
        if name.split(".")[0] in OPERATIONS_ONLY or name.startswith(OPERATOR_SERVICE)
    ]
    assert not operator, f"import function_app loads {operator}"
    operations = loaded_by("operations_app")
    assert {
        "operator_api.routes", "retention.functions", "adapters.archive",
        "adapters.retention_settings", "azure.storage.blob",
    } <= set(operations)  # fmt: skip
