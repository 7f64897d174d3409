"""Shared code for all roles: message schemas, state store, settings and workflow definitions."""
