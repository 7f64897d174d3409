"""Checkov over infra/, once per shape of the templates: ``python -m tests.infra.scan``.

Checkov reads Bicep without evaluating a parameter or a condition: to it,
``vnetEnabled ? 'Disabled' : 'Enabled'`` is neither value, so a check on it passes or fails by
accident. Each shape (:data:`tests.infra.checks.SHAPES`) is therefore rendered first, into a copy
of infra/ that says what that shape deploys:

- every ``vnetEnabled ? A : B`` (A and B a quoted string or a name) becomes the branch the shape
  takes; any other use of the parameter than passing it on (``vnetEnabled: vnetEnabled``), a
  module condition (``if (vnetEnabled)``) or its declaration fails the render, so nothing is left
  for Checkov to misread;
- the files the shape does not deploy are left out (:meth:`checks.Infra.deployed`);
- an inline skip whose reason starts ``<shape> shape only:`` stays in that shape's copy only:
  in the others Checkov must pass the check itself.

Then Checkov (``.venv-checkov``, made by scripts/bootstrap) scans each copy, and the copy again
without its skips: a skip that skips no failure is stale, and fails the scan like a failed check
(a skip is a reviewed exception, not a blanket). One line per shape says what Checkov passed,
failed and skipped, and which files it could not parse; the exit status is 1 when a check failed,
a skip was stale or a file was not parsed in any shape, 2 when Checkov could not run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.infra import checks

CHECKOV = Path(os.environ.get("CHECKOV", checks.REPO_ROOT / ".venv-checkov" / "bin" / "checkov"))
_OPERAND = r"'(?:[^'\\\n]|\\.)*'|[A-Za-z_][\w.]*"
_FOLD = re.compile(
    # A whole expression (a property's value, a variable's, an argument), never part of one:
    # `a == vnetEnabled ? x : y` or `vnetEnabled ? x : y && z` means something else.
    rf"(?P<lead>(?:^|[:(\[,{{]|(?<![=!<>])=)\s*){checks.SHAPE_PARAMETER}\s*\?\s*"
    rf"(?P<a>{_OPERAND})\s*:\s*(?P<b>{_OPERAND})(?=\s*(?:$|[,)\]}}]))"
)
_KEPT = (
    # Uses of the shape parameter that say nothing Checkov reads.
    re.compile(rf"^\s*param {checks.SHAPE_PARAMETER} bool\b"),
    re.compile(rf"^\s*{checks.SHAPE_PARAMETER}: {checks.SHAPE_PARAMETER}\s*$"),
    re.compile(rf"^module \w+ '[^']+' = if \({checks.SHAPE_PARAMETER}\) \{{\s*$"),
    re.compile(rf"^output \w+ bool = {checks.SHAPE_PARAMETER}\s*$"),
)
_SKIP_FOR_SHAPE = re.compile(r"checkov:skip=[\w,-]+:\s*(?P<shape>\w+) shape only:")


class RenderError(Exception):
    """A template uses the shape parameter in a way the render cannot fold."""


def render_text(text: str, shape: str, where: str = "") -> str:
    """One template as ``shape`` deploys it (see the module's doc)."""
    value = checks.SHAPES[shape][checks.SHAPE_PARAMETER]
    lines = []
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        skip = _SKIP_FOR_SHAPE.search(line)
        if skip and skip["shape"] != shape:
            if skip["shape"] not in checks.SHAPES:
                raise RenderError(f"{where}:{number}: no shape {skip['shape']!r}")
            continue
        code, _, comment = line.partition("//")
        code = _FOLD.sub(lambda m: m["lead"] + (m["a"] if value else m["b"]), code)
        if re.search(rf"(?<![\w.]){checks.SHAPE_PARAMETER}\b", code) and not any(
            kept.match(code) for kept in _KEPT
        ):
            raise RenderError(
                f"{where}:{number}: cannot fold this use of {checks.SHAPE_PARAMETER} for "
                f"Checkov: write it as `{checks.SHAPE_PARAMETER} ? A : B` with A and B a quoted "
                f"string or a name (a variable), on one line\n    {line.strip()}"
            )
        lines.append(code + ("//" + comment if comment else ""))
    return "".join(lines)


def render(root: Path, shape: str, target: Path) -> list[Path]:
    """infra/ of ``root`` as ``shape`` deploys it, written under ``target``; the files written."""
    layout = checks.Layout(root, shape)
    infra = checks.Infra.load(layout)
    written = []
    for path in checks.bicep_files(layout.infra):
        bicep = infra.files[path.resolve()]
        if not infra.deployed(bicep):
            continue
        relative = path.relative_to(layout.infra)
        out = target / relative
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_text(path.read_text(encoding="utf-8"), shape, str(relative)))
        written.append(out)
    for path in layout.infra.rglob("*"):  # what the templates load (abbreviations, workbook)
        if path.is_file() and path.suffix in (".json", ".txt"):
            out = target / path.relative_to(layout.infra)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, out)
    return written


