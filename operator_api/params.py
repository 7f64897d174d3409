"""The operator API's parameters: its path parameters, and ``Query[Model]``, a listing's query
parameters, the fields of one of :mod:`service.operations.queries`. Each use case validates the
values itself."""

from __future__ import annotations

from typing import Annotated, TypeVar

import fastapi
from fastapi import Path
from pydantic import BaseModel, BeforeValidator

from adapters.settings import QUEUE_SETTINGS
from service.operations.queries import ORDER_ID_FORM, alert_sequence

OrderId = Annotated[str, Path(description="Order id", json_schema_extra={"pattern": ORDER_ID_FORM})]
SequenceNumber = Annotated[
    int,
    BeforeValidator(alert_sequence),
    Path(description="The alert's sequence number in the alerts queue",
         json_schema_extra={"minimum": 1}),
]  # fmt: skip
QueueRole = Annotated[
    str, Path(description="The queue's role", json_schema_extra={"enum": list(QUEUE_SETTINGS)})
]
Listing = TypeVar("Listing", bound=BaseModel)
Query = Annotated[Listing, fastapi.Query()]
