"""The remote client over core.http_transport against the real fake-services server: every test
of tests/integration/test_remote_client_http.py again, its ``http`` client on
:class:`~core.http_transport.PooledAsyncTransport` (faults, hangs, Retry-After, an unreachable
service)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from core.http_transport import PooledAsyncTransport
from tests.integration.test_remote_client_http import *  # noqa: F403 (its tests run here too)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:  # overrides the imported module's
    async with httpx.AsyncClient(transport=PooledAsyncTransport()) as client:
        assert isinstance(client._transport, PooledAsyncTransport)
        yield client
