"""The storage fault proxy (devstack.faults.storage_proxy) in the test's event loop, in front of
the real Azurite: a Table service that reaches Azurite through it, and the proxy itself, to arm
one exact failure (``proxy.arm("reset_after_apply", method="POST", path="$batch")``)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from adapters.tables import TableService
from adapters.tables.auth import parse_connection_string
from devstack.faults.storage_proxy import MAX_BODY_BYTES, FaultRates, StorageProxy
from devstack.stack.azurite import StorageAccount


@asynccontextmanager
async def through_proxy(
    account: StorageAccount, *, hold_s: float = 2.0, trickle_s: float = 0.4, **options: Any
) -> AsyncIterator[tuple[StorageProxy, TableService]]:
    """``options``: the Table service's (``read_timeout``, ``request_hook``, ...). No fault
    is injected until one is armed."""
    origin, account_name = account.table_endpoint.rsplit("/", 1)
    proxy = StorageProxy(origin, FaultRates(), seed=0, hold_s=hold_s, trickle_s=trickle_s)
    await proxy.start()
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    listener = socket.create_server(("127.0.0.1", 0))
    await web.SockSite(runner, listener).start()
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}/{account_name}"
    service = TableService(
        endpoint, parse_connection_string(account.connection_string).auth, **options
    )
    try:
        yield proxy, service
    finally:
        await service.close()
        await runner.cleanup()
        await proxy.close()
