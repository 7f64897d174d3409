"""The agent catalog: the one list of agents, their request queues and their remote services.

Everything else derives from it: the app settings each agent needs (its queue name and its
service's base URL), the Service Bus-triggered function that runs it (agent/functions.py), the
workflows' validation of which agent a step names, and where the lifecycle sends a step's
request. Adding an agent: docs/adding-an-agent.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Agent:
    name: str
    """Also the queue role and the fake service's name: ``inventory``."""

    @property
    def queue_setting(self) -> str:
        """The app setting naming its request queue: ``INVENTORY_REQUESTS_QUEUE``."""
        return f"{self.name.upper()}_REQUESTS_QUEUE"

    @property
    def url_setting(self) -> str:
        """The app setting holding its remote service's base URL: ``INVENTORY_SERVICE_URL``."""
        return f"{self.name.upper()}_SERVICE_URL"

    @property
    def function_name(self) -> str:
        return f"{self.name}_agent"


AGENTS: Final = (Agent("inventory"), Agent("payment"), Agent("shipping"))
AGENT_NAMES: Final = tuple(agent.name for agent in AGENTS)
