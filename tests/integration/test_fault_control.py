"""Faults chosen at run time outlive a crash of the fake services' process: the process the
stack restarts at the same address takes them up again, and a new stack starts afresh."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from devstack.fakes.profiles import example_profile
from devstack.stack.processes import REPO_ROOT

pytestmark = pytest.mark.integration


def start(workdir: Path, port: int) -> tuple[subprocess.Popen, int]:
    port_file = workdir / "fakes.port"
    port_file.unlink(missing_ok=True)
    process = subprocess.Popen(
        [
            sys.executable, "-m", "devstack.fakes.remote_services", "--port", str(port),
            "--port-file", str(port_file), "--profile", str(example_profile("chaotic")),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not port_file.exists():
        assert process.poll() is None, "the fake services exited"
        assert time.monotonic() < deadline, "the fake services did not start"
        time.sleep(0.05)
    return process, int(port_file.read_text())


def faults(port: int) -> dict:
    return httpx.get(f"http://127.0.0.1:{port}/_fault", timeout=5).json()


def test_a_restarted_process_keeps_the_faults_chosen_and_a_new_one_starts_afresh(tmp_path):
    first, port = start(tmp_path, 0)
    try:
        assert faults(port)["source"] == "chaotic"
        change = {"profile": {}, "source": "clean",
                  "decline_next": {"service": "payment", "count": 2}}  # fmt: skip
        assert httpx.post(f"http://127.0.0.1:{port}/_fault", json=change).status_code == 200
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)

    again, same = start(tmp_path, port)  # as `orderctl up` restarts it: the same port
    try:
        assert same == port
        kept = faults(port)
        assert (kept["source"], kept["declines_pending"]) == ("clean", {"payment": 2})
    finally:
        again.terminate()
        again.wait(10)

    fresh, other = start(tmp_path, 0)  # a new stack
    try:
        state = faults(other)
        assert (state["source"], state["declines_pending"]) == ("chaotic", {})
        assert not (tmp_path / "fakes.fault.json").exists()
    finally:
        fresh.terminate()
        fresh.wait(10)
