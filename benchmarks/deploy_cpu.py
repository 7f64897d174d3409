"""CPU of what deploys, per order: the app's handlers alone, one execution at a time.

    python -m benchmarks.deploy_cpu [--orders 100] [--warmup 10] [--workflow order]

Starts Azurite, the development broker and the fake services with every call answered after
1 ms (the local stack without a function host), and plays the Functions host's part itself, as
Azure's does outside the Python worker: it receives each message of an order in turn with the
SDK, turns it into the ``func.ServiceBusMessage`` the host passes, awaits the trigger's handler
(``scheduler.functions.on_submission`` and ``on_reply``, ``agent.functions.on_request``) on the
app's Runtime, and completes the message. Only the handler is counted: the process's CPU
(``time.process_time``) from the call to its return, while nothing else of the harness runs
(one message at a time, no prefetch). That is what an instance spends per order in Azure, its
host aside, with telemetry off as in ``benchmarks.peers``; ``benchmarks.peers --cpu-split``
estimates the same from samples under load, where sends are grouped and the hosts contend.
Measured one order at a time, it does not depend on how busy the stack is, and little on the
machine's other load (caches aside): it is the number to compare before and after a change.

The harness uses only the SDK, ``to_function_message`` and the handlers' signatures, so the
same file measures an older tree too (run it with that tree first on ``PYTHONPATH``).

Prints one JSON document: per handler and per order, CPU milliseconds (median, p10, p90 over the
measured orders), and the 1-minute load average when the measurement began and ended.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver

from adapters.servicebus import to_servicebus_message
from adapters.settings import Settings
from agent.functions import on_request
from benchmarks.history import new_order
from devstack.fakes.profiles import example_profile
from devstack.host.servicebus_runner import to_function_message
from devstack.stack.local_stack import LocalStack
from domain.agents import AGENTS, Agent
from scheduler.functions import on_reply, on_submission
from service.runtime import Runtime

RECEIVE_WAIT_S = 10.0
PROFILE = "latency-1ms"

Handler = Callable[[Any, Runtime], Awaitable[None]]


def hops(settings: Settings, workflow: str) -> list[tuple[str, str, Handler]]:
    """(name, queue, handler) of each execution of one order of ``workflow``, in order, when
    every step succeeds at once: the submission, then each step's request and its reply."""
    flow = settings.workflows()[f"{workflow}@{settings.current_version(workflow)}"]
    agents = {agent.name: agent for agent in AGENTS}
    executions: list[tuple[str, str, Handler]] = [
        ("intake", settings.queue("orders"), on_submission)
    ]
    for step in flow.steps:
        agent = agents[step.agent]
        executions.append((f"agent {agent.name}", settings.queue(agent.name), _agent(agent)))
        executions.append(("reply", settings.queue("responses"), on_reply))
    return executions


def _agent(agent: Agent) -> Handler:
    async def handle(msg: Any, rt: Runtime) -> None:
        await on_request(msg, agent, rt)

    return handle


async def measure(
    settings: Settings, workflow: str, orders: int, warmup: int
) -> dict[str, list[float]]:
    """CPU seconds per handler name (each execution) and per order ("order"), ``warmup``
    orders first left out."""
    executions = hops(settings, workflow)
    client = ServiceBusClient.from_connection_string(settings.servicebus.connection_string)
    receivers: dict[str, ServiceBusReceiver] = {}
    rt = Runtime.from_settings(settings)
    spent: dict[str, list[float]] = defaultdict(list)
    prefix = f"deploy-cpu-{uuid.uuid4().hex[:6]}-"
    try:
        for _, queue, _ in executions:
            if queue not in receivers:
                receivers[queue] = client.get_queue_receiver(
                    queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=0
                )
        async with client.get_queue_sender(settings.queue("orders")) as submitter:
            for n in range(warmup + orders):
                await submitter.send_messages(to_servicebus_message(new_order(prefix, n, workflow)))
                order_cpu = 0.0
                for name, queue, handler in executions:
                    cpu = await _one(receivers[queue], handler, rt, f"{prefix}{n:06d}")
                    order_cpu += cpu
                    if n >= warmup:
                        spent[name].append(cpu)
                if n >= warmup:
                    spent["order"].append(order_cpu)
    finally:
        await rt.close()
        for receiver in receivers.values():
            await receiver.close()
        await client.close()
    return spent


async def _one(receiver: ServiceBusReceiver, handler: Handler, rt: Runtime, order_id: str) -> float:
    """Receive the order's next message from ``receiver`` and run ``handler`` on it; its CPU."""
    while True:
        (message,) = await receiver.receive_messages(
            max_message_count=1, max_wait_time=RECEIVE_WAIT_S
        ) or [None]
        if message is None:
            raise RuntimeError(f"nothing came for {order_id} on {receiver.entity_path}")
        if message.correlation_id == order_id:
            break
        await receiver.complete_message(message)  # another run's leftover
    converted = to_function_message(message)
    started = time.process_time()
    await handler(converted, rt)
    cpu = time.process_time() - started
    await receiver.complete_message(message)
    return cpu


def summary(spent: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Milliseconds per name: median, p10 and p90, and how many values."""

    def ms(values: list[float], q: int) -> float:
        return round(statistics.quantiles(values, n=10, method="inclusive")[q] * 1000, 3)

    return {
        name: {
            "median_ms": round(statistics.median(values) * 1000, 3),
            "p10_ms": ms(values, 0),
            "p90_ms": ms(values, 8),
            "count": len(values),
        }
        for name, values in spent.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=100, help="orders measured (at least 2)")
    parser.add_argument("--warmup", type=int, default=10, help="orders run first, not measured")
    parser.add_argument("--workflow", default="order", choices=["order", "single_step"])
    parser.add_argument("--workdir", type=Path, help="the stack's directory (default: a new one)")
    args = parser.parse_args(argv)
    if args.orders < 2:
        parser.error("--orders must be at least 2 (a median and deciles need two values)")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="deploy-cpu-"))
    stack = LocalStack(workdir, hosts=0, profile=example_profile(PROFILE))
    try:
        info = asyncio.run(stack.start(progress=lambda _: None))
        settings = Settings.from_env(info.settings)
        load_before = os.getloadavg()[0]
        spent = asyncio.run(measure(settings, args.workflow, args.orders, args.warmup))
        load_after = os.getloadavg()[0]
    finally:
        stack.stop()
    report = {
        "workflow": args.workflow,
        "orders": args.orders,
        "cpu": summary(spent),
        "load_1m": {"before": round(load_before, 2), "after": round(load_after, 2)},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
