"""An httpx transport over the project's HTTP/1.1 connection pools, for the agents' remote calls
(what it does per request, and why: :mod:`core.httpx_exchange`). Written once, async; its sync
twin :class:`core.http_transport.PooledTransport` is generated (``devstack.unasync``).
"""

from __future__ import annotations

import ssl
import threading

import httpx

from core.http11 import ConnectionPool, TransportError
from core.httpx_exchange import (
    MAX_BODY_BYTES,
    MAX_ORIGINS,
    Origin,
    fields,
    httpx_error,
    origin_key,
    origin_text,
    replayable,
    response,
    timeouts,
)


class PooledAsyncTransport(httpx.AsyncBaseTransport):
    """httpx requests over HTTP/1.1 connection pools (core.http11's, or their asyncio twins here),
    one per origin. Safe to share between tasks, and the sync twin between threads."""

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
        self._lock = threading.Lock()  # never held across an await

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
        evicted: list[ConnectionPool] = []
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                pool = ConnectionPool(
                    origin_text(url),
                    max_connections=self._max_connections,
                    connect_timeout=self._connect_timeout,
                    read_timeout=self._read_timeout,
                    ssl_context=self._ssl,
                )
                self._pools[key] = pool
                while len(self._pools) > self._max_origins:
                    evicted.append(self._pools.pop(next(iter(self._pools))))
        for old in evicted:  # its requests under way finish; their connections then close
            await old.close()
        return pool

    async def aclose(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.close()
