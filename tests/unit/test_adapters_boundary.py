"""What deploys never imports the development stack: adapters/ (and the agent's client on it)
import nothing from devstack/ or the tests, and nothing ``import function_app`` loads, however
deep, is of the development stack or a library only requirements-dev.txt installs."""

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


def test_what_the_host_imports_loads_nothing_of_the_development_stack() -> None:
    code = "import sys, function_app; print('\\n'.join(sorted(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    dev = [name for name in loaded if name.split(".")[0] in (*DEV_ONLY, *DEV_LIBRARIES)]
    assert not dev, f"import function_app loads {dev}"
