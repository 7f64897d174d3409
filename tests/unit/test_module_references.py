"""No reference to a module that does not exist: the docstrings and comments of every ``.py`` file
and the Markdown of docs/, the README and CONTRIBUTING.md name only modules (and their names)
that are there.

A reference is a dotted name rooted at one of the repository's packages, or at one it once had
(``core``, split into domain/, service/ and adapters/), in any form: ``service.apply``,
:mod:`service.apply`, :func:`service.apply.carry_out` (the name after the module must be defined
in it, or be a submodule of it); or a path to a ``.py`` file under those packages
(``service/apply.py``). Dotted names that are not modules by nature are told apart by what they
are: the app's metric names, the loggers the code names, file names (``dashboard.md``), a DNS
suffix. A module the module index lists ahead of its branch ("arrives with") may be named."""

from __future__ import annotations

import ast
import io
import itertools
import re
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from adapters import metrics
from devstack.stack.processes import REPO_ROOT
from service import sweep_report
from tests.support import module_map

FORMER_PACKAGES = ("core",)
"""Top-level packages the repository once had: every reference to them is stale."""
HISTORY = {
    "docs/performance.md": "a log of measured work, oldest first; as its opening says, each "
    "section names the tree as it was then",
}
"""Documents that name past modules on purpose, and why."""
DNS_SUFFIXES = frozenset({"core.windows.net"})
FILE_SUFFIXES = frozenset({"md", "py", "json", "jsonl", "log", "pid", "txt", "html", "js", "yml"})

ROOTS = "|".join(sorted({*module_map.packages(), *FORMER_PACKAGES}))
DOTTED = re.compile(rf"(?<![\w./-])((?:{ROOTS})(?:\.[A-Za-z_]\w*)+)")
PATH = re.compile(rf"(?<![\w./-])((?:{ROOTS})(?:/\w+)*\.py)\b")
LOGGER = re.compile(r"getLogger\(\s*[\"']([\w.]+)[\"']\s*\)")


def test_no_reference_names_a_module_that_does_not_exist() -> None:
    found = [
        f"{name}:{number}: {reference}"
        for name, number, line in prose()
        for reference in stale_in(line)
    ]
    assert not found, "references to modules (or names) that do not exist:\n" + "\n".join(found)


def test_the_check_sees_each_form_of_reference(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        '"""See :mod:`core.aio.inbound` and :func:`service.apply.no_such_function`."""\n'
        "# service/no_such_module.py, and service.apply.carry_out, which exists\n"
        'X = 1\n"""adapters.no_such_module."""\n'
        "service.apply.not_in_prose = 1\n"
    )
    lines = [line for _, line in prose_of_python(planted)]
    assert {m[1]: bool(stale(m[1])) for line in lines for m in DOTTED.finditer(line)} == {
        "core.aio.inbound": True,
        "service.apply.no_such_function": True,
        "service.apply.carry_out": False,
        "adapters.no_such_module": True,
    }
    assert [m[1] for line in lines for m in PATH.finditer(line)] == ["service/no_such_module.py"]
    assert not stale("agent.circuit.state"), "a metric name is no module reference"
    assert not stale("operator_api.audit"), "nor is a logger's name"


def prose() -> Iterator[tuple[str, int, str]]:
    """Every line of prose the check reads, with its file (relative) and line number. A module is
    parsed only if one of its lines, code included, names something that does not exist: most
    name only what does, and parsing them all would take seconds."""
    for path in module_map.python_files():
        if stale_in(source(path)):
            for number, line in prose_of_python(path):
                yield str(path.relative_to(REPO_ROOT)), number, line
    documents = [*sorted((REPO_ROOT / "docs").rglob("*.md")), REPO_ROOT / "README.md"]
    for path in [*documents, REPO_ROOT / "CONTRIBUTING.md"]:
        name = str(path.relative_to(REPO_ROOT))
        if name not in HISTORY:
            for number, line in enumerate(source(path).splitlines(), 1):
                yield name, number, line


def prose_of_python(path: Path) -> Iterator[tuple[int, str]]:
    """Each line of a module's comments and docstrings (a module's, a class's, a function's, and
    the string after an assignment that documents it), with its line number."""
    text = source(path)
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    documented_by_docstring = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    for node in ast.walk(ast.parse(text, str(path))):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        documented = body[:1] if isinstance(node, documented_by_docstring) else []
        documented += [
            after
            for before, after in itertools.pairwise(body)
            if isinstance(before, ast.Assign | ast.AnnAssign)
        ]
        for statement in documented:
            doc = getattr(getattr(statement, "value", None), "value", None)
            if isinstance(statement, ast.Expr) and isinstance(doc, str):
                for offset, line in enumerate(doc.splitlines()):
                    yield statement.lineno + offset, line


def stale_in(line: str) -> list[str]:
    """Each reference in ``line`` to what does not exist, with why."""
    found = [f"{m[1]} ({why})" for m in DOTTED.finditer(line) if (why := stale(m[1]))]
    for match in PATH.finditer(line):
        module = match[1].removesuffix(".py").replace("/", ".")
        if module_map.module_file(module) is None and module not in module_map.arriving():
            found.append(f"{match[1]} (no such file)")
    return found


def stale(dotted: str) -> str | None:
    """Why ``dotted`` names nothing that exists, or None if it does (or is no module's name)."""
    parts = dotted.split(".")
    if dotted in not_modules() or parts[-1] in FILE_SUFFIXES:
        return None
    if dotted in module_map.arriving() or ".".join(parts[:-1]) in module_map.arriving():
        return None
    for end in range(len(parts), 0, -1):
        path = module_map.module_file(".".join(parts[:end]))
        if path is not None:
            if end == len(parts) or parts[end] in defined_in(path):
                return None
            return f"{'.'.join(parts[:end])} defines no {parts[end]!r}"
    return f"there is no module {parts[0]!r}"


@cache
def not_modules() -> frozenset[str]:
    """Dotted names that start as a package's name and are no reference to it: the metric names
    (the ``agent.`` and ``supervisor.`` instruments), the loggers the code names
    (``operator_api.audit``), Azure Storage's DNS suffix."""
    loggers = {name for path in module_map.python_files() for name in LOGGER.findall(source(path))}
    return metrics.NAMES | sweep_report.NAMES | loggers | DNS_SUFFIXES


@cache
def defined_in(path: Path) -> frozenset[str]:
    """The names a module defines or imports at its top level (under ``if``/``try`` too)."""
    names: set[str] = set()
    for node in ast.parse(source(path)).body:
        for inner in ast.walk(node) if isinstance(node, ast.If | ast.Try) else [node]:
            if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(inner.name)
            elif isinstance(inner, ast.Import | ast.ImportFrom):
                names.update((alias.asname or alias.name).split(".")[0] for alias in inner.names)
            elif isinstance(inner, ast.Assign | ast.AnnAssign):
                targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                for target in targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return frozenset(names)


@cache
def source(path: Path) -> str:
    return path.read_text(encoding="utf-8")
