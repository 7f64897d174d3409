"""How late a message reaches the local host's receiver, sent as the app sends, through the dev
broker.

    python -m benchmarks.delivery_latency [--seconds 60] [--rate 20]

The app's ``Bus`` (adapters/servicebus.py) sends a small status update every 1/rate s and one
receiver takes them as the local host's receivers do (devstack/host/servicebus_runner.py: its
``ClientPool``, prefetch 0, one message per receive, completed at once). A message's latency is
from the return of its send to the return of the receive that took it; prints one JSON document
with its p50, p99 and max and the count over 100 ms, and the same for the sends' durations.

Run from two trees to compare them. Before the SDK's keep-alive reads were switched off (the
host's receive clients, the Bus's senders), 2026-12-02, 60 s at 20/s, load average 5-10: a
receive's latency p99 106-154 ms, max 152-169 ms, 10-15 of 1,200 messages over 100 ms, and one
send in 600 taking 160-200 ms, every 30 s exactly; with both off, p99 3.3-5.2 ms, max 8-13 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from azure.servicebus.aio import ServiceBusClient

from adapters.servicebus import Bus
from devstack.host import servicebus_runner
from devstack.host.servicebus_runner import ClientPool, Connection
from devstack.stack.broker import DEFAULT_CONFIG, BrokerProcess
from domain.messages import StatusUpdate, message_id_for

QUEUE = "inventory-requests"


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 1)

    return {
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "max_ms": round(ordered[-1] * 1000, 1),
        "over_100ms": sum(v > 0.1 for v in ordered),
    }


async def measure(connection_string: str, seconds: float, rate: float) -> dict[str, object]:
    sent_at: dict[str, float] = {}
    latencies: list[float] = []
    sends: list[float] = []
    done = asyncio.Event()
    pool = ClientPool()
    receiver = await pool.open_receiver(Connection("bench", connection_string), QUEUE, 0)
    bus = Bus(lambda: ServiceBusClient.from_connection_string(connection_string))

    async def receive() -> None:
        while not done.is_set():
            for message in await receiver.receive_messages(
                max_message_count=1, max_wait_time=servicebus_runner.RECEIVE_WAIT_S
            ):
                taken = time.monotonic()
                if (sent := sent_at.get(str(message.message_id))) is not None:
                    latencies.append(taken - sent)
                await receiver.complete_message(message)

    async def send() -> None:
        order = f"o-latency-{time.time_ns()}"
        await bus.send(QUEUE, StatusUpdate(order_id=order, sequence=0, state="Pending"))
        started = time.monotonic()
        n = 1
        while time.monotonic() - started < seconds:
            update = StatusUpdate(order_id=order, sequence=n, state="Processing")
            before = time.monotonic()
            await bus.send(QUEUE, update)
            sent_at[message_id_for(update)] = after = time.monotonic()
            sends.append(after - before)
            n += 1
            await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
        await asyncio.sleep(2 * servicebus_runner.RECEIVE_WAIT_S)
        done.set()

    try:
        await asyncio.gather(receive(), send())
    finally:
        await bus.close()
        await pool.close()
    return {"messages": len(latencies), "latency": quantiles(latencies), "send": quantiles(sends)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args(argv)
    log_path = Path(tempfile.mkdtemp()) / "broker.log"
    with BrokerProcess([DEFAULT_CONFIG], log_path=log_path) as broker:
        result = asyncio.run(measure(broker.connection_string, args.seconds, args.rate))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
