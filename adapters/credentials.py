"""The token credential every client authenticates with in Azure (adapters.clients: Table, Service
Bus, Blob): ``azure.identity.aio``'s, the app's user-assigned managed identity when the
connection names its client id, else ``DefaultAzureCredential``. Its tokens are fetched on the
event loop, over aiohttp, never by a sync call on it."""

from __future__ import annotations

from azure.core.credentials_async import AsyncTokenCredential
from azure.identity.aio import DefaultAzureCredential, ManagedIdentityCredential

from adapters.settings import Connection


def credential(conn: Connection) -> AsyncTokenCredential:
    """``conn``'s credential (a connection of an endpoint, not a connection string)."""
    if conn.client_id:
        return ManagedIdentityCredential(client_id=conn.client_id)
    return DefaultAzureCredential()
