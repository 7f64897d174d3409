"""Table Storage over plain HTTP: see :mod:`core.tablestorage.client`."""

from core.tablestorage.client import Sent, Table, TableService
from core.tablestorage.odata import Entity

__all__ = ["Entity", "Sent", "Table", "TableService"]
