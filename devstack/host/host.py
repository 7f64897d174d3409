"""``LocalHost``: index a FunctionApp and drive its Service Bus and timer triggers."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType

import azure.functions as func
from azure.servicebus.aio import AutoLockRenewer

from devstack.host.cold_start import COLD_START_SETTING, ColdStarts, parse_cold_starts
from devstack.host.http_server import HttpServer
from devstack.host.indexing import (
    HttpTrigger,
    IndexedFunction,
    ServiceBusTrigger,
    TimerTrigger,
    index_apps,
    load_app,
)
from devstack.host.invoke import Invoker, worker_telemetry
from devstack.host.servicebus_runner import (
    ClientPool,
    Connection,
    ServiceBusRunner,
    resolve_connection,
)
from devstack.host.settings import HostConfigError, load_servicebus_options, load_settings
from devstack.host.stats import FunctionStats, StatsCounter
from devstack.host.timer_runner import TimerRunner

log = logging.getLogger("devstack.host")

App = str | ModuleType | func.FunctionRegister
"""An app: its module, its module's name, or the FunctionApp itself."""
STRAGGLER_GRACE_S = 1.0  # after the deadline: time for idle receivers to close and end
AT_STOP_TIMEOUT_S = 5.0  # each at_stop() close


@dataclass(frozen=True)
class FunctionInfo:
    """One indexed function, as the host registered it."""

    name: str
    trigger: str  # serviceBusTrigger | timerTrigger | httpTrigger
    target: str  # queue=..., schedule=..., route=...
    concurrency: int | None  # receivers for a Service Bus trigger; 1 for a timer
    served: bool  # False for HTTP triggers (not served yet)

    def describe(self) -> str:
        if not self.served:
            return f"{self.name}: {self.trigger} {self.target} (not served by the local host)"
        return f"{self.name}: {self.trigger} {self.target} concurrency={self.concurrency}"


PRINCIPAL_SETTING = "DEVHOST_PRINCIPAL_NAME"
"""Who HTTP callers are, as App Service Authentication would say (see http_server)."""


