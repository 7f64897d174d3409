"""The token credential the adapters authenticate with in Azure: ``azure.identity.aio``'s,
chosen as :meth:`core.settings.Connection.credential` chooses the sync one (the app's
user-assigned managed identity when the connection names its client id, else
``DefaultAzureCredential``). Its tokens are fetched on the event loop, over aiohttp, never by a
sync call on it (core.credentials.aio runs the sync credential on a thread instead, because
the app did not deploy aiohttp before)."""

from __future__ import annotations

from azure.core.credentials_async import AsyncTokenCredential
from azure.identity.aio import DefaultAzureCredential, ManagedIdentityCredential

from core.settings import Connection


def credential(conn: Connection) -> AsyncTokenCredential:
    if conn.client_id:
        return ManagedIdentityCredential(client_id=conn.client_id)
    return DefaultAzureCredential()
