"""Keeping a local stack alive: find a dead process, restart it with backoff, say so.

The decisions (when, how often, what else) are :mod:`devstack.stack.restart_policy`; this is
the loop that looks at processes and acts. It runs on the event loop of the thread that started
the stack: the stack's processes die with the thread that spawned them (``PR_SET_PDEATHSIG``),
so restarts must come from the same, long-lived thread.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol

from devstack.stack.processes import ServiceStartError
from devstack.stack.restart_policy import (
    RestartPolicy,
    Watch,
    dependents,
    exited,
    restart_failed,
    restarted,
)

DEFAULT_POLICY = RestartPolicy()

EventKind = Literal["exited", "restarted", "restart_failed"]


@dataclass(frozen=True)
class StackEvent:
    at: datetime
    component: str
    kind: EventKind
    detail: str

    def line(self) -> str:
        return f"{self.at:%H:%M:%S} {self.component} {self.kind.replace('_', ' ')}: {self.detail}"


class Supervised(Protocol):
    """What the supervisor needs of a stack (LocalStack, or a fake in tests)."""

    def components(self) -> list[str]: ...
    def exit_code(self, name: str) -> int | None: ...
    async def restart(self, name: str) -> int: ...


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class StackSupervisor:
    def __init__(
        self,
        stack: Supervised,
        *,
        report: Callable[[StackEvent], None],
        policy: RestartPolicy = DEFAULT_POLICY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stack = stack
        self.report = report
        self.policy = policy
        self.clock = clock
        now = clock()
        self.watches = {name: Watch(started_at=now) for name in stack.components()}

    async def run(self, stop: asyncio.Event, interval: float = 0.5) -> None:
        """Check every ``interval`` seconds until ``stop`` is set."""
        while True:
            try:
                await asyncio.wait_for(stop.wait(), interval)
                return
            except TimeoutError:
                await self.check()

    async def check(self) -> None:
        """One look at every process: note the dead, restart those whose delay has passed."""
        for name in self.stack.components():
            watch = self.watches[name]
            if not watch.down:
                code = self.stack.exit_code(name)
                if code is None:
                    continue
                watch = exited(watch, self.clock(), self.policy)
                self._say(name, "exited", f"{describe_exit(code)}; {self._when(watch)}")
            if watch.due(self.clock()):
                watch = await self._restart(name, watch)
            self.watches[name] = watch

    async def _restart(self, name: str, watch: Watch) -> Watch:
        try:
            pid = await self.stack.restart(name)
        except (ServiceStartError, OSError) as error:
            watch = restart_failed(watch, self.clock(), self.policy)
            lines = str(error).strip().splitlines() or [repr(error)]
            first = lines[0].rstrip(":") + (" (see its log)" if len(lines) > 1 else "")
            self._say(name, "restart_failed", f"{first}; {self._when(watch)}")
            return watch
        watch = restarted(watch, self.clock())
        self._say(name, "restarted", f"PID {pid} (restart {watch.restarts})")
        for other in dependents(name, self.stack.components()):
            if not self.watches[other].down:
                self.watches[other] = await self._restart(other, self.watches[other])
        return watch

    def _when(self, watch: Watch) -> str:
        assert watch.restart_at is not None
        delay = max(0.0, watch.restart_at - self.clock())
        return f"restarting in {delay:.1f} s (failure {watch.failures} in a row)"

    def _say(self, name: str, kind: EventKind, detail: str) -> None:
        self.report(StackEvent(datetime.now(UTC), name, kind, detail))
