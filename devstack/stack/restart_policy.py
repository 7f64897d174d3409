"""When to restart a process of the local stack that died: pure decisions, no processes.

A process that dies is restarted after a delay that doubles with each failure in a row
(``base_s``, ``2 * base_s``, … up to ``max_s``); a process that ran for ``stable_s`` before it
died counts as healthy again, so its next restart is quick. A restart that fails counts as one
more failure. Nothing ever gives up: a development stack should heal once the cause is fixed
(a port freed, a file restored), and each attempt is logged.

Which other processes to restart with one (:func:`dependents`) is also decided here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class RestartPolicy:
    base_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    stable_s: float = 30.0

    def delay(self, failures: int) -> float:
        """Seconds to wait before restarting after ``failures`` failures in a row (≥ 1)."""
        if failures < 1:
            return 0.0
        return min(self.max_s, self.base_s * self.factor ** (failures - 1))


@dataclass(frozen=True)
class Watch:
    """What the supervisor knows of one process: since when it runs, or when it is due back."""

    started_at: float
    failures: int = 0
    """Failures in a row: exits before ``stable_s`` and failed restarts."""
    restart_at: float | None = None
    """Set while the process is down: when to start it again."""
    restarts: int = 0
    """Restarts that succeeded over the stack's life."""

    @property
    def down(self) -> bool:
        return self.restart_at is not None

    def due(self, now: float) -> bool:
        return self.restart_at is not None and now >= self.restart_at


def exited(watch: Watch, now: float, policy: RestartPolicy) -> Watch:
    """The process was found dead at ``now``: schedule its restart."""
    ran_s = now - watch.started_at
    failures = 1 if ran_s >= policy.stable_s else watch.failures + 1
    return replace(watch, failures=failures, restart_at=now + policy.delay(failures))


def restart_failed(watch: Watch, now: float, policy: RestartPolicy) -> Watch:
    """A restart attempt did not bring the process up: try again later."""
    failures = watch.failures + 1
    return replace(watch, failures=failures, restart_at=now + policy.delay(failures))


def restarted(watch: Watch, now: float) -> Watch:
    """The process is up again. Its failures are forgiven only once it has run ``stable_s``."""
    return replace(watch, started_at=now, restart_at=None, restarts=watch.restarts + 1)


def dependents(name: str, components: Iterable[str]) -> list[str]:
    """Processes to restart after ``name`` was restarted, because they hold state it lost.

    The function hosts keep AMQP links to the broker; a restarted broker (same port, same
    queues, messages kept) starts with no links, and a host whose receivers were cut would
    otherwise wait for the SDK's own reconnect backoff. Restarting the hosts makes recovery
    prompt and predictable. Azurite and the fakes are plain HTTP: clients simply reconnect.
    """
    if name == "broker":
        return [c for c in components if c.startswith("host-")]
    return []
