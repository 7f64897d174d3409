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
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    detached: bool = False,
) -> subprocess.Popen:
    """Start ``argv`` with stdout and stderr written to a fresh ``log_path``; register it for
    cleanup. Logs left by earlier starts are appended to ``<log>.1``, oldest first: readiness
    is read from the log, and lines of an earlier run must never pass for this one's.

    ``detached``: the process outlives this one (no death signal, no atexit sweep); whoever
    stops it later does so by its PID (`orderctl down`)."""
    rotate_log(log_path)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=None if detached else _die_with_parent(os.getpid()),
        )
    if not detached:
        _live[proc.pid] = proc
    return proc


def rotate_log(log_path: Path) -> None:
    """Append ``log_path`` to ``<log>.1`` and remove it, so the next writer starts fresh."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if log_path.exists():
        with open(log_path.with_name(log_path.name + ".1"), "ab") as earlier:
            earlier.write(log_path.read_bytes())
        log_path.unlink()


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


def stop_all(procs: Sequence[subprocess.Popen], grace: float = DEFAULT_STOP_GRACE_S) -> None:
    """:func:`stop` for several processes at once: all are sent SIGTERM together, so their
    graceful shutdowns overlap (the wait is the slowest one's, not the sum of them); any still
    running ``grace`` seconds later is SIGKILLed."""
    for proc in procs:
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=10)
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


def pid_alive(pid: int) -> bool:
    """True while a process with this PID exists (a zombie counts as gone)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def ours(pid: int) -> bool:
    """True when ``pid`` runs this stack's code (devstack, Azurite or orderctl): a PID recorded
    long ago may belong to another program by now, which must never be signalled."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no procfs: cannot tell, trust the record
    except OSError:
        return False
    return any(mark in argv for mark in (b"devstack", b"azurite", b"orderctl"))


def terminate(pid: int, grace: float = DEFAULT_STOP_GRACE_S) -> bool:
    """Stop a process we did not start (by PID, and its process group if it leads one):
    SIGTERM, wait up to ``grace`` seconds, then SIGKILL. True if it is gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not pid_alive(pid):
            return True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        wait_until(lambda: not pid_alive(pid), timeout=grace if sig == signal.SIGTERM else 5)
    return not pid_alive(pid)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``port`` can be bound now (as a server with SO_REUSEADDR would bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def choose_port(
    preferred: int, is_free: Callable[[int], bool], *, tries: int = 100, avoid: Iterable[int] = ()
) -> int:
    """``preferred`` if free, else the next free port above it (``func start`` serves on 7071;
    a second stack on this machine gets 7072). 0 means "any free port"."""
    skip = set(avoid)
    if preferred == 0:
        return free_port()
    for port in range(preferred, min(preferred + tries, 65536)):
        if port not in skip and is_free(port):
            return port
    raise ServiceStartError(
        f"no free port in {preferred}-{preferred + tries - 1}: stop what listens there, "
        "or choose another with --api-port"
    )


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
