"""Supervisor: periodic recovery of expired, stale and failed orders, and operator alerts."""
