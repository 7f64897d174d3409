"""`orderctl up --detach`, as a user runs it: twice in a row, a killed host restarted at the
same operator API address, `down` stopping every process, and a second stack in the same
workdir. Also two demos in a row in one workdir (each start must read its own logs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack.stack.processes import REPO_ROOT, pid_alive, terminate
from orderctl.output import validate

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(400)]


def orderctl(workdir: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orderctl.cli", *args, "--workdir", str(workdir)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def as_json(command: str, result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    document = json.loads(result.stdout)
    validate(command, document)
    return document


def pids(view: dict) -> set[int]:
    return {view["supervisor_pid"], *(c["pid"] for c in view["components"])} - {0}


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A stack's workdir; whatever the test left running is stopped, even on failure."""
    workdir = tmp_path / "stack"
    yield workdir
    leftover = orderctl(workdir, "ps", "--json")
    orderctl(workdir, "down", timeout=120)
    if leftover.returncode == 0 and leftover.stdout.strip():
        for pid in pids(json.loads(leftover.stdout)):
            terminate(pid, grace=2)


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_detached_stack_restarts_a_killed_host_at_the_same_address(workdir):
    first = as_json("up", orderctl(workdir, "up", "--detach", "--json"))
    api = first["api_url"]
    assert first["running"] and not first["already_running"] and api
    assert httpx.get(f"{api}supervisor", timeout=10).status_code == 200

    again = as_json("up", orderctl(workdir, "up", "--detach", "--json"))
    assert again["already_running"] is True
    assert (again["supervisor_pid"], again["api_url"]) == (first["supervisor_pid"], api)

    # A pattern host, then the operations app's host (the operator HTTP API): each comes back,
    # and the API at the same address.
    for name in ("host-0", "operations"):
        host = next(c for c in first["components"] if c["name"] == name)
        os.kill(host["pid"], signal.SIGKILL)

        def restarted(name: str = name, pid: int = host["pid"]) -> dict | None:
            view = as_json("ps", orderctl(workdir, "ps", "--json"))
            now = next(c for c in view["components"] if c["name"] == name)
            return view if now["running"] and now["pid"] != pid else None

        view = wait_for(restarted, 90, f"{name} to be restarted")
        assert view["api_url"] == api
        assert next(c for c in view["components"] if c["name"] == name)["restarts"] == 1
        assert httpx.get(f"{api}supervisor", timeout=10).status_code == 200
        log = (workdir / "supervisor.log").read_text()
        assert f"{name} exited: killed by SIGKILL" in log and f"{name} restarted" in log

    running = pids(view)
    down = as_json("down", orderctl(workdir, "down", "--json"))
    assert down["was_running"] and down["stopped"]["supervisor"] == view["supervisor_pid"]
    assert not [pid for pid in running if pid_alive(pid)], "down leaves nothing running"
    assert not (workdir / "stack.json").exists()

    second = as_json("up", orderctl(workdir, "up", "--detach", "--json"))
    assert second["running"] and not second["already_running"]
    assert "host started" in (workdir / "host-0.log").read_text()
    assert (workdir / "host-0.log.1").is_file(), "the first stack's log is kept"
    as_json("down", orderctl(workdir, "down", "--json"))
    assert not [pid for pid in pids(second) if pid_alive(pid)]


def test_two_demos_in_a_row_in_one_workdir(workdir):
    for run in (1, 2):
        result = orderctl(
            workdir, "demo", "--orders", "4", "--profile", "clean", "--hosts", "1",
            "--timeout", "120", "--json", "-",
        )  # fmt: skip
        summary = as_json("demo", result)
        assert summary["all_terminal"] and summary["processed"] == 4, (run, summary)
    assert not (workdir / "stack.json").exists(), "each demo stops the stack it started"
