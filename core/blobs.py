"""The state storage account's blob service (the purge's archive), built from Settings.

Only the purge uses it, synchronously, so it has no asyncio twin: core.clients and its async
source core.clients both import it from here (``clients.blob_service`` keeps working).
"""

from __future__ import annotations

from azure.storage.blob import BlobServiceClient

from core.op_counts import COUNTS
from core.settings import Connection


def blob_service(conn: Connection) -> BlobServiceClient:
    """The state storage account's blob service (the purge's archive)."""
    hook = COUNTS.request_hook("blob")
    if conn.connection_string:
        return BlobServiceClient.from_connection_string(
            conn.connection_string, raw_request_hook=hook
        )
    if conn.blob_endpoint is None:
        raise ValueError(f"{conn.name} names no blob service endpoint (__blobServiceUri)")
    return BlobServiceClient(
        conn.blob_endpoint, credential=conn.credential(), raw_request_hook=hook
    )
