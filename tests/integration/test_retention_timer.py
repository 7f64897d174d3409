"""The retention purge's timer, as the operations app registers it, run by the local functions
host against Azurite: each run archives and deletes the finished orders past RETENTION_DAYS in
the archive the root holds, keeps the others and records itself as the timer's; RETENTION_DAYS
= 0 turns it off. What one purge run guarantees (in flight, changed, crashed, dry run) is
tests/integration/test_purge.py's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import anyio
import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob.aio import BlobServiceClient

from adapters import archive_reading
from adapters.archive_reading import ReadableBlobArchive
from adapters.store.rows import OrderNotFound
from devstack.host import LocalHost
from domain.states import ProcessState
from service.runtime import Runtime
from tests.integration.test_state_store import T0, to_processed
from tests.integration.test_state_store import Clock as FixedClock
from tests.support.app import EXAMPLE_SETTINGS, hosting, make_runtime, operations_app

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

EVERY_SECOND = "*/1 * * * * *"
WAIT_S = 120.0


@pytest.fixture
def env(azurite, unique_name, monkeypatch) -> dict[str, str]:
    """The operations app's settings on this test's tables and archive container; the purge
    every second (PURGE_SCHEDULE is read from the environment when the app is indexed)."""
    monkeypatch.setenv("PURGE_SCHEDULE", EVERY_SECOND)
    return EXAMPLE_SETTINGS | {
        "StateStorage": azurite.connection_string,
        "ORDERS_TABLE": unique_name("orders"),
        "ACTIVE_ORDERS_TABLE": unique_name("active"),
        "SUPERVISION_TABLE": unique_name("supervision"),
        "ARCHIVE_CONTAINER": unique_name("archive"),
        "RETENTION_DAYS": "30",
    }


@pytest.fixture
async def archive(azurite, env) -> AsyncIterator[ReadableBlobArchive]:
    """The archive container the timer appends to, read back."""
    blobs = BlobServiceClient.from_connection_string(azurite.connection_string)
    yield ReadableBlobArchive(blobs.get_container_client(env["ARCHIVE_CONTAINER"]))
    with contextlib.suppress(ResourceNotFoundError):  # nothing was archived
        await blobs.delete_container(env["ARCHIVE_CONTAINER"])
    await blobs.close()


@contextlib.asynccontextmanager
async def timer_host(env: dict[str, str]) -> AsyncIterator[tuple[Runtime, LocalHost]]:
    """The operations app's retention timer on a local host, its root's Runtime like the
    test's own (which made the tables)."""
    rt = await make_runtime(env, "retention")
    app, root = operations_app(rt)
    async with hosting(app, root, rt, settings=env, host_json=None,
                       functions=["retention_purge"]) as host:  # fmt: skip
        yield rt, host


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {WAIT_S:.0f} s")
        await anyio.sleep(0.2)


def runs(host: LocalHost) -> int:
    """The timer's runs so far; none of them failed."""
    stats = host.stats()["retention_purge"]
    assert stats.failures == 0, "a run of the timer failed (the host's log says why)"
    return stats.successes


async def test_the_operations_app_timer_archives_and_deletes_what_is_past_retention(
    env, archive
) -> None:
    async with timer_host(env) as (rt, host):
        assert [f.name for f in host.functions] == ["retention_purge"]
        old = await to_processed(rt.store, FixedClock(T0), "p-old")
        recent = await to_processed(rt.store, FixedClock(rt.clock() - timedelta(days=1)), "p-new")
        for order in (old, recent):
            await rt.store.index.discard(order.order_id, order.generation)

        async def purging_run() -> bool:
            return any(run["purged"] for run in await rt.store.purges.recent(100))

        await eventually(purging_run, "run of the timer that purged")

        with pytest.raises(OrderNotFound):
            await rt.store.load("p-old")
        archived = await archive_reading.find(archive, "p-old")
        assert archived is not None and archived.process.state is ProcessState.PROCESSED
        assert (await rt.store.load("p-new")).state is ProcessState.PROCESSED, "not yet due"
        assert await archive_reading.find(archive, "p-new") is None
        (run,) = [run for run in await rt.store.purges.recent(100) if run["purged"]]
        assert run["requested_by"] == f"retention:{rt.instance_id}"
        assert (run["purged"], run["older_than_days"]) == (1, 30)
        assert runs(host) >= 1


async def test_retention_days_zero_turns_the_timer_off(env, archive) -> None:
    async with timer_host(env | {"RETENTION_DAYS": "0"}) as (rt, host):
        await to_processed(rt.store, FixedClock(T0), "p-old")

        async def ran_twice() -> bool:
            return runs(host) >= 2

        await eventually(ran_twice, "two runs of the timer")

        assert (await rt.store.load("p-old")).state is ProcessState.PROCESSED
        assert await rt.store.purges.recent() == []
        assert await archive.blobs() == []
