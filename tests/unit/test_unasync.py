"""The sync I/O shell is generated from its async source (devstack.unasync): the rules, and
that every generated module is what its source generates now."""

from __future__ import annotations

import pytest

from devstack import unasync

SOURCE = '''"""Doc: async and await stay in strings."""
from azure.servicebus.aio import ServiceBusClient
from core.aio import apply
from core.aio.primitives import Lock


class Store:
    async def __aenter__(self) -> Store:
        async with self._lock:
            await apply.go(await self.read(), mode=1)  # await stays in comments
        async for row in self.rows():
            print(row)
        return self

    async def close(self) -> None:
        await self._http.aclose()
'''

SYNC = '''"""Doc: async and await stay in strings."""
from azure.servicebus import ServiceBusClient
from core import apply
from core.primitives import Lock


class Store:
    def __enter__(self) -> Store:
        with self._lock:
            apply.go(self.read(), mode=1)  # await stays in comments
        for row in self.rows():
            print(row)
        return self

    def close(self) -> None:
        self._http.close()
'''


def test_async_source_becomes_its_sync_twin() -> None:
    assert unasync.unasync_text(SOURCE) == SYNC


def test_sync_twin_compiles() -> None:
    compile(unasync.unasync_text(SOURCE), "<sync>", "exec")


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("core/aio/bus.py", "core/bus.py"),
        ("core/tablestorage/aio/client.py", "core/tablestorage/client.py"),
        ("agent/aio/handler.py", "agent/handler.py"),
    ],
)
def test_target_drops_the_aio_package(source: str, target: str) -> None:
    assert unasync.target_of(source) == target


def test_a_module_outside_aio_is_refused() -> None:
    with pytest.raises(ValueError, match="not under an aio package"):
        unasync.target_of("core/bus.py")


def test_hand_written_modules_generate_nothing() -> None:
    assert not set(unasync.sources()) & unasync.HAND_WRITTEN
    assert all("/aio/" in source for source in unasync.sources())


def test_every_generated_module_is_current() -> None:
    stale = list(unasync.stale())
    assert not stale, f"run `python -m devstack.unasync`: {stale} differ from their sources"
