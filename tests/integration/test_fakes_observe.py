"""The chaos checkers of devstack.observe over the fakes' ledger: read over HTTP from a real
fake-services server (one snapshot, read with ``read_ledger``), and over hand-made ledgers for
the violations the fakes never commit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devstack.fakes.remote_services import FakeServices
from devstack.observe import (
    Ledger,
    duplicated_effects,
    effects_after_tombstone,
    effects_left_in_place,
    forward_effects,
    read_ledger,
    step_of,
    undo_without_do,
)

pytestmark = pytest.mark.anyio

STEPS = {"inventory": "reserve_inventory", "payment": "charge_payment"}
ACTIONS = {"inventory": ("reserve", "release"), "payment": ("charge", "refund")}


@pytest.fixture
def fakes() -> Iterator[FakeServices]:
    with FakeServices.start(seed=2) as running:
        yield running


def key(order: str, service: str, direction: str, generation: int = 1) -> str:
    return f"{order}:{STEPS[service]}:{direction}:{generation}"


def do(fakes: FakeServices, order: str, service: str) -> int:
    body = {"order_id": order, "amount": 7}
    return _post(fakes, service, ACTIONS[service][0], body, key(order, service, "do"))


def undo(fakes: FakeServices, order: str, service: str) -> int:
    body = {"order_id": order, "amount": 7, "undoes": key(order, service, "do")}
    return _post(fakes, service, ACTIONS[service][1], body, key(order, service, "undo"))


def _post(fakes: FakeServices, service: str, action: str, body: dict[str, Any], k: str) -> int:
    url = f"{fakes.url(service)}/{action}"
    return httpx.post(url, json=body, headers={"Idempotency-Key": k}, timeout=10).status_code


def entry(service: str, k: str, order: str, undoes: str | None = None) -> dict[str, Any]:
    return {"service": service, "idempotency_key": k, "order_id": order, "undoes": undoes}


async def test_a_compensated_order_and_a_processed_one(fakes: FakeServices) -> None:
    # "bad" charged and was compensated; "late" was undone before its charge landed, so the
    # charge is refused; "good" completed.
    assert do(fakes, "bad", "inventory") == 200
    assert do(fakes, "bad", "payment") == 200
    assert undo(fakes, "bad", "payment") == 200
    assert undo(fakes, "bad", "inventory") == 200
    assert do(fakes, "late", "inventory") == 200
    assert undo(fakes, "late", "payment") == 200  # nothing to undo: tombstoned
    assert do(fakes, "late", "payment") == 409  # refused
    assert undo(fakes, "late", "inventory") == 200
    assert do(fakes, "good", "inventory") == 200
    assert do(fakes, "good", "payment") == 200
    everyone = {"bad", "late", "good"}
    ledger = await read_ledger(fakes.base_url)

    assert duplicated_effects(ledger, everyone) == 0
    assert undo_without_do(ledger, everyone) == []
    assert effects_left_in_place(ledger, {"bad", "late"}) == []
    assert effects_after_tombstone(ledger, everyone) == []
    assert forward_effects(ledger, {"late", "good"}) == {
        ("late", "reserve_inventory", key("late", "inventory", "do")),
        ("good", "reserve_inventory", key("good", "inventory", "do")),
        ("good", "charge_payment", key("good", "payment", "do")),
    }
    # Had "good" ended in Error, both of its effects would be left in place.
    assert effects_left_in_place(ledger, {"good"}) == [
        ("inventory", "good", key("good", "inventory", "do")),
        ("payment", "good", key("good", "payment", "do")),
    ]


async def test_one_snapshot_serves_several_checks(fakes: FakeServices) -> None:
    do(fakes, "a", "payment")
    undo(fakes, "b", "payment")
    ledger = await read_ledger(fakes.base_url)
    assert [e["idempotency_key"] for e in ledger.entries] == [key("a", "payment", "do")]
    assert [t["idempotency_key"] for t in ledger.tombstones] == [key("b", "payment", "do")]
    do(fakes, "c", "payment")  # after the snapshot: not seen by checks given the snapshot
    assert forward_effects(ledger, {"a", "c"}) == {
        ("a", "charge_payment", key("a", "payment", "do"))
    }
    assert len(forward_effects(await read_ledger(fakes.base_url), {"a", "c"})) == 2


def test_duplicates_count_forward_and_undo_effects_separately() -> None:
    fwd, back = key("o", "payment", "do"), key("o", "payment", "undo")
    once = Ledger((entry("payment", fwd, "o"), entry("payment", back, "o", undoes=fwd)), ())
    assert duplicated_effects(once, {"o"}) == 0  # a forward and its undo share no key
    twice = Ledger(
        (
            entry("payment", fwd, "o"),
            entry("payment", fwd, "o"),
            entry("payment", back, "o", undoes=fwd),
            entry("payment", back, "o", undoes=fwd),
            entry("payment", "other-undo", "o", undoes=fwd),  # a second undo of one forward
            entry("inventory", fwd, "o"),  # same key at another service: not a duplicate
        ),
        (),
    )
    assert duplicated_effects(twice, {"o"}) == 1 + 2
    assert duplicated_effects(twice, {"someone-else"}) == 0


def test_violations_the_fakes_never_commit_are_found() -> None:
    charge, refund = key("o", "payment", "do"), key("o", "payment", "undo")
    reserve = key("o", "inventory", "do")
    ledger = Ledger(
        (
            entry("payment", refund, "o", undoes=charge),  # a refund of a charge never made
            entry("inventory", reserve, "o"),  # a reservation nobody released
            entry("payment", key("p", "payment", "do"), "p"),  # landed although tombstoned
        ),
        ({"service": "payment", "idempotency_key": key("p", "payment", "do")},),
    )
    assert undo_without_do(ledger, {"o", "p"}) == [("payment", charge)]
    assert undo_without_do(ledger, {"p"}) == []
    assert effects_left_in_place(ledger, {"o"}) == [("inventory", "o", reserve)]
    assert effects_after_tombstone(ledger, {"o", "p"}) == [
        ("payment", "p", key("p", "payment", "do"))
    ]


def test_step_of_reads_the_key_or_falls_back_to_the_service() -> None:
    assert step_of(entry("payment", "o-1:charge_payment:do:2", "o-1")) == "charge_payment"
    assert step_of(entry("payment", "free-form-key", "o-1")) == "payment"
