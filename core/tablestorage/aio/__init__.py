"""The asyncio Table Storage client: :mod:`core.tablestorage.aio.client`, the source that
``python -m devstack.unasync`` turns into :mod:`core.tablestorage.client`. The same names as
:mod:`core.tablestorage`; the pure ones (``Entity``, ``Page``, ``Sent``) are the same objects."""

from core.tablestorage.aio.client import Paged, Pages, Sent, Table, TableService
from core.tablestorage.odata import Entity, Page

__all__ = ["Entity", "Page", "Paged", "Pages", "Sent", "Table", "TableService"]
