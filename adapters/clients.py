"""Clients built from Settings: managed identity in Azure, connection strings locally.

Table Storage goes through adapters.tables (the app's own wire format on azure-core's pipeline:
the SDK's request preparation was most of an order's CPU); Service Bus and Blob Storage through
their SDKs' asyncio clients. In Azure each authenticates with an ``azure.identity.aio``
credential (adapters.credentials). Every client reports its requests to adapters.op_counts.COUNTS.
Clients are created once per process and reused (opening a Service Bus link costs about a
second). The Blob SDK is imported when a blob client is first made, not with the app: only the
retention purge uses Blob Storage, and importing the SDK is about a quarter of the pattern app's
cold start (docs/architecture.md, Two apps).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from azure.servicebus.aio import ServiceBusClient

from adapters.credentials import credential
from adapters.op_counts import COUNTS
from adapters.settings import Connection
from adapters.tables import TableService

if TYPE_CHECKING:
    from azure.storage.blob.aio import BlobServiceClient


def table_service(conn: Connection) -> TableService:
    hook = COUNTS.request_hook("table")
    if conn.connection_string:
        return TableService.from_connection_string(conn.connection_string, request_hook=hook)
    assert conn.endpoint is not None
    return TableService(conn.endpoint, credential(conn), request_hook=hook)


def servicebus_client(conn: Connection, **options: Any) -> ServiceBusClient:
    """``options`` go to the client (e.g. ``retry_total`` for interactive or best-effort use)."""
    if conn.connection_string:
        return ServiceBusClient.from_connection_string(conn.connection_string, **options)
    assert conn.endpoint is not None
    return ServiceBusClient(conn.endpoint, credential=credential(conn), **options)


def blob_service(conn: Connection) -> BlobServiceClient:
    """The state storage account's blob service (the purge's archive)."""
    from azure.storage.blob.aio import BlobServiceClient

    hook = COUNTS.request_hook("blob")
    if conn.connection_string:
        return BlobServiceClient.from_connection_string(
            conn.connection_string, raw_request_hook=hook
        )
    if conn.blob_endpoint is None:
        raise ValueError(f"{conn.name} names no blob service endpoint (__blobServiceUri)")
    return BlobServiceClient(conn.blob_endpoint, credential=credential(conn), raw_request_hook=hook)
