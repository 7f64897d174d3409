"""Clients built from Settings: managed identity in Azure, connection strings locally.

Table Storage goes through core.tablestorage (the SDK's request preparation was most of an
order's CPU); Service Bus through its SDK. Every client reports its requests to
core.op_counts.COUNTS. Clients are created once per
process and reused (opening a Service Bus link costs about a second). The purge's blob
service is core.blobs'. Written once, async, in core/aio/clients.py (asyncio clients); the sync
core/clients.py is generated from it (``python -m devstack.unasync``).
"""

from __future__ import annotations

from typing import Any

from azure.servicebus.aio import ServiceBusClient

from core.blobs import blob_service
from core.credentials import credential
from core.op_counts import COUNTS
from core.settings import Connection
from core.tablestorage import TableService

__all__ = ["blob_service", "servicebus_client", "table_service"]


def table_service(conn: Connection) -> TableService:
    hook = COUNTS.request_hook("table")
    if conn.connection_string:
        return TableService.from_connection_string(conn.connection_string, request_hook=hook)
    assert conn.endpoint is not None
    return TableService.with_credential(conn.endpoint, conn.credential(), request_hook=hook)


def servicebus_client(conn: Connection, **options: Any) -> ServiceBusClient:
    """``options`` go to the client (e.g. ``retry_total`` for interactive or best-effort use)."""
    if conn.connection_string:
        return ServiceBusClient.from_connection_string(conn.connection_string, **options)
    assert conn.endpoint is not None
    return ServiceBusClient(conn.endpoint, credential=credential(conn), **options)
