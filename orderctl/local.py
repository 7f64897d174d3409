"""Local mode: the operator operations in process, on the stack running on this machine.

:class:`LocalOperations` is the :class:`orderctl.backend.OperatorBackend` of local mode (the
remote one is :class:`orderctl.remote.RemoteOperations`). Its operations are the use cases of
:mod:`service.operations` themselves, each with the context bound as its first argument, so
their parameters and defaults are the use cases' own: nothing here restates a signature.
The protocol says which of them `orderctl` calls, and with what types.

Importing this module pulls in the Azure SDKs: `orderctl` imports it only when it runs a
command in local mode.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Final

from azure.servicebus.aio import ServiceBusClient

from adapters import archive
from service.operations import (
    alerts,
    bulk,
    dead_letter_log,
    dead_letter_settler,
    dead_letters,
    health,
    orders,
    purge,
    supervisor,
)
from service.operations.context import OperatorContext
from service.runtime import Runtime

USE_CASES: Final[tuple[Callable[..., Awaitable[Any]], ...]] = (
    orders.list_orders,
    orders.show_order,
    orders.watch_order,
    orders.resubmit,
    orders.cancel,
    orders.restart,
    bulk.bulk,
    supervisor.supervisor,
    alerts.list_alerts,
    alerts.peek_alert,
    alerts.acknowledge_alert,
    dead_letters.dead_letter_summary,
    dead_letters.list_dead_letters,
    dead_letters.replay_dead_letters,
    dead_letters.purge_dead_letters,
    dead_letter_log.dead_letter_log,
    purge.purge,
    purge.purge_runs,
    purge.archived_order,
    health.health,
)
"""Each operator use case: an attribute of :class:`LocalOperations` by its own name."""


class LocalOperations:
    """The operator use cases on one :class:`OperatorContext` over ``rt``
    (``ops.resubmit(order_id, operator=..., reason=...)`` is
    ``orders.resubmit(ops.ctx, order_id, operator=..., reason=...)``).

    ``servicebus``, ``duplicate_window`` and ``sleep`` are the context's (tests change them)."""

    def __init__(
        self,
        rt: Runtime,
        *,
        servicebus: Callable[[], ServiceBusClient] | None = None,
        duplicate_window: timedelta = dead_letter_settler.DUPLICATE_WINDOW,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.rt = rt
        self.ctx = OperatorContext(
            rt, servicebus=servicebus, duplicate_window=duplicate_window, sleep=sleep
        )
        for use_case in USE_CASES:
            setattr(self, use_case.__name__, functools.partial(use_case, self.ctx))

    async def close(self) -> None:
        await self.ctx.close()

    def use_archive(self, store: archive.Archive) -> None:
        """Use ``store`` as the archive (tests: devstack.memory's in memory)."""
        self.ctx.use_archive(store)
