"""The whole pattern on one machine: Azurite, the broker, the fake services and host processes:
``host-N`` run the pattern app (function_app.py: the Scheduler, the Agents, the Supervisor),
``operations`` runs the operations app (operations_app.py: the operator HTTP API, the dashboard
and the retention purge's timer), one host process per app, as Azure runs them apart.

`await LocalStack.start()` brings each up, waits until it answers, creates the tables the
settings name (with the app's async store), and writes `<workdir>/stack.json` (settings, ports,
PIDs) so that `orderctl submit`, `status` and `demo` find a running stack. With
``telemetry``, the hosts write their spans and metrics to files in that directory (the
TELEMETRY_DIR setting, adapters.telemetry), which `orderctl trace` reads. `stop()` stops everything
it started, by PID.
The queues are the broker's entity config, the same file the infra tests compare with Bicep.

Every address is chosen once, at the first start, and kept: :meth:`LocalStack.restart` brings a
process back on the same port(s), so the connection strings in the settings, the fakes' URL and
the operator HTTP API's URL stay valid for the stack's life. With ``persist``, Azurite and the
broker keep their data under the workdir (wiped at each fresh start), so a restarted one comes
back with the orders and messages it had.

The processes die with the thread that spawned them (``PR_SET_PDEATHSIG``), so :meth:`start`
and :meth:`restart` start them on the caller's thread, the one its event loop runs on, and block
the loop while each comes up: never on a worker thread (``asyncio.to_thread``), whose end would
take them down.

For the chaos run (benchmarks.chaos), a stack can also be started with faults beyond a kill:
``clock_offsets`` runs each named host with its own wall clock (devstack.faults.clock);
``storage_faults`` puts the fault-injecting proxy (devstack.faults.storage_proxy) between the
hosts and Azurite's Table endpoint, while :attr:`StackInfo.settings` keeps naming Azurite itself
for every other client; :meth:`LocalStack.pause_host` freezes a host, and
:meth:`LocalStack.reset_broker_connections` drops every connection to the broker.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from devstack.faults import clock
from devstack.faults.storage_proxy import FaultRates
from devstack.stack import processes
from devstack.stack.azurite import AzuriteProcess, StorageAccount, connection_string_for
from devstack.stack.broker import DEFAULT_CONFIG, BrokerProcess
from domain.agents import AGENT_NAMES, AGENTS

EXAMPLE_SETTINGS = processes.REPO_ROOT / "local.settings.json.example"
STATE_FILE = "stack.json"
STORAGE_PROXY = "storage-proxy"
STORAGE_PROXY_STATS = f"{STORAGE_PROXY}.stats.json"
OPERATIONS = "operations"
"""The operations app's host: the operator HTTP API, the dashboard and the retention timer."""
STORAGE_SETTINGS = ("StateStorage", "AzureWebJobsStorage")
DEFAULT_WORKDIR = processes.REPO_ROOT / ".devstack"
TELEMETRY_SETTING = "TELEMETRY_DIR"  # adapters.telemetry.TELEMETRY_DIR_SETTING
TELEMETRY_SUBDIR = "telemetry"
# Receivers per queue trigger and host. host.json's 16 suits Azure; locally 6 triggers x 16
# AMQP connections per host only slow the start and compete for the same two cores.
DEFAULT_CONCURRENCY = 4
HOST_START_TIMEOUT_S = 90.0

Progress = Callable[[str], None]


