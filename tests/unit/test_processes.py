"""Process launching for the local stack: a second start never reads the first one's log."""

from __future__ import annotations

import sys

from devstack.stack import processes


def test_each_start_writes_a_fresh_log_and_keeps_the_last_one(tmp_path):
    log = tmp_path / "service.log"
    for word in ("first", "second"):
        proc = processes.spawn([sys.executable, "-c", f"print('{word} run ready')"], log_path=log)
        proc.wait(timeout=30)
    assert log.read_text() == "second run ready\n"
    assert (tmp_path / "service.log.1").read_text() == "first run ready\n"


def test_the_preferred_port_or_the_next_free_one():
    taken = {7071, 7072}
    assert processes.choose_port(7071, lambda p: p not in taken) == 7073
    assert processes.choose_port(7071, lambda p: True, avoid=[7071]) == 7072
    assert processes.choose_port(0, lambda p: False) > 0  # any free port


def test_no_free_port_says_what_to_do():
    import pytest

    with pytest.raises(processes.ServiceStartError, match="--api-port"):
        processes.choose_port(7071, lambda p: False, tries=3)


def test_terminate_stops_a_process_by_pid_but_only_ours(tmp_path):
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)  # devstack test"]
    proc = processes.spawn(sleeper, log_path=tmp_path / "sleeper.log", detached=True)
    try:
        # Until the child has exec'd, /proc shows the parent's command line (pytest's).
        assert processes.wait_until(lambda: processes.ours(proc.pid), timeout=30)
        assert processes.pid_alive(proc.pid)
        assert processes.terminate(proc.pid, grace=5)
        proc.wait(timeout=30)
        assert not processes.pid_alive(proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not processes.ours(1)  # init runs no devstack code
