"""Entities as the Table service's OData JSON, typed exactly as azure-data-tables types them.

Writing: strings, booleans and 32-bit integers go as plain JSON; every other type carries its
``@odata.type`` (a wider integer is ``Edm.Int64``, as :class:`EntityProperty` is). Reading
(``odata=minimalmetadata``): ``Edm.Int64`` comes back as an :class:`EntityProperty`, dates as
aware UTC datetimes, ``odata.etag`` and ``Timestamp`` go to the entity's ``metadata``, as the
SDK returns them, so rows written by either read the same through both.
"""

from __future__ import annotations

import base64
import math
import re
import uuid
from binascii import hexlify
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Final
from urllib.parse import quote

from azure.data.tables import EdmType, EntityProperty

_INT32: Final = range(-(2**31), 2**31)
_PARAMETER = re.compile(r"@([A-Za-z_][A-Za-z0-9_]*)")


class Entity(dict[str, Any]):
    """A row: its properties, and ``metadata`` (``etag``, ``timestamp``) as the SDK keeps it."""

    def __init__(self, *args: Any, metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.metadata: dict[str, Any] = metadata or {}


class Page(list[Entity]):
    """One page of a query's rows (the client's ``by_page``): a list, which
    async code may also walk with ``async for``, as it walks azure-core's async pages."""

    async def __aiter__(self) -> AsyncIterator[Entity]:
        for row in self:  # nothing to wait for: the rows have arrived
            yield row


def format_datetime(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_datetime(text: str) -> datetime:
    """The service writes up to seven fractional digits; Python keeps six."""
    return datetime.fromisoformat(text).astimezone(UTC)


def encode(entity: Mapping[str, Any]) -> dict[str, Any]:
    """``entity`` as the JSON body of an insert, update or batch operation."""
    out: dict[str, Any] = {}
    for name, value in entity.items():
        if value is None:
            continue
        edm, text = _typed(value)
        out[name] = text
        if edm is not None:
            out[f"{name}@odata.type"] = edm
    return out


def _typed(value: Any) -> tuple[str | None, Any]:
    if isinstance(value, EntityProperty):
        edm = _edm_name(value.edm_type)
        if edm == EdmType.INT64.value:
            return edm, str(int(value.value))
        inner, text = _typed(value.value)
        return edm or inner, text
    if isinstance(value, bool | str):
        return None, value
    if isinstance(value, int):
        return (None, value) if value in _INT32 else (EdmType.INT64.value, str(value))
    if isinstance(value, float):
        if math.isnan(value):
            return EdmType.DOUBLE.value, "NaN"
        if math.isinf(value):
            return EdmType.DOUBLE.value, "Infinity" if value > 0 else "-Infinity"
        return EdmType.DOUBLE.value, value
    if isinstance(value, datetime):
        return EdmType.DATETIME.value, format_datetime(value)
    if isinstance(value, uuid.UUID):
        return EdmType.GUID.value, str(value)
    if isinstance(value, bytes):
        return EdmType.BINARY.value, base64.b64encode(value).decode()
    if isinstance(value, Enum):
        return _typed(value.value)
    raise TypeError(f"a Table property cannot hold a {type(value).__name__}")


def _edm_name(edm: Any) -> str | None:
    return None if edm is None else str(getattr(edm, "value", edm))


def decode(row: Mapping[str, Any]) -> Entity:
    """A row of a minimal-metadata answer as an :class:`Entity`."""
    types = {name[: -len("@odata.type")]: t for name, t in row.items() if "@odata.type" in name}
    entity = Entity()
    for name, value in row.items():
        if name.startswith("odata.") or "@odata.type" in name:
            continue
        if name == "Timestamp":
            entity.metadata["timestamp"] = parse_datetime(value)
            continue
        decode_value = _DECODE.get(types.get(name))
        entity[name] = value if decode_value is None else decode_value(value)
    if "odata.etag" in row:
        entity.metadata["etag"] = row["odata.etag"]
    return entity


_DECODE: Final[dict[str | None, Callable[[Any], Any]]] = {
    EdmType.INT64.value: lambda value: EntityProperty(int(value), EdmType.INT64),
    EdmType.DATETIME.value: parse_datetime,
    EdmType.DOUBLE.value: float,
    EdmType.GUID.value: uuid.UUID,
    EdmType.BINARY.value: base64.b64decode,
}
"""How a typed property is read; one of another type (or none) is read as it came."""


def entity_path(table: str, partition_key: str, row_key: str) -> str:
    """``table(PartitionKey='…',RowKey='…')``, quotes doubled and the keys percent-encoded."""
    return f"{table}(PartitionKey='{_key(partition_key)}',RowKey='{_key(row_key)}')"


def _key(value: str) -> str:
    if not isinstance(value, str):
        raise TypeError("PartitionKey and RowKey must be strings")
    return quote(value.replace("'", "''"), safe="")


def substitute(query_filter: str, parameters: Mapping[str, Any] | None) -> str:
    """``query_filter`` with each ``@name`` replaced by its parameter as an OData literal: the
    value is never spliced in as text, so a value cannot change the filter's meaning."""
    if parameters is None:
        return query_filter

    def literal(match: re.Match[str]) -> str:
        name = match[1]
        if name not in parameters:
            raise KeyError(f"the filter names @{name}, which no parameter gives")
        return _literal(parameters[name])

    return _PARAMETER.sub(literal, query_filter)


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return str(value)
    if isinstance(value, int):
        return str(value) if value in _INT32 else f"{value}L"
    if isinstance(value, EntityProperty) and _edm_name(value.edm_type) == EdmType.INT64.value:
        return f"{int(value.value)}L"
    if isinstance(value, datetime):
        return f"datetime'{format_datetime(value)}'"
    if isinstance(value, uuid.UUID):
        return f"guid'{value}'"
    if isinstance(value, bytes):
        return f"X'{hexlify(value).decode()}'"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"a filter parameter cannot be a {type(value).__name__}")
