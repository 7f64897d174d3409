"""Starting, watching and stopping the local stack's processes, without leaking any.

Every process started through :func:`spawn` is:

- in its own session (process group), so stopping it also stops anything it started;
- killed by the kernel if the thread that started it dies (Linux ``PR_SET_PDEATHSIG``), so a
  test run or `orderctl up` that is killed outright does not leave servers behind;
- registered for an ``atexit`` sweep, in case a fixture's teardown never ran.

Owners still stop their processes explicitly with :func:`stop`; the last two are safety nets.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

DEFAULT_STOP_GRACE_S = 5.0


class ServiceStartError(RuntimeError):
    """A helper service could not be started; the message says why and what to do."""


_live: dict[int, subprocess.Popen] = {}


def _kill_leftovers() -> None:
    for proc in list(_live.values()):
        stop(proc, grace=1.0)


atexit.register(_kill_leftovers)


def _die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None

    def preexec() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        except Exception:
            return
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen:
    """Start ``argv`` with stdout and stderr written to a fresh ``log_path``; register it for
    cleanup. Logs left by earlier starts are appended to ``<log>.1``, oldest first: readiness
    is read from the log, and lines of an earlier run must never pass for this one's."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if log_path.exists():
        with open(log_path.with_name(log_path.name + ".1"), "ab") as earlier:
            earlier.write(log_path.read_bytes())
        log_path.unlink()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent(os.getpid()),
        )
    _live[proc.pid] = proc
    return proc


def stop(proc: subprocess.Popen, grace: float = DEFAULT_STOP_GRACE_S) -> int | None:
    """SIGTERM the process group, wait up to ``grace`` seconds, then SIGKILL. Returns exit code."""
    try:
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=10)
        return proc.returncode
    finally:
        _live.pop(proc.pid, None)


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, or a note that it is missing or empty."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log file at {path})"
    if not text.strip():
        return f"(log file {path} is empty)"
    return "\n".join(text.splitlines()[-lines:])


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0, read it back, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def tcp_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(
    condition: Callable[[], bool],
    *,
    timeout: float,
    proc: subprocess.Popen | None = None,
    interval: float = 0.05,
) -> bool:
    """Poll ``condition`` until it holds (True), the time is up or ``proc`` exited (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if proc is not None and proc.poll() is not None:
            return condition()
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def http_answers(url: str, timeout: float = 1.0) -> bool:
    """True when anything answers ``url`` with an HTTP response, whatever its status."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False
