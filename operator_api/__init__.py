"""Operator tools: one implementation (operations) behind the HTTP API and the CLI."""
