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
