"""Fixtures for the Service Bus contract suite.

The suite runs against the session `servicebus` fixture: the development broker by default, or
any Service Bus named by SERVICEBUS_CONNECTION_STRING_TESTS (the official emulator or a real
namespace on which the queues of tests/contract/Config.json exist).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode, ServiceBusSubQueue

from tests.support.broker import EXTERNAL_ENV_VAR, ServiceBusNamespace

CONTRACT_CONFIG = Path(__file__).with_name("Config.json")

local_broker_only = pytest.mark.skipif(
    bool(os.environ.get(EXTERNAL_ENV_VAR)),
    reason="needs the development broker's process (restart, raw frames)",
)


@pytest.fixture(scope="session")
def sb_client(servicebus: ServiceBusNamespace) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(servicebus.connection_string) as client:
        yield client


def drain(client: ServiceBusClient, queue: str) -> None:
    """Empty a queue and its dead-letter queue so a test starts from nothing."""
    for sub_queue in (None, ServiceBusSubQueue.DEAD_LETTER):
        with client.get_queue_receiver(
            queue,
            sub_queue=sub_queue,
            receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
        ) as receiver:
            while receiver.receive_messages(max_message_count=100, max_wait_time=0.3):
                pass


@pytest.fixture
def queue_named(servicebus: ServiceBusNamespace, sb_client: ServiceBusClient):
    """`queue_named("contract-basic")` -> the run's actual name, drained before the test."""

    def named(logical: str) -> str:
        actual = servicebus.queue(logical)
        drain(sb_client, actual)
        return actual

    return named
