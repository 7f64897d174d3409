"""One Service Bus-triggered agent function per agent of the catalog (:mod:`domain.agents`).

Agents are on the hot path: ``async def``, awaited on the worker's event loop, each handing its
request to :mod:`service.agent`. Each request is handled in a span parented on the trace
context it carries (adapters.telemetry), and only if the app signed it for this agent's queue
(service.inbound). The Runtime is the composition root's (:mod:`service.composition`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import azure.functions as func

from adapters.telemetry import consuming
from domain.agents import AGENTS, Agent
from service import deadlines, inbound
from service.agent import handle_request
from service.composition import Root
from service.runtime import Runtime


async def on_request(msg: func.ServiceBusMessage, agent: Agent, rt: Runtime) -> None:
    """What the trigger does with one message, given the Runtime."""
    with consuming(msg, agent.function_name, rt.settings.queue(agent.name)), deadlines.message():
        delivery = inbound.Delivery.of(msg)
        body = await inbound.trusted_body(rt, delivery, agent.name, f"agent-{agent.name}")
        if body is not None:
            await handle_request(body, agent.name, rt, caused_by=delivery.cause(agent.name))


def blueprint(root: Root) -> func.Blueprint:
    """One function per agent of the catalog."""
    bp = func.Blueprint()
    for agent in AGENTS:
        bp.function_name(name=agent.function_name)(
            bp.service_bus_queue_trigger(
                arg_name="msg",
                queue_name=f"%{agent.queue_setting}%",
                connection="ServiceBusConnection",
            )(_agent_function(agent, root))
        )
    return bp


def _agent_function(
    agent: Agent, root: Root
) -> Callable[[func.ServiceBusMessage], Coroutine[Any, Any, None]]:
    async def run(msg: func.ServiceBusMessage) -> None:
        await on_request(msg, agent, root.runtime())

    run.__name__ = run.__qualname__ = agent.function_name
    return run
