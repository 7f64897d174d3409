"""The same Service Bus contract through `azure.servicebus.aio`, which has its own transport."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.exceptions import MessageLockLostError

from tests.support.broker import ServiceBusNamespace

pytestmark = pytest.mark.contract


def run(coro):
    return asyncio.run(coro)


def test_async_send_receive_complete(contract_ns: ServiceBusNamespace, queue_named):
    queue = queue_named("contract-basic")

    async def scenario() -> None:
        async with ServiceBusClient.from_connection_string(contract_ns.connection_string) as client:
            async with client.get_queue_sender(queue) as sender:
                await sender.send_messages(
                    ServiceBusMessage("async hello", message_id="a-1", correlation_id="order-a")
                )
                await sender.send_messages([ServiceBusMessage(f"a{i}") for i in range(3)])
            async with client.get_queue_receiver(queue) as receiver:
                received = []
                while len(received) < 4:
                    batch = await receiver.receive_messages(max_message_count=10, max_wait_time=5)
                    assert batch, f"only {len(received)} of 4 arrived"
                    for message in batch:
                        received.append(message)
                        await receiver.complete_message(message)
                assert [str(m) for m in received] == ["async hello", "a0", "a1", "a2"]
                assert received[0].message_id == "a-1"
                assert received[0].correlation_id == "order-a"
                assert await receiver.receive_messages(max_message_count=1, max_wait_time=1) == []

    run(scenario())


def test_async_abandon_then_dead_letter(contract_ns: ServiceBusNamespace, queue_named):
    queue = queue_named("contract-basic")

    async def scenario() -> None:
        async with ServiceBusClient.from_connection_string(contract_ns.connection_string) as client:
            async with client.get_queue_sender(queue) as sender:
                await sender.send_messages(ServiceBusMessage("twice"))
            async with client.get_queue_receiver(queue) as receiver:
                (first,) = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
                await receiver.abandon_message(first)
                (second,) = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
                assert second.delivery_count == first.delivery_count + 1
                await receiver.dead_letter_message(
                    second, reason="Rejected", error_description="async path"
                )
            async with client.get_queue_receiver(
                queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER
            ) as dlq:
                (dead,) = await dlq.receive_messages(max_message_count=1, max_wait_time=5)
                assert dead.dead_letter_reason == "Rejected"
                assert dead.dead_letter_error_description == "async path"
                await dlq.complete_message(dead)

    run(scenario())


def test_async_schedule_renew_and_lock_lost(contract_ns: ServiceBusNamespace, queue_named):
    queue = queue_named("contract-short-lock")

    async def scenario() -> None:
        async with ServiceBusClient.from_connection_string(contract_ns.connection_string) as client:
            due = datetime.now(UTC) + timedelta(seconds=4)
            async with client.get_queue_sender(queue) as sender:
                (seq,) = await sender.schedule_messages(ServiceBusMessage("scheduled"), due)
            async with client.get_queue_receiver(queue) as receiver:
                (message,) = await receiver.receive_messages(max_message_count=1, max_wait_time=10)
                assert message.sequence_number == seq
                assert datetime.now(UTC) >= due - timedelta(milliseconds=200)
                renewed = await receiver.renew_message_lock(message)
                assert renewed >= message.locked_until_utc - timedelta(seconds=1)
                await asyncio.sleep(
                    (message.locked_until_utc - datetime.now(UTC)).total_seconds() + 1
                )
                with pytest.raises(MessageLockLostError):
                    await receiver.complete_message(message)
                (again,) = await receiver.receive_messages(max_message_count=1, max_wait_time=10)
                assert again.delivery_count == 1
                await receiver.complete_message(again)

    run(scenario())


def test_async_competing_receivers(contract_ns: ServiceBusNamespace, queue_named):
    queue = queue_named("contract-basic")
    total = 100

    async def scenario() -> list[str]:
        async with ServiceBusClient.from_connection_string(contract_ns.connection_string) as client:
            async with client.get_queue_sender(queue) as sender:
                await sender.send_messages([ServiceBusMessage(str(i)) for i in range(total)])
            seen: list[str] = []

            async def consume() -> None:
                async with client.get_queue_receiver(queue) as receiver:
                    while batch := await receiver.receive_messages(
                        max_message_count=10, max_wait_time=2
                    ):
                        for message in batch:
                            await receiver.complete_message(message)
                            seen.append(str(message))

            await asyncio.gather(*(consume() for _ in range(3)))
            return seen

    seen = run(scenario())
    assert sorted(seen, key=int) == [str(i) for i in range(total)]
