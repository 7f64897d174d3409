"""Fixtures for the Service Bus contract suite, driven through ``azure.servicebus.aio`` (the
client the app and the local host use), one client per test on the test's event loop.

Locally the whole suite runs twice: against a development broker in memory and against one with
`--data-dir` (SQLite), so both storage paths keep the contract. With
SERVICEBUS_CONNECTION_STRING_TESTS set it runs once, against that endpoint (the official
emulator or a real namespace on which the queues of tests/contract/Config.json exist).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusReceiveMode, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient

from tests.support.broker import (
    EXTERNAL_ENV_VAR,
    ServiceBusNamespace,
    external_namespace,
    start_local_namespace,
)

CONTRACT_CONFIG = Path(__file__).with_name("Config.json")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "contract_ns" in metafunc.fixturenames:
        modes = ["external"] if os.environ.get(EXTERNAL_ENV_VAR) else ["memory", "data-dir"]
        metafunc.parametrize("contract_ns", modes, indirect=True, scope="session")


@pytest.fixture(scope="session")
def contract_ns(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceBusNamespace]:
    """The Service Bus under contract: external, or a local broker in the requested mode."""
    if request.param == "external":
        namespace = external_namespace([CONTRACT_CONFIG])
        assert namespace is not None
        yield namespace
        return
    workdir = tmp_path_factory.mktemp(f"contract-{request.param}")
    data_dir = workdir / "data" if request.param == "data-dir" else None
    namespace = start_local_namespace([CONTRACT_CONFIG], workdir, data_dir=data_dir)
    try:
        yield namespace
    finally:
        assert namespace.broker is not None
        namespace.broker.stop()


@pytest.fixture
async def sb_client(contract_ns: ServiceBusNamespace) -> AsyncIterator[ServiceBusClient]:
    async with ServiceBusClient.from_connection_string(contract_ns.connection_string) as client:
        yield client


async def drain(client: ServiceBusClient, queue: str) -> None:
    """Empty a queue and its dead-letter queue so a test starts from nothing. Both at once:
    each receiver costs about a second however little it holds (its open, its last empty
    wait, and its close, which waits out the SDK's keep-alive task's one-second sleep)."""

    async def empty(sub_queue: ServiceBusSubQueue | None) -> None:
        async with client.get_queue_receiver(
            queue,
            sub_queue=sub_queue,
            receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
        ) as receiver:
            while await receiver.receive_messages(max_message_count=100, max_wait_time=0.3):
                pass

    await asyncio.gather(empty(None), empty(ServiceBusSubQueue.DEAD_LETTER))


@pytest.fixture
def queue_named(
    contract_ns: ServiceBusNamespace, sb_client: ServiceBusClient
) -> Callable[[str], Awaitable[str]]:
    """`await queue_named("contract-basic")` -> the run's actual name, drained first."""

    async def named(logical: str) -> str:
        actual = contract_ns.queue(logical)
        await drain(sb_client, actual)
        return actual

    return named
