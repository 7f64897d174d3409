"""Agents: one per remote service, with retries, a circuit breaker and a deadline."""
