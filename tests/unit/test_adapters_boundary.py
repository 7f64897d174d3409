"""What deploys never imports the development stack: adapters/ (and the agent's client on it)
import nothing from devstack/ or the tests, however deep."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from devstack.stack.processes import REPO_ROOT

DEV_ONLY = ("devstack", "tests", "benchmarks")
MODULES = sorted([*(REPO_ROOT / "adapters").rglob("*.py"), REPO_ROOT / "agent/remote_client.py"])


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
