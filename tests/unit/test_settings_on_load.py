"""A host whose settings the app cannot honour refuses to load the app, naming the setting.

Through the local functions host (``python -m devstack.host``), as ``func start`` or Azure's
host would load function_app.py: the settings and what is built from them (the tuned
workflows) are checked at the load, so no message is received and failed on their account.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from devstack.stack import processes
from devstack.stack.processes import REPO_ROOT
from tests.support.app import EXAMPLE_SETTINGS

pytestmark = pytest.mark.timeout(300)

STARTED = "host started"


def run_host(tmp_path: Path, changes: dict[str, str]) -> tuple[int | None, str]:
    """(exit code, output) of a local host given the example settings with ``changes``; a host
    that starts is stopped at once (exit code None)."""
    values = EXAMPLE_SETTINGS | changes
    settings = tmp_path / "local.settings.json"
    settings.write_text(json.dumps({"IsEncrypted": False, "Values": values}))
    env = {  # the file's values, not this process's (a variable that is set wins over the file)
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("ServiceBusConnection", "StateStorage")) and name not in values
    }
    log = tmp_path / "host.log"
    argv = [sys.executable, "-m", "devstack.host", "--settings", str(settings)]
    proc = processes.spawn([*argv, "--http-port", "-1"], log_path=log, cwd=REPO_ROOT, env=env)
    try:
        deadline = time.monotonic() + 240  # an import on a loaded machine takes seconds
        while proc.poll() is None and STARTED not in log.read_text():
            if time.monotonic() > deadline:
                pytest.fail(f"the host neither started nor exited:\n{log.read_text()[-2000:]}")
            time.sleep(0.1)
        code = proc.poll()
    finally:
        processes.stop(proc)
    return code, log.read_text()


def test_a_step_budget_shorter_than_a_millisecond_stops_the_host_at_load(tmp_path):
    """It loaded ("host started") and then failed every invocation with "complete_by_budget
    must be positive", naming no setting (issue 39, item 5)."""
    code, output = run_host(tmp_path, {"STEP_TIMEOUT_SECONDS": "0.0000001"})
    assert STARTED not in output, output[-2000:]
    assert code == 2, output[-2000:]
    assert "the app 'function_app' did not load: STEP_TIMEOUT_SECONDS must be" in output
    assert "less than a millisecond" in output
