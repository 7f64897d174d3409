"""The development Service Bus broker (``devstack.servicebus.broker``) as a test process.

Command-line contract of the broker, which this module codes against::

    python -m devstack.servicebus.broker --host 127.0.0.1 --port 0 \\
        --config PATH [--config PATH ...] --port-file PATH [--data-dir DIR] \\
        [--key-name NAME] [--key KEY] [--log-level info]

It writes the port it listens on (decimal, then a newline) to ``--port-file`` only once it is
listening, and exits on SIGTERM within about 2 s.

Entity configs use the official Service Bus emulator's ``Config.json`` format.
:func:`write_suffixed_config` writes a copy in which every queue and topic name carries a
per-run suffix, so runs against a shared or persistent broker never see each other's messages.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tests.support import processes

BROKER_MODULE = "devstack.servicebus.broker"
DEFAULT_KEY_NAME = "RootManageSharedAccessKey"
DEFAULT_CONFIG = processes.REPO_ROOT / "devstack" / "servicebus" / "Config.json"
EXTERNAL_ENV_VAR = "SERVICEBUS_CONNECTION_STRING_TESTS"
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
    stderr are appended to ``log_path`` (by default in a new temporary directory).
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
                f"{EXTERNAL_ENV_VAR} to test against another Service Bus."
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
        """Stop, then start on the same port (so clients keep their connection string).

        If the old port cannot be had again, start on a new one unless ``require_same_port``;
        check :attr:`port` / :attr:`connection_string` afterwards in that case.
        """
        previous = self._port
        self.stop()
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


# -- entity configs ------------------------------------------------------------------------


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def entity_names(config: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(queue names, topic names) declared in an emulator-format config."""
    queues: list[str] = []
    topics: list[str] = []
    for ns in config.get("UserConfig", {}).get("Namespaces", []):
        queues += [q["Name"] for q in ns.get("Queues", [])]
        topics += [t["Name"] for t in ns.get("Topics", [])]
    return queues, topics


def suffixed(name: str, suffix: str) -> str:
    return f"{name}-{suffix}" if suffix else name


def write_suffixed_config(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], suffix: str
) -> dict[str, str]:
    """Copy ``src`` to ``dst`` with ``-suffix`` on every queue and topic name.

    ``ForwardTo`` and ``ForwardDeadLetteredMessagesTo`` that name an entity of the same file
    are renamed too. Returns {logical name: actual name} for the queues and topics.
    """
    config = load_config(src)
    queues, topics = entity_names(config)
    mapping = {name: suffixed(name, suffix) for name in [*queues, *topics]}

    def rename_forwards(props: dict[str, Any] | None) -> None:
        if not props:
            return
        for key in ("ForwardTo", "ForwardDeadLetteredMessagesTo"):
            target = props.get(key)
            if target and target in mapping:
                props[key] = mapping[target]

    for ns in config.get("UserConfig", {}).get("Namespaces", []):
        for queue in ns.get("Queues", []):
            queue["Name"] = mapping[queue["Name"]]
            rename_forwards(queue.get("Properties"))
        for topic in ns.get("Topics", []):
            topic["Name"] = mapping[topic["Name"]]
            for sub in topic.get("Subscriptions", []):
                rename_forwards(sub.get("Properties"))
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return mapping


# -- the namespace the tests see -----------------------------------------------------------


@dataclass(frozen=True)
class ServiceBusNamespace:
    """A Service Bus endpoint for tests, with the actual names of the declared entities.

    Locally every queue and topic carries a per-run suffix: always go through :meth:`queue` /
    :meth:`topic`. Against an external endpoint the names are used as declared.
    ``broker`` is the local process (None for an external endpoint).
    """

    connection_string: str
    queues: Mapping[str, str]
    topics: Mapping[str, str]
    config_paths: tuple[Path, ...]
    broker: BrokerProcess | None = field(default=None, compare=False, repr=False)

    def queue(self, logical_name: str) -> str:
        return self._lookup(self.queues, "queue", logical_name)

    def topic(self, logical_name: str) -> str:
        return self._lookup(self.topics, "topic", logical_name)

    def _lookup(self, names: Mapping[str, str], kind: str, logical_name: str) -> str:
        try:
            return names[logical_name]
        except KeyError:
            raise KeyError(
                f"{kind} {logical_name!r} is not declared in any broker config "
                f"({', '.join(str(p) for p in self.config_paths) or 'none loaded'}); "
                f"declared: {sorted(names)}"
            ) from None


def external_namespace(config_paths: Iterable[Path]) -> ServiceBusNamespace | None:
    """The endpoint named by SERVICEBUS_CONNECTION_STRING_TESTS, or None when it is unset."""
    conn = os.environ.get(EXTERNAL_ENV_VAR, "").strip()
    if not conn:
        return None
    queues: dict[str, str] = {}
    topics: dict[str, str] = {}
    existing = tuple(p for p in config_paths if p.is_file())
    for path in existing:
        q, t = entity_names(load_config(path))
        queues.update((n, n) for n in q)
        topics.update((n, n) for n in t)
    return ServiceBusNamespace(
        connection_string=conn,
        queues=MappingProxyType(queues),
        topics=MappingProxyType(topics),
        config_paths=existing,
    )


def start_local_namespace(
    config_paths: Iterable[Path], workdir: Path, run_suffix: str | None = None
) -> ServiceBusNamespace:
    """Write suffixed copies of the configs into ``workdir`` and start a broker on them.

    The caller owns ``namespace.broker`` and must stop it.
    """
    suffix = run_suffix if run_suffix is not None else secrets.token_hex(3)
    queues: dict[str, str] = {}
    topics: dict[str, str] = {}
    derived: list[Path] = []
    for i, src in enumerate(config_paths):
        if not src.is_file():
            raise processes.ServiceStartError(f"broker config not found: {src}")
        dst = workdir / "configs" / f"{i:02d}-{src.parent.name}-{src.name}"
        mapping = write_suffixed_config(src, dst, suffix)
        q, t = entity_names(load_config(src))
        queues.update((n, mapping[n]) for n in q)
        topics.update((n, mapping[n]) for n in t)
        derived.append(dst)
    if not derived:
        raise processes.ServiceStartError(
            f"no broker config to start from: {DEFAULT_CONFIG} does not exist yet and no test "
            "asked for another one (pytest.mark.servicebus_config)"
        )
    broker = BrokerProcess(derived, log_path=workdir / "broker.log")
    broker.start()
    return ServiceBusNamespace(
        connection_string=broker.connection_string,
        queues=MappingProxyType(queues),
        topics=MappingProxyType(topics),
        config_paths=tuple(derived),
        broker=broker,
    )
