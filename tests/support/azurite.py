"""Storage for tests: the local Azurite (devstack.stack.azurite) or an external account."""

from __future__ import annotations

import os

from devstack.stack.azurite import AzuriteProcess, StorageAccount, from_connection_string

EXTERNAL_ENV_VAR = "AZURE_STORAGE_CONNECTION_STRING_TESTS"

__all__ = ["AzuriteProcess", "StorageAccount", "external_account"]


def external_account() -> StorageAccount | None:
    conn = os.environ.get(EXTERNAL_ENV_VAR, "").strip()
    return from_connection_string(conn) if conn else None