@dataclass(frozen=True)
class Scan:
    shape: str
    files: int
    passed: int
    failed: list[str]
    skipped: int
    not_parsed: list[str]
    resources: int
    stale: list[str]
    """Skips of a check that passes without them."""

    def line(self) -> str:
        return (
            f"checkov, {self.shape} shape ({self.files} files, {self.resources} resources): "
            f"{self.passed} passed, {len(self.failed)} failed, {self.skipped} skipped, "
            f"{len(self.not_parsed)} files not parsed, {len(self.stale)} stale skips"
        )


def scan(root: Path, shape: str, workdir: Path) -> Scan:
    """Render ``shape`` under ``workdir`` and run Checkov over it, with and without its skips."""
    target = workdir / shape / "infra"
    files = render(root, shape, target)
    summary, results = checkov(target)
    unskipped = workdir / shape / "unskipped"
    shutil.copytree(target, unskipped)
    for path in unskipped.rglob("*.bicep"):
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        path.write_text("".join(line for line in lines if "checkov:skip=" not in line))
    _, without_skips = checkov(unskipped)
    failing = {_finding(c) for c in without_skips.get("failed_checks") or []}
    not_parsed = [
        str(Path(p).relative_to(target)) if Path(p).is_relative_to(target) else p
        for p in results.get("parsing_errors") or []
    ]
    if summary.get("parsing_errors") and not not_parsed:
        not_parsed = [f"{summary['parsing_errors']} file(s)"]
    return Scan(
        shape=shape,
        files=len(files),
        passed=summary.get("passed", 0),
        failed=sorted(_finding(c) for c in results.get("failed_checks") or []),
        skipped=summary.get("skipped", 0),
        not_parsed=not_parsed,
        resources=summary.get("resource_count", 0),
        stale=sorted(
            _finding(c) for c in results.get("skipped_checks") or [] if _finding(c) not in failing
        ),
    )


def _finding(check: dict) -> str:
    where = check["file_path"].lstrip("/")
    return f"{check['check_id']} {check['resource']} ({where}): {check['check_name']}"


def checkov(directory: Path) -> tuple[dict, dict]:
    """(summary, results) of Checkov's Bicep scan of ``directory``."""
    command = [
        str(CHECKOV),
        "--directory",
        str(directory),
        "--framework",
        "bicep",
        "--skip-download",  # no network: no Prisma Cloud guidelines, nothing sent anywhere
        "--output",
        "json",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    try:
        report = json.loads(result.stdout)
    except ValueError:
        raise RuntimeError(
            f"Checkov printed no report (exit {result.returncode}):\n{result.stderr[-3000:]}"
        ) from None
    reports = report if isinstance(report, list) else [report]
    bicep = next((r for r in reports if r.get("check_type") == "bicep"), None)
    if bicep is None:
        raise RuntimeError(f"Checkov scanned no Bicep in {directory}: {result.stdout[:500]}")
    return bicep.get("summary") or {}, bicep.get("results") or {}


def main(root: Path = checks.REPO_ROOT) -> int:
    if not CHECKOV.exists():
        print(f"scan: {CHECKOV} not found: run scripts/bootstrap", file=sys.stderr)
        return 2
    scans = []
    with tempfile.TemporaryDirectory(prefix="checkov-") as workdir:
        for shape in checks.SHAPES:
            try:
                scans.append(scan(root, shape, Path(workdir)))
            except (RenderError, checks.CheckError, RuntimeError) as error:
                print(f"scan: {shape} shape: {error}", file=sys.stderr)
                return 2
    for result in scans:
        print(result.line())
        for failure in result.failed:
            print(f"  failed: {failure}")
        for path in result.not_parsed:
            print(f"  not parsed: {path}")
        for finding in result.stale:
            print(f"  stale skip (the check passes without it): {finding}")
    bad = [s for s in scans if s.failed or s.not_parsed or s.stale]
    if bad:
        print(
            "scan: fix the template, or skip the check inline in its resource with the reason "
            "(// checkov:skip=CKV_AZURE_n: why); a file Checkov cannot parse is a failure, and "
            "so is a skip of a check that passes",
            file=sys.stderr,
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
