"""Operator operations: the one object behind the HTTP API and the CLI.

Each method takes plain Python values, validates them (a refusal is an
:class:`~service.operations.errors.OperatorError` with an HTTP status, a code and a message), and
returns a pydantic model (``model_dump(mode="json")`` gives the JSON both front ends show)::

    ops = Operations(Runtime.from_settings(Settings.from_env()))
    page = await ops.list_orders("Error", limit=20)
    await ops.resubmit(page.items[0].order_id, operator="alice@example.com", reason="card updated")

Each method delegates to the use case of the resource it acts on, where its rules are said:

- orders (list, show, watch, resubmit, cancel, restart): :mod:`service.operations.orders`; bulk
  resubmit and cancel: :mod:`service.operations.bulk`;
- the Supervisor's progress: :mod:`service.operations.supervisor`;
- alerts (list, peek, acknowledge): :mod:`service.operations.alerts`;
- dead letters (count, list, replay, purge): :mod:`service.operations.dead_letters`, and the
  dead-letter log of those actions: :mod:`service.operations.dead_letter_log`;
- purges, purge runs and archived orders: :mod:`service.operations.purge`;
- health: :mod:`service.operations.health`.

Actions (resubmit, cancel, restart, acknowledge, dead-letter replay and purge) name the
operator and say why (``reason``); the timeline records them as ``operator:<name>`` with the
reason. The clients they share (the queues, the orders table, the archive) are the
:class:`~service.operations.context.OperatorContext`'s, closed by :meth:`Operations.close`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta

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
from service.operations.models import (
    AckView,
    ActionView,
    AlertPage,
    AlertView,
    ArchivedOrderView,
    BulkView,
    DeadLetterActionView,
    DeadLetterLogView,
    DeadLetterPage,
    DeadLetterSummary,
    HealthView,
    OrderDetail,
    OrderPage,
    PurgeRunsView,
    PurgeView,
    SupervisorView,
    WatchView,
)
from service.runtime import Runtime


class Operations:
    """Operator operations over one Runtime (its settings, state store and message sending)."""

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

    async def close(self) -> None:
        await self.ctx.close()

    def use_archive(self, store: archive.Archive) -> None:
        """Use ``store`` as the archive (tests: devstack.memory's in memory)."""
        self.ctx.use_archive(store)

    # ---------------------------------------------------------------------------- orders

    async def list_orders(
        self,
        state: str,
        *,
        step: str | None = None,
        older_than: str | None = None,
        newer_than: str | None = None,
        text: str | None = None,
        sort: str | None = None,
        limit: int = 50,
        continuation: str | None = None,
    ) -> OrderPage:
        return await orders.list_orders(
            self.ctx, state, step=step, older_than=older_than, newer_than=newer_than, text=text,
            sort=sort, limit=limit, continuation=continuation,
        )  # fmt: skip

    async def show_order(
        self, order_id: str, *, timeline_after: int = -1, timeline_limit: int = 200
    ) -> OrderDetail:
        return await orders.show_order(
            self.ctx, order_id, timeline_after=timeline_after, timeline_limit=timeline_limit
        )

    async def watch_order(
        self, order_id: str, *, after_seq: int = -1, wait_s: float = 20.0
    ) -> WatchView:
        return await orders.watch_order(self.ctx, order_id, after_seq=after_seq, wait_s=wait_s)

    async def resubmit(self, order_id: str, *, operator: str, reason: str) -> ActionView:
        return await orders.resubmit(self.ctx, order_id, operator=operator, reason=reason)

    async def cancel(self, order_id: str, *, operator: str, reason: str) -> ActionView:
        return await orders.cancel(self.ctx, order_id, operator=operator, reason=reason)

    async def restart(self, order_id: str, *, step: str, operator: str, reason: str) -> ActionView:
        return await orders.restart(self.ctx, order_id, step=step, operator=operator, reason=reason)

    async def bulk(
        self,
        action: bulk.BulkAction,
        *,
        operator: str,
        reason: str | None,
        state: str | None = None,
        step: str | None = None,
        older_than: str | None = None,
        newer_than: str | None = None,
        text: str | None = None,
        dry_run: bool = False,
        order_ids: Sequence[str] | None = None,
        limit: int = bulk.MAX_BULK,
    ) -> BulkView:
        return await bulk.bulk(
            self.ctx, action, operator=operator, reason=reason, state=state, step=step,
            older_than=older_than, newer_than=newer_than, text=text, dry_run=dry_run,
            order_ids=order_ids, limit=limit,
        )  # fmt: skip

    async def supervisor(self) -> SupervisorView:
        return await supervisor.supervisor(self.ctx)

    # ----------------------------------------------------------------------------- purge

    async def purge(
        self,
        *,
        operator: str,
        state: str = "all",
        older_than_days: int | None = None,
        dry_run: bool = False,
        limit: int = 1000,
    ) -> PurgeView:
        return await purge.purge(
            self.ctx, operator=operator, state=state, older_than_days=older_than_days,
            dry_run=dry_run, limit=limit,
        )  # fmt: skip

    async def purge_runs(self, *, limit: int = 20) -> PurgeRunsView:
        return await purge.purge_runs(self.ctx, limit=limit)

    async def archived_order(self, order_id: str, *, day: str | None = None) -> ArchivedOrderView:
        return await purge.archived_order(self.ctx, order_id, day=day)

    # ---------------------------------------------------------------------------- alerts

    async def list_alerts(
        self, *, limit: int = 50, continuation: str | None = None, open_only: bool = False
    ) -> AlertPage:
        return await alerts.list_alerts(
            self.ctx, limit=limit, continuation=continuation, open_only=open_only
        )

    async def peek_alert(self, sequence_number: int) -> AlertView:
        return await alerts.peek_alert(self.ctx, sequence_number)

    async def acknowledge_alert(
        self, sequence_number: int, *, operator: str, reason: str | None = None
    ) -> AckView:
        return await alerts.acknowledge_alert(
            self.ctx, sequence_number, operator=operator, reason=reason
        )

    # ------------------------------------------------------------------------ dead letters

    async def dead_letter_summary(self, *, limit: int = 100) -> DeadLetterSummary:
        return await dead_letters.dead_letter_summary(self.ctx, limit=limit)

    async def list_dead_letters(
        self, queue: str, *, limit: int = 50, continuation: str | None = None
    ) -> DeadLetterPage:
        return await dead_letters.list_dead_letters(
            self.ctx, queue, limit=limit, continuation=continuation
        )

    async def replay_dead_letters(
        self,
        queue: str,
        *,
        operator: str,
        sequence_numbers: Sequence[int] | None = None,
        everything: bool = False,
        dry_run: bool = False,
        limit: int = 100,
        reason: str | None = None,
    ) -> DeadLetterActionView:
        return await dead_letters.replay_dead_letters(
            self.ctx, queue, operator=operator, sequence_numbers=sequence_numbers,
            everything=everything, dry_run=dry_run, limit=limit, reason=reason,
        )  # fmt: skip

    async def purge_dead_letters(
        self,
        queue: str,
        *,
        operator: str,
        sequence_numbers: Sequence[int] | None = None,
        everything: bool = False,
        dry_run: bool = False,
        limit: int = 100,
        reason: str | None = None,
    ) -> DeadLetterActionView:
        return await dead_letters.purge_dead_letters(
            self.ctx, queue, operator=operator, sequence_numbers=sequence_numbers,
            everything=everything, dry_run=dry_run, limit=limit, reason=reason,
        )  # fmt: skip

    async def dead_letter_log(self, *, limit: int = 20) -> DeadLetterLogView:
        return await dead_letter_log.dead_letter_log(self.ctx, limit=limit)

    # ---------------------------------------------------------------------------- health

    async def health(self) -> HealthView:
        return await health.health(self.ctx)