@dataclass
class StackInfo:
    """What a client of a running stack needs: the app settings and where things run."""

    settings: dict[str, str]
    fakes_url: str
    pids: dict[str, int] = field(default_factory=dict)
    api_url: str = ""  # the operator HTTP API, served by the operations app's host
    logs: dict[str, str] = field(default_factory=dict)
    supervisor_pid: int = 0
    """The process that keeps the stack running (`orderctl up`), 0 when nothing does."""
    restarts: dict[str, int] = field(default_factory=dict)
    persistent: bool = False

    def save(self, path: Path) -> None:
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(self.__dict__, indent=2) + "\n")
        os.replace(temporary, path)  # readers never see half a file

    @classmethod
    def read(cls, workdir: Path = DEFAULT_WORKDIR) -> StackInfo | None:
        """The stack last recorded in ``workdir``, running or not."""
        path = workdir / STATE_FILE
        try:
            document = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in document.items() if k in known})

    @classmethod
    def load(cls, workdir: Path = DEFAULT_WORKDIR) -> StackInfo | None:
        """The stack running from ``workdir``, or None."""
        info = cls.read(workdir)
        return info if info is not None and info.alive() else None

    def alive(self) -> bool:
        """A supervised stack is alive while its supervisor is (a process it is restarting is
        briefly gone); an unsupervised one while every process is."""
        if self.supervisor_pid:
            return processes.pid_alive(self.supervisor_pid)
        return bool(self.pids) and all(processes.pid_alive(pid) for pid in self.pids.values())


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
        api_port: int = 0,
        persist: bool = False,
        telemetry: Path | None = None,
        clock_offsets: Mapping[int, int] | None = None,
        storage_faults: FaultRates | None = None,
        lock_seconds: int | None = None,
    ) -> None:
        """``api_port``: where the operations host serves the operator HTTP API: this port, or
        the next free one above it if it is taken (0: any free port). ``persist``: Azurite and
        the broker keep their data on disk for the stack's life (see the module's docstring).
        ``telemetry``:
        the directory the hosts write spans and metrics to (:func:`telemetry_dir`); None: off.
        ``clock_offsets``: seconds each host's wall clock runs ahead (negative: behind), by host
        number, kept across its restarts. ``storage_faults``: the hosts reach Azurite's Table
        endpoint through the storage proxy, which injects these faults (seeded by ``seed``).
        ``lock_seconds``: every queue's message lock lasts this long instead of the entity
        config's minute (the chaos tests' small runs wait out fewer seconds of lost locks)."""
        self.workdir = Path(workdir)
        self.hosts = hosts
        self.concurrency = concurrency
        self.profile = profile
        self.seed = seed
        self.overrides = overrides or {}
        self.api_port = api_port
        self.persist = persist
        self.telemetry = Path(telemetry).resolve() if telemetry is not None else None
        self.clock_offsets = dict(clock_offsets or {})
        self.storage_faults = storage_faults
        self.lock_seconds = lock_seconds
        self.paused: set[int] = set()
        self._azurite: AzuriteProcess | None = None
        self._broker: BrokerProcess | None = None
        self._children: dict[str, subprocess.Popen] = {}
        self._fakes_port = 0
        self._proxy_port = 0
        self._http_port: int | None = None
        self.info: StackInfo | None = None

    async def start(self, progress: Progress = lambda _: None) -> StackInfo:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            return await self._start(progress)
        except BaseException:
            self.stop()
            raise

    def broker_config(self) -> Path:
        """The broker's entity config: the repository's, or a copy in the workdir with every
        queue's lock set to :attr:`lock_seconds`."""
        if self.lock_seconds is None:
            return DEFAULT_CONFIG
        config = json.loads(DEFAULT_CONFIG.read_text())
        for namespace in config["UserConfig"]["Namespaces"]:
            for queue in namespace["Queues"]:
                queue["Properties"]["LockDuration"] = f"PT{self.lock_seconds}S"
        path = self.workdir / "broker-config.json"
        path.write_text(json.dumps(config, indent=2))
        return path

    async def _start(self, progress: Progress) -> StackInfo:
        for stale in self.workdir.glob("host-*.stats.json"):
            stale.unlink()  # an earlier stack's counters would be read as this one's
        for data in ("azurite-data", "broker-data"):
            shutil.rmtree(self.workdir / data, ignore_errors=True)  # each stack starts empty
        progress("starting Azurite (tables, blobs)")
        self._azurite = AzuriteProcess(
            self.workdir / "azurite",
            location=self.workdir / "azurite-data" if self.persist else None,
        )
        account = self._azurite.start()
        host_account = account
        if self.storage_faults is not None:
            progress("starting the storage proxy (faults between the hosts and Azurite)")
            host_account = self._start_storage_proxy(account)
        progress("starting the Service Bus development broker")
        self._broker = BrokerProcess(
            [self.broker_config()],
            data_dir=self.workdir / "broker-data" if self.persist else None,
            log_path=self.workdir / "broker.log",
        )
        self._broker.start()
        progress(f"starting the fake remote services ({', '.join(AGENT_NAMES)})")
        fakes_url = self._start_fakes()
        settings = base_settings() | {
            "ServiceBusConnection": self._broker.connection_string,
            "StateStorage": account.connection_string,
            "AzureWebJobsStorage": account.connection_string,
        }
        settings |= {agent.url_setting: f"{fakes_url}/{agent.name}" for agent in AGENTS}
        if self.telemetry is not None:
            self.telemetry.mkdir(parents=True, exist_ok=True)
            settings[TELEMETRY_SETTING] = str(self.telemetry)
        settings |= self.overrides
        progress("creating tables")
        await self._create_tables(settings)
        self.info = StackInfo(settings=settings, fakes_url=fakes_url, persistent=self.persist)
        host_storage = dict.fromkeys(STORAGE_SETTINGS, host_account.connection_string)
        self._write_host_settings(settings | host_storage)
        for n in range(self.hosts):
            progress(f"starting functions host {n + 1} of {self.hosts} (the pattern app)")
            self._start_host(n)
        progress("starting the operations app's host (operator HTTP API, dashboard, retention)")
        self._start_operations_first()
        api = re.search(r"http triggers at (\S+)", _read(self.workdir / f"{OPERATIONS}.log"))
        self.info.api_url = api.group(1) if api else ""
        self.info.logs = {
            "azurite": str(self._azurite.log_path),
            "broker": str(self._broker.log_path),
            **{name: str(self.workdir / f"{name}.log") for name in self._children},
        }
        self._record()
        return self.info

    def components(self) -> list[str]:
        """The stack's processes, in start order: azurite, the storage proxy (with
        ``storage_faults``), broker, fakes, host-0, host-1, ..., operations."""
        proxy = [STORAGE_PROXY] if self.storage_faults is not None else []
        hosts = [f"host-{n}" for n in range(self.hosts)]
        return ["azurite", *proxy, "broker", "fakes", *hosts, OPERATIONS]

    def exit_code(self, name: str) -> int | None:
        """None while ``name`` runs; its exit code once it has ended (-N: killed by signal N)."""
        if name == "azurite":
            return self._azurite.exit_code if self._azurite else None
        if name == "broker":
            return self._broker.exit_code if self._broker else None
        proc = self._children.get(name)
        return proc.poll() if proc is not None else None

    def pid(self, name: str) -> int:
        if name == "azurite":
            return (self._azurite.pid or 0) if self._azurite else 0
        if name == "broker":
            return self._broker.pid if self._broker and self._broker.running else 0
        proc = self._children.get(name)
        return proc.pid if proc is not None else 0

    async def restart(self, name: str) -> int:
        """Stop what is left of ``name`` and start it again at its address; returns its PID.
        Raises ServiceStartError when it does not come back."""
        assert self.info is not None, "start the stack first"
        if name == "azurite":
            assert self._azurite is not None
            self._azurite.restart()
            await self._create_tables(self.info.settings)  # in memory, it came back empty
        elif name == "broker":
            assert self._broker is not None
            self._broker.restart(require_same_port=True)
        elif name == "fakes":
            processes.stop(self._children.pop("fakes"))
            self._start_fakes()
        elif name == STORAGE_PROXY:
            assert self._azurite is not None and self._azurite.account is not None
            processes.stop(self._children.pop(STORAGE_PROXY))
            self._start_storage_proxy(self._azurite.account)
        elif name.startswith("host-"):
            processes.stop(self._children.pop(name))
            self._start_host(int(name.removeprefix("host-")))
        elif name == OPERATIONS:
            processes.stop(self._children.pop(name))
            self._start_operations()
        else:
            raise ValueError(f"no component {name!r}; the stack has {', '.join(self.components())}")
        self.info.restarts[name] = self.info.restarts.get(name, 0) + 1
        self._record()
        return self.pid(name)

    def adopt(self, supervisor_pid: int) -> None:
        """Record ``supervisor_pid`` as the process that keeps this stack running."""
        assert self.info is not None, "start the stack first"
        self.info.supervisor_pid = supervisor_pid
        self._record()

    def _record(self) -> None:
        assert self.info is not None
        self.info.pids = {name: self.pid(name) for name in self.components()}
        self.info.save(self.workdir / STATE_FILE)

    def _start_fakes(self) -> str:
        port_file = self.workdir / "fakes.port"
        port_file.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "devstack.fakes.remote_services"]
        argv += ["--port", str(self._fakes_port), "--port-file", str(port_file)]
        argv += ["--seed", str(self.seed)]
        if self.profile:
            argv += ["--profile", str(profile_path(self.profile))]
        proc = self._spawn("fakes", argv, os.environ.copy())
        if not processes.wait_until(lambda: port_file.is_file(), timeout=20, proc=proc):
            raise processes.ServiceStartError(
                "the fake remote services did not start:\n"
                + processes.tail(self.workdir / "fakes.log")
            )
        self._fakes_port = int(port_file.read_text().strip())
        return f"http://127.0.0.1:{self._fakes_port}"

    def _start_storage_proxy(self, account: StorageAccount) -> StorageAccount:
        """Start the storage proxy in front of Azurite's Table endpoint (at the port it had, if
        any); returns the account as the hosts see it: tables through the proxy."""
        assert self.storage_faults is not None
        port_file = self.workdir / f"{STORAGE_PROXY}.port"
        port_file.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "devstack.faults.storage_proxy"]
        argv += ["--upstream", account.table_endpoint.rsplit("/", 1)[0]]
        argv += ["--port", str(self._proxy_port), "--port-file", str(port_file)]
        argv += ["--stats-file", str(self.workdir / STORAGE_PROXY_STATS)]
        argv += ["--events-file", str(self.workdir / f"{STORAGE_PROXY}.faults.jsonl")]
        argv += ["--seed", str(self.seed), "--rates", self.storage_faults.spec()]
        proc = self._spawn(STORAGE_PROXY, argv, os.environ.copy())
        if not processes.wait_until(lambda: port_file.is_file(), timeout=20, proc=proc):
            raise processes.ServiceStartError(
                "the storage proxy did not start:\n"
                + processes.tail(self.workdir / f"{STORAGE_PROXY}.log")
            )
        self._proxy_port = int(port_file.read_text().strip())
        table = f"http://127.0.0.1:{self._proxy_port}/{account.table_endpoint.rsplit('/', 1)[1]}"
        return StorageAccount(
            connection_string=connection_string_for(
                account.blob_endpoint, account.queue_endpoint, table
            ),
            blob_endpoint=account.blob_endpoint,
            queue_endpoint=account.queue_endpoint,
            table_endpoint=table,
        )

    async def _create_tables(self, settings: dict[str, str]) -> None:
        from adapters.settings import Settings
        from service.runtime import Runtime

        runtime = Runtime.from_settings(Settings.from_env(settings))
        try:
            await runtime.store.ensure_tables()
        finally:
            await runtime.close()

    def _write_host_settings(self, settings: dict[str, str]) -> None:
        from devstack.host.host import PRINCIPAL_SETTING

        # The local API is open, like `func start`: its callers act as the user who started
        # the stack (App Service Authentication names the caller in Azure).
        settings = {PRINCIPAL_SETTING: getpass.getuser(), **settings}
        settings_file = self.workdir / "local.settings.json"
        settings_file.write_text(json.dumps({"IsEncrypted": False, "Values": settings}, indent=2))

    def _start_operations_first(self, attempts: int = 3) -> None:
        """The operations host serves the operator HTTP API. Its port is chosen once; if another
        process takes it between the choice and the bind, choose again (only at the first start:
        from then on the address is the stack's)."""
        tried: list[int] = []
        for attempt in range(attempts):
            self._http_port = processes.choose_port(self.api_port, processes.port_free, avoid=tried)
            try:
                self._start_operations()
                return
            except processes.ServiceStartError:
                tried.append(self._http_port)
                log = _read(self.workdir / f"{OPERATIONS}.log")
                if attempt == attempts - 1 or "cannot serve HTTP" not in log:
                    raise
                self._children.pop(OPERATIONS, None)

    def _start_operations(self) -> None:
        self._start_function_host(OPERATIONS, "operations_app", http_port=self._http_port)

    def _start_host(self, n: int) -> None:
        offset = self.clock_offsets.get(n)
        self._start_function_host(f"host-{n}", "function_app", clock_offset=offset)

    def _start_function_host(
        self, name: str, app: str, *, http_port: int | None = None, clock_offset: int | None = None
    ) -> None:
        """A functions host process for ``app``; it serves HTTP on ``http_port`` (None: none)."""
        argv = [sys.executable, "-m", "devstack.host", "--app", app]
        argv += ["--settings", str(self.workdir / "local.settings.json")]
        argv += ["--concurrency", str(self.concurrency or DEFAULT_CONCURRENCY)]
        # Shorter than processes.stop's grace, so a stop is graceful, not a SIGKILL.
        argv += ["--stop-timeout", "3"]
        argv += ["--http-port", str(http_port) if http_port is not None else "-1"]
        argv += ["--stats-file", str(self.workdir / f"{name}.stats.json")]
        env = os.environ.copy()
        if clock_offset:
            env = clock.skewed_environment(env, clock_offset)
        proc = self._spawn(name, argv, env)
        log = self.workdir / f"{name}.log"
        started = processes.wait_until(
            lambda: "host started" in _read(log), timeout=HOST_START_TIMEOUT_S, proc=proc
        )
        if not started:
            processes.stop(proc)
            raise processes.ServiceStartError(
                f"functions host {name} ({app}) did not start:\n{processes.tail(log)}"
            )

    def kill_host(self, n: int) -> None:
        """SIGKILL host `n` (a crash: nothing finished, nothing settled, no goodbye)."""
        proc = self._children.pop(f"host-{n}")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self.paused.discard(n)

    def pause_host(self, n: int) -> None:
        """SIGSTOP host `n`'s process group (a long GC pause, a frozen VM): it keeps its
        connections, locks and leases as they were and does nothing until :meth:`resume_host`,
        then carries on as if no time had passed. It has not exited meanwhile (``exit_code``
        stays None), so a restart loop leaves it alone."""
        os.killpg(self._children[f"host-{n}"].pid, signal.SIGSTOP)
        self.paused.add(n)

    def resume_host(self, n: int) -> None:
        os.killpg(self._children[f"host-{n}"].pid, signal.SIGCONT)
        self.paused.discard(n)

    def reset_broker_connections(self) -> None:
        """Have the broker drop every client connection with a TCP reset, as a network fault
        would (its SIGUSR1); it keeps its queues and messages, and the clients reconnect."""
        assert self._broker is not None, "start the stack first"
        os.kill(self._broker.pid, signal.SIGUSR1)

    def restart_host(self, n: int) -> None:
        """Start host `n` again; one still running is stopped first (gracefully), so the stack
        never runs two of it and :meth:`stop` stops the one it runs."""
        assert self.info is not None, "start the stack first"
        running = self._children.pop(f"host-{n}", None)
        if running is not None:
            processes.stop(running)
        self._start_host(n)
        self._record()

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        proc = processes.spawn(
            argv, log_path=self.workdir / f"{name}.log", cwd=processes.REPO_ROOT, env=env
        )
        self._children[name] = proc
        return proc

    def stop(self) -> None:
        """Stop hosts first (they finish or abandon in-flight work; all of them at once), then
        the services. A paused host is resumed first, so that it too stops gracefully."""
        for n in list(self.paused):
            self.resume_host(n)
        hosts = sorted(n for n in self._children if n.startswith("host") or n == OPERATIONS)
        processes.stop_all([self._children.pop(name) for name in hosts])
        for name in sorted(self._children):
            processes.stop(self._children.pop(name))
        if self._broker is not None:
            self._broker.stop()
            self._broker = None
        if self._azurite is not None:
            self._azurite.stop()
            self._azurite = None
        (self.workdir / STATE_FILE).unlink(missing_ok=True)


def telemetry_dir(workdir: Path, info: StackInfo | None = None) -> Path:
    """Where a stack's telemetry files are: its TELEMETRY_DIR setting when it has one, else
    the default, ``<workdir>/telemetry`` (what `orderctl up --telemetry` uses)."""
    configured = (info.settings.get(TELEMETRY_SETTING) if info is not None else None) or ""
    return Path(configured) if configured.strip() else Path(workdir) / TELEMETRY_SUBDIR


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
