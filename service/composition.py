"""The composition roots: what an app's functions share in one process, built once by the app's
entry point and handed down to them, as cosmicpython's bootstrap builds its message bus. This
module holds the pattern app's (function_app.py hands it to each blueprint);
:mod:`service.operations.composition` the operations app's.

A root is made when the app is imported and opens nothing then. Its Runtime (with the breakers
and the reply queues that refused lately) is built on the first invocation, from the settings
the load checked, and its clients connect on first use, on the event loop the functions run on:
the one they belong to. What else the app keeps open (the operations app's archive and operator
context) is opened the same way, by the root. A test makes a root of its own on its settings
(its instance id and clock too), so nothing is shared between tests and nothing in what deploys
keeps a module-level instance of its own.
"""

from __future__ import annotations

import logging
import threading

from adapters.settings import Settings
from adapters.store.state_store import OrderStateStore
from service.runtime import Runtime

log = logging.getLogger("runtime")


class Root:
    """One process's Runtime, built on first use from ``settings``: those the load checked, or
    None (a tool that only indexes the functions) for the environment's, read then.
    ``overrides`` go to :meth:`Runtime.from_settings` (a test's instance id and clock); the
    Runtime's store is a :attr:`store_type`."""

    store_type: type[OrderStateStore] = OrderStateStore

    def __init__(self, settings: Settings | None = None, **overrides: object) -> None:
        self._settings = settings
        self._overrides = overrides
        self._lock = threading.Lock()
        self._runtime: Runtime | None = None

    def runtime(self) -> Runtime:
        """The process's Runtime, built on first use (building awaits nothing, so the
        invocations on the loop never build two)."""
        with self._lock:
            if self._runtime is None:
                settings = self._settings or self.read_settings()
                self._runtime = Runtime.from_settings(settings, self.store_type, **self._overrides)
                log.info("runtime ready as %s", self._runtime.instance_id)
            return self._runtime

    def read_settings(self) -> Settings:
        """The environment's settings, read on first use when the load checked none: every
        app's (the pattern app's alone; the operations root reads the retention purge's too)."""
        return Settings.from_env()

    async def close(self) -> None:
        """Close what was opened (a host stopping, a test ending), on the functions' loop."""
        with self._lock:
            rt, self._runtime = self._runtime, None
        if rt is not None:
            await rt.close()


class PatternRoot(Root):
    """The pattern app's: the Runtime its Scheduler, Agents and Supervisor share."""
