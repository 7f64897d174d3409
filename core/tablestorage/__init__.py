"""Table Storage over plain HTTP: see :mod:`core.tablestorage.client`."""

from core.tablestorage.client import Paged, Pages, Sent, Table, TableService
from core.tablestorage.odata import Entity, Page

__all__ = ["Entity", "Page", "Paged", "Pages", "Sent", "Table", "TableService"]
