"""What every operator use case works with: the Runtime (settings, state store, clock), the
queues (peeks and settling, :mod:`adapters.queues`), the orders table itself and the archive.

One context per front end (the operator API and the dashboard summary, each held by the
operations app's composition root, :mod:`service.operations.composition`; `orderctl`); its
clients are built on first use (building awaits nothing, so calls on the event loop never build
two) and closed with it. The operator API's archive is the root's, shared with the retention
timer (the root closes it); any other context opens its own on first use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

from azure.servicebus.aio import ServiceBusClient

from adapters import clients
from adapters.archive_reading import ReadableArchive, ReadableBlobArchive
from adapters.queues import QueueTools
from adapters.tables import Table
from service.operations.dead_letter_settler import DUPLICATE_WINDOW
from service.operations.errors import NotFound
from service.purge import open_archive
from service.runtime import Runtime


class OperatorContext:
    """``servicebus``: the client factory (default: the app's, with one quick retry);
    ``duplicate_window``: the queues' duplicate detection window (a replay waits it out);
    ``sleep``: what a watch waits with between reads; ``archive``: where the archive comes
    from, its owner closing it (default: the context opens its own, and closes it)."""

    def __init__(
        self,
        rt: Runtime,
        *,
        servicebus: Callable[[], ServiceBusClient] | None = None,
        duplicate_window: timedelta = DUPLICATE_WINDOW,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        archive: Callable[[], ReadableArchive] | None = None,
    ) -> None:
        self.rt = rt
        self.duplicate_window = duplicate_window
        self.sleep = sleep
        conn = rt.settings.servicebus
        # Interactive use: one quick retry, then the operator sees the error and tries again.
        factory = servicebus or (
            lambda: clients.servicebus_client(conn, retry_total=1, retry_backoff_factor=0.2)
        )
        self.queues = QueueTools(factory)
        self._orders_table: Table | None = None
        self._shared_archive = archive
        self._archive: ReadableArchive | None = None

    async def close(self) -> None:
        await self.queues.close()
        if self._shared_archive is None and isinstance(self._archive, ReadableBlobArchive):
            await self._archive.close()
        if self._orders_table is not None:
            await self._orders_table.close()

    def orders_table(self) -> Table:
        """The orders table itself, for reads the state store has no index for and for the
        dead-letter log's partition."""
        if self._orders_table is None:
            service = clients.table_service(self.rt.settings.storage)
            self._orders_table = service.get_table_client(
                self.rt.settings.orders_table, owns_service=True
            )
        return self._orders_table

    def archive(self) -> ReadableArchive:
        if self._archive is None:
            opened = self._shared_archive
            self._archive = (
                opened() if opened else open_archive(self.rt.settings, ReadableBlobArchive)
            )
        return self._archive

    def use_archive(self, store: ReadableArchive) -> None:
        """Use ``store`` as the archive (tests: devstack.memory's in memory)."""
        self._archive = store

    def queue(self, role: str) -> str:
        """The entity of one of the app's queues, named by its role (``orders``, ``alerts``...)."""
        queues = self.rt.settings.queues
        if not isinstance(role, str) or role not in queues:
            known = ", ".join(queues)
            raise NotFound("unknown_queue", f"no queue {str(role)[:64]!r}; known: {known}")
        return queues[role]
