"""Clients built from Settings: managed identity in Azure, connection strings locally.

Table Storage goes through adapters.tables (the app's own wire format on azure-core's pipeline:
the SDK's request preparation was most of an order's CPU); Service Bus through its SDK's asyncio
client. Blob Storage is the retention purge's alone: its client is the archive's
(:func:`adapters.archive.blob_service`), so the pattern app never imports the Blob SDK. In Azure
each authenticates with an ``azure.identity.aio`` credential (adapters.credentials). Every
client reports its requests to adapters.op_counts.COUNTS. Clients are created once per process
and reused (opening a Service Bus link costs about a second).
"""

from __future__ import annotations

from typing import Any

from azure.servicebus.aio import ServiceBusClient

from adapters.credentials import credential
from adapters.op_counts import COUNTS
from adapters.settings import Connection
from adapters.tables import TableService


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
