"""Fake remote services with fault profiles and an effects ledger (local use only)."""
