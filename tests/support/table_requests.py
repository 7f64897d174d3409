"""Which table and what kind of request each Table request is, as the request hook sees it.

:class:`RequestLog` stands in for adapters.op_counts.COUNTS in adapters.clients (monkeypatch
``clients.COUNTS``): every client built after that reports each Table request to it, named by
the table's role (``orders``, ``active``, ``supervision``) and its kind.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from adapters.tables import Sent

_ENTITY = re.compile(r"^(?P<table>[^()]+)\(PartitionKey='[^']*',RowKey='[^']*'\)$")
_TABLE = re.compile(r"^(?P<table>[^()]+)(\(\))?$")


@dataclass(frozen=True, order=True)
class TableRequest:
    table: str
    """The table's role: ``orders``, ``active``, ``supervision`` (or its name if none)."""
    kind: str
    """point_read, query, insert, batch, update, delete, or ``other`` (table management)."""


def classify(method: str, url: str, batch_urls: list[str]) -> tuple[str, str]:
    """(table name, kind) of one Table request. A GET is a point read only when it names both
    keys and has no ``$filter``; any other GET is a query. A batch is named by the table of
    its first operation (a transaction holds one partition of one table)."""
    parts = urlsplit(url)
    segment = unquote(parts.path.rsplit("/", 1)[-1])
    if method == "POST" and segment == "$batch":
        inner = urlsplit(batch_urls[0]).path.rsplit("/", 1)[-1] if batch_urls else ""
        return _table_of(unquote(inner)), "batch"
    table = _table_of(segment)
    entity = _ENTITY.match(segment) is not None
    if method == "GET":
        point = entity and "$filter" not in unquote(parts.query)
        return table, "point_read" if point else "query"
    if segment == "Tables" or segment.startswith("Tables("):
        return segment, "other"
    if method == "POST":
        return table, "insert"
    if method in ("PUT", "PATCH", "MERGE"):
        return table, "update"
    if method == "DELETE":
        return table, "delete"
    return table, "other"


def _table_of(segment: str) -> str:
    match = _ENTITY.match(segment) or _TABLE.match(segment)
    return match["table"] if match else segment


class RequestLog:
    """Stands in for adapters.op_counts.COUNTS in adapters.clients: records each Table request."""

    def __init__(self, roles: dict[str, str]) -> None:
        self._roles = {name.lower(): role for name, role in roles.items()}
        self._seen: list[TableRequest] = []

    def request_hook(self, service: str) -> Callable[[Any], None]:
        if service != "table":
            return lambda _: None

        def hook(sent: Sent) -> None:
            table, kind = classify(sent.method, sent.url, list(sent.batch_urls))
            self._seen.append(TableRequest(self._roles.get(table.lower(), table), kind))

        return hook

    def take(self) -> Counter[TableRequest]:
        """The requests since the last take."""
        seen, self._seen = self._seen, []
        return Counter(seen)


def tally(requests: Counter[TableRequest]) -> dict[str, dict[str, int]]:
    """{table: {kind: n}}, readable in an assertion message."""
    out: dict[str, dict[str, int]] = {}
    for request, n in sorted(requests.items()):
        out.setdefault(request.table, {})[request.kind] = n
    return out


def queries(requests: Counter[TableRequest], table: str | None = None) -> int:
    return sum(
        n for r, n in requests.items() if r.kind == "query" and (table is None or r.table == table)
    )
