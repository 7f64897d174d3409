"""The submission the state store's tests keep to: three of SKU-1 at 5.00 EUR for customer c-1,
its status replies to ``status-replies``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from domain.messages import OrderSubmitted


def submission(order_id: str = "o-1", *, at: datetime, **overrides: Any) -> OrderSubmitted:
    """That submission of ``order_id``, made ``at``; ``overrides``: any other field's value."""
    fields: dict[str, Any] = {
        "order_id": order_id,
        "customer_id": "c-1",
        "items": [{"sku": "SKU-1", "quantity": 3, "unit_price_cents": 500}],
        "currency": "EUR",
        "reply_to": "status-replies",
        "submitted_at": at,
    }
    return OrderSubmitted(**(fields | overrides))