class LocalHost:
    """Runs the functions of a FunctionApp against real Service Bus queues and the clock.

    Indexing happens here (the app module is imported and ``get_functions()`` called once),
    so configuration errors raise :class:`HostConfigError` before anything connects.

    ``settings`` defaults to ``local.settings.json`` Values overlaid by the environment.
    ``app_module``: the app (its module or module name, or the FunctionApp itself), or several
    apps served together (one event loop: the pattern app and the operations app in one test
    process).
    ``host_json`` supplies ``extensions.serviceBus``; ``concurrency_override`` replaces its
    ``maxConcurrentCalls`` for every Service Bus trigger; ``functions`` selects by name.
    """

    def __init__(
        self,
        app_module: App | Sequence[App] = "function_app",
        settings: Mapping[str, str] | None = None,
        host_json: str | Path | None = Path("host.json"),
        concurrency_override: int | None = None,
        functions: Collection[str] | None = None,
        *,
        app_attribute: str = "app",
        http_port: int | None = None,
    ) -> None:
        self.settings = dict(load_settings() if settings is None else settings)
        self.options = load_servicebus_options(host_json)
        if concurrency_override is not None and concurrency_override < 1:
            raise HostConfigError(f"concurrency must be at least 1, not {concurrency_override}")
        self.concurrency = concurrency_override or self.options.max_concurrent_calls
        single = isinstance(app_module, str | ModuleType | func.FunctionRegister)
        modules = [app_module] if single else app_module
        apps = [load_app(module, app_attribute) for module in modules]
        self._apps = [app for app, _ in apps]
        self._functions = index_apps(apps, self.settings, only=functions)
        self._connections: dict[str, Connection] = {}
        for function in self._functions:
            if isinstance(function.trigger, ServiceBusTrigger):
                if not self.options.auto_complete_messages:
                    raise HostConfigError(
                        f"function {function.name!r}: host.json extensions.serviceBus."
                        "autoCompleteMessages=false is not supported by the local host"
                    )
                self._connections[function.name] = resolve_connection(
                    function.name, function.trigger.connection, self.settings
                )
        self._stats = {function.name: StatsCounter() for function in self._functions}
        self._at_stop: list[Callable[[], Awaitable[object]]] = []
        self._runners: list[ServiceBusRunner | TimerRunner] = []
        self._invoker = Invoker(
            ColdStarts(
                parse_cold_starts(
                    self.settings.get(COLD_START_SETTING, ""), [f.name for f in self._functions]
                )
            ),
            worker_telemetry=worker_telemetry(self.settings),
        )
        self._clients: ClientPool | None = None
        self._renewer: AutoLockRenewer | None = None
        self.http_port = http_port  # None: HTTP triggers are indexed but not served
        self.http: HttpServer | None = None
        self._state = "created"
        self._lock = threading.Lock()

    # -- what is registered ----------------------------------------------------------------

    @property
    def functions(self) -> tuple[FunctionInfo, ...]:
        return tuple(self._info(function) for function in self._functions)

    def _info(self, function: IndexedFunction) -> FunctionInfo:
        trigger = function.trigger
        concurrency = (
            self.concurrency
            if isinstance(trigger, ServiceBusTrigger)
            else 1
            if isinstance(trigger, TimerTrigger)
            else None
        )
        return FunctionInfo(
            name=function.name,
            trigger=function.trigger_type,
            target=trigger.describe(),
            concurrency=concurrency,
            served=not isinstance(trigger, HttpTrigger) or self.http_port is not None,
        )

    def stats(self) -> dict[str, FunctionStats]:
        """Counters per function name (a snapshot)."""
        return {name: counter.snapshot() for name, counter in self._stats.items()}

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> LocalHost:
        with self._lock:
            if self._state != "created":
                raise RuntimeError(f"the host can be started once (it is {self._state})")
            self._state = "running"
        self._clients = ClientPool()
        self._renewer = AutoLockRenewer(
            max_lock_renewal_duration=self.options.max_auto_lock_renewal_duration
        )  # used on the functions' loop only, as are the clients
        try:
            if self.http_port is not None and any(
                isinstance(f.trigger, HttpTrigger) for f in self._functions
            ):
                self.http = HttpServer(
                    list(self._functions),
                    self._invoker,
                    self._stats,
                    port=self.http_port,
                    principal=self.settings.get(PRINCIPAL_SETTING, "").strip() or None,
                )
                self.http.start()
                log.info("http triggers served at %s", self.http.base_url)
            for function in self._functions:
                runner = self._make_runner(function)
                if runner is not None:
                    self._runners.append(runner)
                    runner.start()
                info = self._info(function)
                if info.served:
                    log.info("registered %s", info.describe())
                else:
                    log.info(
                        "http trigger %s not served by the local host (%s)",
                        function.name, info.target,
                    )  # fmt: skip
        except BaseException:
            self.stop(timeout=0)
            raise
        return self

    def _make_runner(self, function: IndexedFunction) -> ServiceBusRunner | TimerRunner | None:
        assert self._clients is not None and self._renewer is not None
        if isinstance(function.trigger, ServiceBusTrigger):
            return ServiceBusRunner(
                function,
                self._connections[function.name],
                clients=self._clients,
                renewer=self._renewer,
                invoker=self._invoker,
                stats=self._stats[function.name],
                concurrency=self.concurrency,
                prefetch=self.options.prefetch_count,
                max_lock_renewal=self.options.max_auto_lock_renewal_duration,
            )
        if isinstance(function.trigger, TimerTrigger):
            if function.trigger.use_monitor:
                log.debug("%s: useMonitor has no effect locally (no schedule store)", function.name)
            return TimerRunner(function, invoker=self._invoker, stats=self._stats[function.name])
        return None

    def at_stop(self, close: Callable[[], Awaitable[object]]) -> None:
        """Await ``close()`` on the async functions' event loop when the host stops, after the
        last run and before the loop ends: for what an in-process host's async functions opened
        on it (a test's async Runtime). A worker process in Azure just ends."""
        self._at_stop.append(close)

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop receiving and ticking; let runs in progress finish until ``timeout`` seconds.

        Messages whose function is still running at the deadline are abandoned (the broker
        delivers them again); those runs settle nothing: a sync function's thread is left to
        end on its own, an async function is cancelled when the loop closes. Returns True when
        every run finished in time. Takes at most ``timeout`` plus a few seconds (a receive in
        progress, the lock renewals' last wake-up, closing the connections).
        """
        with self._lock:
            if self._state != "running":
                return self._state != "stopped-late"
            self._state = "stopping"
        deadline = time.monotonic() + max(0.0, timeout)
        if self.http is not None:
            self.http.stop()
        for runner in self._runners:
            runner.request_stop()
        for runner in self._runners:
            runner.wait(max(0.0, deadline - time.monotonic()))
        servicebus_runners = [r for r in self._runners if isinstance(r, ServiceBusRunner)]
        for runner in servicebus_runners:
            runner.close_receivers()
        for runner in servicebus_runners:
            runner.abandon_in_flight(timeout=AT_STOP_TIMEOUT_S)
        self._on_loop(self._renewer.close() if self._renewer is not None else None, "renewer")
        grace = time.monotonic() + STRAGGLER_GRACE_S
        for runner in self._runners:
            runner.wait(max(0.0, grace - time.monotonic()))
        stragglers = [name for runner in self._runners for name in runner.running()]
        self._on_loop(self._clients.close() if self._clients is not None else None, "clients")
        for app in self._apps:
            self._on_loop(_asgi_shutdown(app), f"the ASGI app of {app!r}")
        for close in self._at_stop:
            self._on_loop(close(), repr(close))
        self._invoker.close()
        if stragglers:
            log.warning(
                "stopped with %d run(s) still going past the deadline: %s",
                len(stragglers), ", ".join(stragglers),
            )  # fmt: skip
        with self._lock:
            self._state = "stopped-late" if stragglers else "stopped"
        log.info("host stopped")
        return not stragglers

    def _on_loop(self, closing: Awaitable[object] | None, what: str) -> None:
        """Await a close on the functions' loop, from stop; a failure to close loses nothing."""
        if closing is None:
            return
        try:
            self._invoker.run(closing, timeout=AT_STOP_TIMEOUT_S)
        except Exception as exc:
            log.warning("closing %s on the functions' loop failed: %s", what, exc)

    def __enter__(self) -> LocalHost:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


async def _asgi_shutdown(app: object) -> None:
    """An ASGI app's lifespan shutdown, on the loop it started on, as a server sends it when it
    stops (``func.AsgiFunctionApp`` starts it with the first request; its own ``__del__`` would
    otherwise try it later, from whatever thread collects it, on a new loop)."""
    if getattr(app, "startup_task_done", False):
        await app.middleware.notify_shutdown()  # type: ignore[attr-defined]
        app.startup_task_done = False  # type: ignore[attr-defined]
