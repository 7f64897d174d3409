"""What the three fake services do: their operations, refusals and results."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Decline:
    status: int
    code: str
    message: str


@dataclass(frozen=True)
class Operation:
    """A forward operation (``reverses`` None) or the undo of the forward one it names.

    Forward operations may be declined; undos never are. An undo carries ``"undoes": <the
    forward call's Idempotency-Key>`` in its body and reverses that call only if it took effect.
    """

    name: str
    result: Callable[[int, dict[str, Any]], dict[str, Any]]
    reverses: str | None = None

    @property
    def forward(self) -> bool:
        return self.reverses is None


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    decline: Decline
    operations: dict[str, Operation]


def _common(seq: int, payload: dict[str, Any], status: str) -> dict[str, Any]:
    return {"order_id": payload["order_id"], "status": status, "effect_seq": seq}


def _reserve(seq: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {"reservation_id": f"res-{seq:06d}", **_common(seq, payload, "reserved")}


def _release(seq: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {"release_id": f"rel-{seq:06d}", **_common(seq, payload, "released")}


def _charge(seq: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "charge_id": f"ch-{seq:06d}",
        "amount": payload.get("amount"),
        **_common(seq, payload, "captured"),
    }


def _refund(seq: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "refund_id": f"rf-{seq:06d}",
        "amount": payload.get("amount"),
        **_common(seq, payload, "refunded"),
    }


def _void(seq: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {"void_id": f"vd-{seq:06d}", **_common(seq, payload, "voided")}


def _verify(seq: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {"verification_id": f"ver-{seq:06d}", **_common(seq, payload, "verified")}


def _create(seq: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "shipment_id": f"shp-{seq:06d}",
        "tracking_number": f"TRK{seq:010d}",
        **_common(seq, payload, "created"),
    }


def _cancel(seq: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {"cancellation_id": f"cx-{seq:06d}", **_common(seq, payload, "cancelled")}


def _spec(name: str, decline: Decline, *operations: Operation) -> ServiceSpec:
    return ServiceSpec(name, decline, {op.name: op for op in operations})


SERVICES: dict[str, ServiceSpec] = {
    spec.name: spec
    for spec in (
        _spec(
            "inventory",
            Decline(409, "out_of_stock", "not enough stock to reserve the order's items"),
            Operation("reserve", _reserve),
            Operation("release", _release, reverses="reserve"),
        ),
        _spec(
            "payment",
            Decline(402, "card_declined", "the card issuer declined the charge"),
            Operation("charge", _charge),
            Operation("refund", _refund, reverses="charge"),
            Operation("void", _void, reverses="charge"),
        ),
        _spec(
            "shipping",
            Decline(422, "address_invalid", "the shipping address cannot be delivered to"),
            Operation("verify", _verify),
            Operation("create", _create),
            Operation("cancel", _cancel, reverses="create"),
        ),
    )
}


def quantity(payload: dict[str, Any]) -> int | None:
    """``qty``, or the sum of ``items[].qty``, when the payload carries one."""
    qty = payload.get("qty")
    if isinstance(qty, int) and not isinstance(qty, bool):
        return qty
    items = payload.get("items")
    if isinstance(items, list):
        counts: list[int] = []
        for item in items:
            count = item.get("qty") if isinstance(item, dict) else None
            if not isinstance(count, int) or isinstance(count, bool):
                return None
            counts.append(count)
        return sum(counts) if counts else None
    return None


def amount(payload: dict[str, Any]) -> float | None:
    value = payload.get("amount")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None
