"""Table Storage on azure-core's async pipeline over aiohttp: see :mod:`adapters.tables.client`
(the Table client: the part of azure-data-tables' ``TableClient`` the app uses),
:mod:`adapters.tables.pipeline` (what each request passes through; which failed writes may
have been applied, :class:`OutcomeUnknown`; the invocation's deadline), and the wire format the
client writes and reads itself (:mod:`~adapters.tables.odata`, :mod:`~adapters.tables.batch`,
:mod:`~adapters.tables.auth`)."""

from adapters.tables.client import Paged, Pages, Table, TableService
from adapters.tables.odata import Entity, Page
from adapters.tables.pipeline import OutcomeUnknown, Sent, may_have_applied

__all__ = [
    "Entity",
    "OutcomeUnknown",
    "Page",
    "Paged",
    "Pages",
    "Sent",
    "Table",
    "TableService",
    "may_have_applied",
]
