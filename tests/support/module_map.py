"""The map of the code, as the docs state it and as the code is: the repository's own modules,
what each app's entry point loads, and the module index of docs/architecture.md.

What deploys is what an entry point imports (as ``/work/shared/tools/deployed_lines.py`` and
CI's log count it): each app's entry point is imported in a process of its own, with the app
settings of ``local.settings.json.example`` and nothing else of the caller's environment, and
the repository's modules it loaded are that app's.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from devstack.stack.processes import REPO_ROOT

ENTRY_POINTS = {"pattern": "function_app", "operations": "operations_app"}
"""Each app, by the name the index uses for it, and its entry point."""
INDEX_DOC = REPO_ROOT / "docs" / "architecture.md"
INDEX_HEADING = "## Module index"
LABELS = ("both", "pattern", "operations", "on demand")
"""Which app loads a module when its entry point is imported; ``on demand``: neither, the module
is in the package and imported later (a local-only path, a CLI or a deploy check)."""

_OS_SETTINGS = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "SYSTEMROOT")
"""What an entry point's process keeps of the caller's environment: no app setting of it."""
_SKIPPED = frozenset({"node_modules", "__pycache__"})


def packages() -> list[str]:
    """The repository's top-level packages (a folder with an ``__init__.py``)."""
    return sorted(path.parent.name for path in REPO_ROOT.glob("*/__init__.py"))


@cache
def python_files() -> tuple[Path, ...]:
    """Every ``.py`` file of the repository, none under a hidden folder (.venv, .devstack...) or
    node_modules."""
    found = []
    for folder, subfolders, files in os.walk(REPO_ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in _SKIPPED]
        found += [Path(folder, name) for name in files if name.endswith(".py")]
    return tuple(sorted(found))


def module_file(dotted: str) -> Path | None:
    """The file of the repository's module ``dotted`` (a package's ``__init__.py``), if any."""
    path = REPO_ROOT.joinpath(*dotted.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def app_env() -> dict[str, str]:
    settings = json.loads((REPO_ROOT / "local.settings.json.example").read_text())["Values"]
    kept = {name: os.environ[name] for name in _OS_SETTINGS if name in os.environ}
    return {**kept, **settings}


@cache
def loaded_by(entry: str) -> frozenset[str]:
    """The repository's modules that ``import <entry>`` loads, the entry point included."""
    roots = [entry, *packages()]
    code = (
        f"import json, sys, {entry}\n"
        f"roots = {roots!r}\n"
        "print(json.dumps(sorted(n for n in sys.modules if n.split('.')[0] in roots)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=app_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise AssertionError(f"import {entry} failed with the app's settings:\n{done.stderr}")
    return frozenset(json.loads(done.stdout))


def _holds_code(path: Path) -> bool:
    """A package's ``__init__.py`` that holds only a docstring (or nothing) is no room to index."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return bool(body)


def deployed_modules() -> dict[str, str]:
    """Every module of the deployed packages (those either entry point loads from), and the
    entry points, each with its label: which app loads it (:data:`LABELS`)."""
    loaded = {app: loaded_by(entry) for app, entry in ENTRY_POINTS.items()}
    roots = {name.split(".")[0] for names in loaded.values() for name in names}
    modules = set(ENTRY_POINTS.values())
    for root in sorted(roots & set(packages())):
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            if path.name == "__init__.py" and not _holds_code(path):
                continue
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            modules.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    labels = {}
    for module in modules:
        apps = [app for app in ENTRY_POINTS if module in loaded[app]]
        labels[module] = "both" if len(apps) == 2 else apps[0] if apps else "on demand"
    return labels


@dataclass(frozen=True)
class IndexEntry:
    module: str
    label: str
    arrives_with: str | None
    """The branch that adds this module, while it is not merged (``arrives with `branch```)."""
    line: int


_ROW = re.compile(r"^\|\s*`([\w.]+)`\s*\|\s*([^|]*?)\s*\|")
_ARRIVES = re.compile(r"arrives with (?:the )?`([\w./-]+)`")


@cache
def index_entries() -> tuple[IndexEntry, ...]:
    """The rows of the module index (docs/architecture.md, "Module index"): each table row whose
    first cell is a module's name in backticks."""
    lines = INDEX_DOC.read_text(encoding="utf-8").splitlines()
    try:
        start = lines.index(INDEX_HEADING)
    except ValueError:
        raise AssertionError(f"{INDEX_DOC.name} has no {INDEX_HEADING!r} section") from None
    entries = []
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if line.startswith("## "):
            break
        row = _ROW.match(line)
        if row:
            arrives = _ARRIVES.search(line)
            entries.append(IndexEntry(row[1], row[2], arrives[1] if arrives else None, number))
    return tuple(entries)


def arriving() -> dict[str, str]:
    """Modules the index lists ahead of the branch that adds them, with that branch."""
    return {entry.module: entry.arrives_with for entry in index_entries() if entry.arrives_with}
