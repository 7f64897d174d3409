"""Fixtures of the infra checks: what the code reads, and a mutable copy of the checked files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.infra import checks

COPIED = (
    "infra",
    "azure.yaml",
    "local.settings.json.example",
    "host.json",
    "devstack/servicebus/Config.json",
)


@pytest.fixture(scope="session")
def facts() -> checks.CodeFacts:
    return checks.code_facts()


@pytest.fixture(scope="session")
def layout() -> checks.Layout:
    return checks.Layout(checks.REPO_ROOT)


@pytest.fixture
def repo_copy(tmp_path: Path) -> checks.Layout:
    """The files the checks read, copied under tmp_path (same relative paths)."""
    for relative in COPIED:
        source = checks.REPO_ROOT / relative
        target = tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    return checks.Layout(tmp_path)
