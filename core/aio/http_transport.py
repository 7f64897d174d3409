"""The asyncio twin of :mod:`core.http_transport`: an httpx async transport over the asyncio
h11 pools (:mod:`core.aio.http11`), for the agents' ``httpx.AsyncClient``.

Hand-written in both forms (listed in ``devstack.unasync.HAND_WRITTEN``; ``NAMES`` maps
:class:`PooledAsyncTransport` to :class:`~core.http_transport.PooledTransport` in generated
modules). Everything that does no I/O is the sync module's: what a request sends, the timeouts
it takes, the answer as an ``httpx.Response``, the errors, :func:`proxied_by_env`; read its
docstring for the behaviour (and why proxies keep httpx's own transport). The one difference is
the pools': ``read`` bounds the whole exchange here, not each socket read.
"""

from __future__ import annotations

import ssl

import httpx

from core.aio.http11 import ConnectionPool, TransportError
from core.http_transport import (
    MAX_BODY_BYTES,
    MAX_ORIGINS,
    Origin,
    fields,
    httpx_error,
    origin_key,
    origin_text,
    proxied_by_env,
    replayable,
    response,
    timeouts,
)

__all__ = ["MAX_BODY_BYTES", "MAX_ORIGINS", "PooledAsyncTransport", "proxied_by_env"]


class PooledAsyncTransport(httpx.AsyncBaseTransport):
    """httpx requests over :class:`core.aio.http11.ConnectionPool`s, one per
    origin, on the event loop that runs them."""

    def __init__(
        self,
        *,
        max_connections: int = 64,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_origins: int = MAX_ORIGINS,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``max_connections`` per origin; the timeouts apply where httpx gives none."""
        if max_body_bytes < 1 or max_origins < 1:
            raise ValueError("max_body_bytes and max_origins must be positive")
        self._max_connections = max_connections
        self._max_body_bytes = max_body_bytes
        self._max_origins = max_origins
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._ssl = ssl_context
        self._pools: dict[Origin, ConnectionPool] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        pool = await self._pool(request.url)
        body = await request.aread()
        connect_s, read_s = timeouts(request)
        method, target = request.method, request.url.raw_path.decode("ascii")
        sent = fields(request)
        for attempt in (0, 1):
            try:
                answer = await pool.request(
                    method,
                    target,
                    sent,
                    body or None,
                    connect_timeout=connect_s,
                    read_timeout=read_s,
                    max_body_bytes=self._max_body_bytes,
                )
            except TransportError as error:
                if attempt == 0 and error.reused and replayable(request):
                    continue  # a kept-alive connection closed as it was taken: not an outage
                raise httpx_error(error, request) from error
            return response(answer, request)
        raise AssertionError("unreachable")

    async def _pool(self, url: httpx.URL) -> ConnectionPool:
        key = origin_key(url)
        pool = self._pools.get(key)
        if pool is not None:
            return pool
        pool = self._pools[key] = ConnectionPool(
            origin_text(url),
            max_connections=self._max_connections,
            connect_timeout=self._connect_timeout,
            read_timeout=self._read_timeout,
            ssl_context=self._ssl,
        )
        while len(self._pools) > self._max_origins:
            # its requests under way finish; their connections then close
            await self._pools.pop(next(iter(self._pools))).close()
        return pool

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.close()
