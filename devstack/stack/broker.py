"""The development Service Bus broker (``devstack.servicebus.broker``) as a child process.

It writes the port it listens on to ``--port-file`` once listening; :class:`BrokerProcess`
waits for that, then for a TCP connect, and stops the broker by PID (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import base64
import importlib.util
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from devstack.servicebus import stats
from devstack.stack import processes

BROKER_MODULE = "devstack.servicebus.broker"
DEFAULT_KEY_NAME = "RootManageSharedAccessKey"
DEFAULT_CONFIG = processes.REPO_ROOT / "devstack" / "servicebus" / "Config.json"
STARTUP_TIMEOUT_S = 20.0


def random_key() -> str:
    """A fresh SAS key (base64 of 32 random bytes), like the ones Azure generates."""
    return base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def connection_string(port: int, key_name: str, key: str, host: str = "localhost") -> str:
    return (
        f"Endpoint=sb://{host}:{port};SharedAccessKeyName={key_name};"
        f"SharedAccessKey={key};UseDevelopmentEmulator=true"
    )


def broker_module_available() -> bool:
    if str(processes.REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(processes.REPO_ROOT))
    try:
        return importlib.util.find_spec(BROKER_MODULE) is not None
    except ModuleNotFoundError:
        return False


class BrokerProcess:
    """One development broker process. Use ``with BrokerProcess(...) as broker:`` or start/stop.

    The broker is started with ``sys.executable`` from the repository root; its stdout and
    stderr are written to ``log_path`` (by default in a new temporary directory).
    """

    def __init__(
        self,
        config_paths: Iterable[str | os.PathLike[str]],
        data_dir: str | os.PathLike[str] | None = None,
        key_name: str = DEFAULT_KEY_NAME,
        key: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
        *,
        host: str = "127.0.0.1",
        log_level: str = "info",
        startup_timeout: float = STARTUP_TIMEOUT_S,
    ) -> None:
        self.config_paths = [Path(p).resolve() for p in config_paths]
        if not self.config_paths:
            raise ValueError("BrokerProcess needs at least one config file")
        self.data_dir = Path(data_dir).resolve() if data_dir is not None else None
        self.key_name = key_name
        self.key = key if key is not None else random_key()
        if log_path is None:
            log_path = Path(tempfile.mkdtemp(prefix="sb-broker-")) / "broker.log"
        self.log_path = Path(log_path).resolve()
        self.port_file = self.log_path.with_name(self.log_path.stem + ".port")
        self.stats_path = self.port_file.with_suffix(stats.STATS_SUFFIX)
        """Where the broker keeps its lock counters (its default, beside the port file)."""
        self.host = host
        self.log_level = log_level
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen | None = None
        self._port: int | None = None

    # -- state -------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The exit code if the process has ended on its own, else None."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("the broker is not started")
        return self._proc.pid

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the broker has not been started yet")
        return self._port

    @property
    def connection_string(self) -> str:
        return connection_string(self.port, self.key_name, self.key)

    def log_tail(self, lines: int = 40) -> str:
        return processes.tail(self.log_path, lines)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, port: int = 0) -> BrokerProcess:
        """Start and wait until it listens: port file written, then a TCP connect succeeds."""
        if self._proc is not None:
            raise RuntimeError(f"the broker is already started (pid {self._proc.pid})")
        if not broker_module_available():
            raise processes.ServiceStartError(
                f"The development broker module {BROKER_MODULE} is not in this tree "
                "(devstack/servicebus/broker.py is missing); set "
                "use another Service Bus (see README)."
            )
        missing = [str(p) for p in self.config_paths if not p.is_file()]
        if missing:
            raise processes.ServiceStartError(f"broker config file(s) not found: {missing}")
        self.port_file.unlink(missing_ok=True)
        argv = [
            sys.executable, "-m", BROKER_MODULE,
            "--host", self.host,
            "--port", str(port),
            "--port-file", str(self.port_file),
            "--key-name", self.key_name,
            "--key", self.key,
            "--log-level", self.log_level,
        ]  # fmt: skip
        for path in self.config_paths:
            argv += ["--config", str(path)]
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            argv += ["--data-dir", str(self.data_dir)]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            stamp = time.strftime("%H:%M:%S")
            log.write(f"\n=== {stamp} starting broker on {self.host}:{port} ===\n")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(processes.REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._proc = processes.spawn(argv, log_path=self.log_path, cwd=processes.REPO_ROOT, env=env)
        started = time.monotonic()
        ready = processes.wait_until(
            lambda: self._read_port_file() is not None,
            timeout=self.startup_timeout,
            proc=self._proc,
        )
        chosen = self._read_port_file()
        if ready and chosen is not None:
            remaining = max(2.0, self.startup_timeout - (time.monotonic() - started))
            ready = processes.wait_until(
                lambda: processes.tcp_answers(self.host, chosen),
                timeout=remaining,
                proc=self._proc,
            )
        if not ready or chosen is None:
            code = self._proc.poll()
            self._stop_process()
            if code is not None:
                why = f"exited with code {code} before it was listening"
            else:
                why = f"was not listening within {self.startup_timeout:.0f} s"
            raise processes.ServiceStartError(
                f"The development broker {why}. Last lines of {self.log_path}:\n{self.log_tail()}"
            )
        self._port = chosen
        return self

    def stop(self) -> None:
        """SIGTERM, wait, SIGKILL after 5 s. Keeps ``port`` for :meth:`restart`."""
        self._stop_process()

    def restart(self, *, require_same_port: bool = False) -> BrokerProcess:
        """Stop, then start on the same port (so clients keep their connection string). The
        stopped broker's lock counters are kept beside the new one's (``stats.keep``).

        If the old port cannot be had again, start on a new one unless ``require_same_port``;
        check :attr:`port` / :attr:`connection_string` afterwards in that case.
        """
        previous = self._port
        self.stop()
        stats.keep(self.stats_path)
        if previous is None:
            return self.start()
        try:
            return self.start(port=previous)
        except processes.ServiceStartError:
            if require_same_port:
                raise
            return self.start(port=0)

    def _stop_process(self) -> None:
        if self._proc is not None:
            processes.stop(self._proc)
            self._proc = None

    def _read_port_file(self) -> int | None:
        try:
            text = self.port_file.read_text()
        except FileNotFoundError:
            return None
        if not text.endswith("\n"):  # still being written
            return None
        try:
            return int(text.strip())
        except ValueError:
            return None

    def __enter__(self) -> BrokerProcess:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self._proc.pid} port={self._port}" if self._proc else "stopped"
        return f"<BrokerProcess {state} configs={[p.name for p in self.config_paths]}>"
