"""The Agent's async sources: agent.handler and agent.remote_client are generated from them
(devstack.unasync)."""
