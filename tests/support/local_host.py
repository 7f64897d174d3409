"""For tests of the local functions host (devstack.host) with an app of their own: a fresh copy
of the app's module for each host (a FunctionApp may be indexed once), and waiting, without an
event loop, for what the host's threads bring about."""

from __future__ import annotations

import importlib.util
import time
import types
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest


def fresh_module(path: Path) -> types.ModuleType:
    """The module at ``path`` loaded again under a new name: its own FunctionApp and records."""
    spec = importlib.util.spec_from_file_location(f"{path.parent.name}_{uuid.uuid4().hex}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Polls ``predicate`` until it holds; the test fails, naming ``what``, after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)
