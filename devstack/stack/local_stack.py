"""The whole pattern on one machine: Azurite, the broker, the fake services and host processes.

`LocalStack.start()` brings each up on a free port, waits until it answers, creates the tables
the settings name, and writes `<workdir>/stack.json` (settings, ports, PIDs) so that `orderctl
submit`, `status` and `demo` find a running stack. `stop()` stops everything it started, by PID.
The queues are the broker's entity config, the same file the infra tests compare with Bicep.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from core.agents import AGENT_NAMES, AGENTS
from devstack.stack import processes
from devstack.stack.azurite import AzuriteProcess
from devstack.stack.broker import DEFAULT_CONFIG, BrokerProcess

EXAMPLE_SETTINGS = processes.REPO_ROOT / "local.settings.json.example"
STATE_FILE = "stack.json"
DEFAULT_WORKDIR = processes.REPO_ROOT / ".devstack"
# Receivers per queue trigger and host. host.json's 16 suits Azure; locally 6 triggers x 16
# AMQP connections per host only slow the start and compete for the same two cores.
DEFAULT_CONCURRENCY = 4

Progress = Callable[[str], None]


@dataclass
class StackInfo:
    """What a client of a running stack needs: the app settings and where things run."""

    settings: dict[str, str]
    fakes_url: str
    pids: dict[str, int] = field(default_factory=dict)
    api_url: str = ""  # the operator HTTP API, served by host 0
    logs: dict[str, str] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__, indent=2) + "\n")

    @classmethod
    def load(cls, workdir: Path = DEFAULT_WORKDIR) -> StackInfo | None:
        path = workdir / STATE_FILE
        if not path.is_file():
            return None
        info = cls(**json.loads(path.read_text()))
        return info if info.alive() else None

    def alive(self) -> bool:
        return bool(self.pids) and all(_pid_alive(pid) for pid in self.pids.values())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def base_settings() -> dict[str, str]:
    """The app settings of local.settings.json.example (queue names, tables, schedule...)."""
    return dict(json.loads(EXAMPLE_SETTINGS.read_text())["Values"])


class LocalStack:
    def __init__(
        self,
        workdir: Path = DEFAULT_WORKDIR,
        *,
        hosts: int = 1,
        concurrency: int | None = None,
        profile: str | Path | None = None,
        seed: int = 0,
        overrides: dict[str, str] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.hosts = hosts
        self.concurrency = concurrency
        self.profile = profile
        self.seed = seed
        self.overrides = overrides or {}
        self._azurite: AzuriteProcess | None = None
        self._broker: BrokerProcess | None = None
        self._children: dict[str, subprocess.Popen] = {}
        self.info: StackInfo | None = None

    def start(self, progress: Progress = lambda _: None) -> StackInfo:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            return self._start(progress)
        except BaseException:
            self.stop()
            raise

    def _start(self, progress: Progress) -> StackInfo:
        for stale in self.workdir.glob("host-*.stats.json"):
            stale.unlink()  # an earlier stack's counters would be read as this one's
        progress("starting Azurite (tables, blobs)")
        self._azurite = AzuriteProcess(self.workdir / "azurite")
        account = self._azurite.start()
        progress("starting the Service Bus development broker")
        self._broker = BrokerProcess([DEFAULT_CONFIG], log_path=self.workdir / "broker.log")
        self._broker.start()
        progress(f"starting the fake remote services ({', '.join(AGENT_NAMES)})")
        fakes_url = self._start_fakes()
        settings = base_settings() | {
            "ServiceBusConnection": self._broker.connection_string,
            "StateStorage": account.connection_string,
            "AzureWebJobsStorage": account.connection_string,
        }
        settings |= {agent.url_setting: f"{fakes_url}/{agent.name}" for agent in AGENTS}
        settings |= self.overrides
        progress("creating tables")
        self._create_tables(settings)
        for n in range(self.hosts):
            progress(f"starting functions host {n + 1} of {self.hosts}")
            self._start_host(n, settings)
        pids = {"azurite": self._azurite.pid or 0, "broker": self._broker.pid}
        pids |= {name: proc.pid for name, proc in self._children.items()}
        logs = {
            "azurite": str(self._azurite.log_path),
            "broker": str(self._broker.log_path),
            **{name: str(self.workdir / f"{name}.log") for name in self._children},
        }
        api = re.search(r"http triggers at (\S+)", _read(self.workdir / "host-0.log"))
        self.info = StackInfo(
            settings=settings,
            fakes_url=fakes_url,
            pids=pids,
            logs=logs,
            api_url=api.group(1) if api else "",
        )
        self.info.save(self.workdir / STATE_FILE)
        return self.info

    def _start_fakes(self) -> str:
        port_file = self.workdir / "fakes.port"
        port_file.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "devstack.fakes.remote_services", "--port", "0"]
        argv += ["--port-file", str(port_file), "--seed", str(self.seed)]
        if self.profile:
            argv += ["--profile", str(profile_path(self.profile))]
        proc = self._spawn("fakes", argv, os.environ.copy())
        if not processes.wait_until(lambda: port_file.is_file(), timeout=20, proc=proc):
            raise processes.ServiceStartError(
                "the fake remote services did not start:\n"
                + processes.tail(self.workdir / "fakes.log")
            )
        return f"http://127.0.0.1:{int(port_file.read_text().strip())}"

    def _create_tables(self, settings: dict[str, str]) -> None:
        from core.runtime import Runtime
        from core.settings import Settings

        runtime = Runtime.from_settings(Settings.from_env(settings))
        try:
            runtime.store.ensure_tables()
        finally:
            runtime.close()

    def _start_host(self, n: int, settings: dict[str, str]) -> None:
        settings_file = self.workdir / "local.settings.json"
        settings_file.write_text(json.dumps({"IsEncrypted": False, "Values": settings}, indent=2))
        argv = [sys.executable, "-m", "devstack.host", "--settings", str(settings_file)]
        argv += ["--concurrency", str(self.concurrency or DEFAULT_CONCURRENCY)]
        # Shorter than processes.stop's grace, so a stop is graceful, not a SIGKILL.
        argv += ["--stop-timeout", "3"]
        # Host 0 serves the operator HTTP API on a free port; the others serve no HTTP.
        argv += ["--http-port", "0" if n == 0 else "-1"]
        argv += ["--stats-file", str(self.workdir / f"host-{n}.stats.json")]
        proc = self._spawn(f"host-{n}", argv, os.environ.copy())
        log = self.workdir / f"host-{n}.log"
        if not processes.wait_until(lambda: "host started" in _read(log), timeout=90, proc=proc):
            raise processes.ServiceStartError(
                f"functions host {n} did not start:\n{processes.tail(log)}"
            )

    def kill_host(self, n: int) -> None:
        """SIGKILL host `n` (a crash: nothing finished, nothing settled, no goodbye)."""
        proc = self._children.pop(f"host-{n}")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def restart_host(self, n: int) -> None:
        assert self.info is not None, "start the stack first"
        self._start_host(n, self.info.settings)
        self.info.pids[f"host-{n}"] = self._children[f"host-{n}"].pid
        self.info.save(self.workdir / STATE_FILE)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        proc = processes.spawn(
            argv, log_path=self.workdir / f"{name}.log", cwd=processes.REPO_ROOT, env=env
        )
        self._children[name] = proc
        return proc

    def stop(self) -> None:
        """Stop hosts first (they finish or abandon in-flight work), then the services."""
        for name in sorted(self._children, key=lambda n: not n.startswith("host")):
            processes.stop(self._children.pop(name))
        if self._broker is not None:
            self._broker.stop()
            self._broker = None
        if self._azurite is not None:
            self._azurite.stop()
            self._azurite = None
        (self.workdir / STATE_FILE).unlink(missing_ok=True)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def profile_path(profile: str | Path) -> Path:
    """A profile name shipped with the fakes (clean, flaky, chaotic) or a path to a JSON file."""
    path = Path(profile)
    if path.suffix == ".json" or path.exists():
        return path
    from devstack.fakes.profiles import example_profile

    return example_profile(str(profile))
