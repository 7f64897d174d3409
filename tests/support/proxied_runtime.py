"""A store's tables made fresh on Azurite, and a Runtime whose store reaches them through the
storage fault proxy (:func:`tests.support.storage_faults.through_proxy`): for tests of the
invocation's deadline against the real storage, answering as slowly as the proxy makes it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from adapters.settings import Settings
from adapters.store.records import OrderRecords
from devstack.faults.storage_proxy import StorageProxy
from devstack.memory import MemoryBus
from devstack.stack.azurite import StorageAccount
from service.runtime import Runtime
from tests.support.names import unique_name
from tests.support.storage_faults import through_proxy


@asynccontextmanager
async def fresh_tables(account: StorageAccount) -> AsyncIterator[dict[str, str]]:
    """The store's three tables under new names (its ``*_table`` arguments), deleted on leaving."""
    names = {
        "orders_table": unique_name("orders"),
        "active_table": unique_name("active"),
        "supervision_table": unique_name("supervision"),
    }
    async with OrderRecords.from_connection_string(account.connection_string, **names) as s:
        await s.ensure_tables()
        yield names
        for name in names.values():
            await s._service.delete_table(name)


@asynccontextmanager
async def runtime_through_proxy(
    account: StorageAccount, tables: dict[str, str], settings: Settings
) -> AsyncIterator[tuple[StorageProxy, Runtime]]:
    """A Runtime on ``tables`` (a memory bus), its Table calls through a proxy that trickles an
    armed answer a byte every 0.4 s (no read timeout fires)."""
    async with through_proxy(account, trickle_s=0.4) as (proxy, service):
        store = OrderRecords(service, **tables)
        rt = Runtime(settings, store, MemoryBus(), settings.workflows())  # type: ignore[arg-type]
        yield proxy, rt
