"""Table Storage on azure-core's async pipeline over aiohttp: see :mod:`adapters.tables.client`
(the Table client, with the surface of core.tablestorage.aio) and
:mod:`adapters.tables.pipeline` (what each request passes through)."""

from adapters.tables.client import Paged, Pages, Table, TableService
from adapters.tables.pipeline import Sent
from core.tablestorage.odata import Entity, Page

__all__ = ["Entity", "Page", "Paged", "Pages", "Sent", "Table", "TableService"]
