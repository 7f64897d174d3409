"""The same Service Bus contract through `azure.servicebus.aio`, which has its own transport."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import AutoLockRenewer, ServiceBusClient
from azure.servicebus.exceptions import MessageLockLostError

from tests.support.broker import ServiceBusNamespace

pytestmark = pytest.mark.contract

# LockDuration of contract-lock-renew. 10 s, not the service's minimum of 5: a renewal may be
# that late on a loaded machine (fifty messages, CI workers sharing two cores) and still hold.
LOCK_RENEW_QUEUE_LOCK_S = 10


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


def test_async_auto_lock_renewer_holds_fifty_locks_on_one_receiver(
    contract_ns: ServiceBusNamespace, queue_named
):
    queue = queue_named("contract-lock-renew")
    total, hold = 50, 3 * LOCK_RENEW_QUEUE_LOCK_S + 1

    async def scenario() -> list[str]:
        failures: list[str] = []
        async with ServiceBusClient.from_connection_string(contract_ns.connection_string) as client:
            async with client.get_queue_sender(queue) as sender:
                await sender.send_messages([ServiceBusMessage(f"held-{i}") for i in range(total)])
            renewer = AutoLockRenewer()
            async with client.get_queue_receiver(queue, prefetch_count=total) as receiver:
                held = []
                while len(held) < total:
                    batch = await receiver.receive_messages(
                        max_message_count=total - len(held), max_wait_time=5
                    )
                    assert batch, f"only {len(held)} of {total} arrived"
                    held += batch
                first_locks = {m.sequence_number: m.locked_until_utc for m in held}

                async def failed(message, error) -> None:
                    failures.append(f"{message.sequence_number}: {error!r}")

                for message in held:
                    renewer.register(
                        receiver,
                        message,
                        max_lock_renewal_duration=hold + 30,
                        on_lock_renew_failure=failed,
                    )
                await asyncio.sleep(hold)
                assert failures == []
                assert all(m.locked_until_utc > first_locks[m.sequence_number] for m in held)
                async with client.get_queue_receiver(queue) as other:
                    assert await other.receive_messages(max_wait_time=1) == [], "a lock let go"
                for message in held:
                    await receiver.complete_message(message)
            await renewer.close()
            return [str(m) for m in held]

    assert sorted(run(scenario())) == sorted(f"held-{i}" for i in range(total))


def test_async_management_requests_in_flight_together(
    contract_ns: ServiceBusNamespace, queue_named
):
    """Renew, peek, receive-deferred on one receiver and schedule, cancel on one sender, all
    outstanding at once: each answer reaches the request it belongs to."""
    queue = queue_named("contract-basic")

    async def scenario() -> None:
        async with ServiceBusClient.from_connection_string(contract_ns.connection_string) as client:
            async with client.get_queue_sender(queue) as sender:
                await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(6)])
                due = datetime.now(UTC) + timedelta(hours=1)
                seqs = await asyncio.gather(
                    *(sender.schedule_messages(ServiceBusMessage(f"s{i}"), due) for i in range(5))
                )
                scheduled = [seq for (seq,) in seqs]
                assert len(set(scheduled)) == 5
                await asyncio.gather(*(sender.cancel_scheduled_messages(s) for s in scheduled))
            async with client.get_queue_receiver(queue) as receiver:
                messages = []
                while len(messages) < 6:
                    messages += await receiver.receive_messages(
                        max_message_count=6, max_wait_time=5
                    )
                deferred, kept = messages[:3], messages[3:]
                for message in deferred:
                    await receiver.defer_message(message)
                results = await asyncio.gather(
                    *(receiver.renew_message_lock(m) for m in kept),
                    *(receiver.receive_deferred_messages([m.sequence_number]) for m in deferred),
                    receiver.peek_messages(max_message_count=20, sequence_number=1),
                )
                renewed, again, peeked = results[:3], results[3:6], results[6]
                assert renewed == [m.locked_until_utc for m in kept]
                assert [a.sequence_number for (a,) in again] == [
                    m.sequence_number for m in deferred
                ]
                assert {m.sequence_number for m in peeked} == {m.sequence_number for m in messages}
                for message in [*kept, *(a for (a,) in again)]:
                    await receiver.complete_message(message)
                assert await receiver.peek_messages(max_message_count=20, sequence_number=1) == []

    run(scenario())
