"""The undo contract of the fake services over real HTTP (docs/remote-service-contract.md).

An undo names the forward call it undoes (``"undoes"``). The service undoes that call if it
took effect; otherwise it answers ``nothing_to_undo`` and tombstones the forward key, which it
then refuses for ever (409 ``undone_before_applied``) -- so a forward call that lands late,
after its undo, leaves nothing in place.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devstack.fakes.remote_services import FakeServices

FWD = "order-1:reserve_inventory:do:1"
UNDO = "order-1:reserve_inventory:undo:1"
ORDER = {"order_id": "order-1", "items": [{"sku": "A", "qty": 2}]}
RELEASE = {**ORDER, "undoes": FWD}


@pytest.fixture
def fakes() -> Iterator[FakeServices]:
    with FakeServices.start(seed=5) as running:
        yield running


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as client:
        yield client


def post(
    http: httpx.Client, fakes: FakeServices, path: str, body: dict[str, Any], key: str
) -> httpx.Response:
    return http.post(f"{fakes.base_url}/{path}", json=body, headers={"Idempotency-Key": key})


def reserve(http: httpx.Client, fakes: FakeServices) -> httpx.Response:
    return post(http, fakes, "inventory/reserve", ORDER, FWD)


def release(http: httpx.Client, fakes: FakeServices) -> httpx.Response:
    return post(http, fakes, "inventory/release", RELEASE, UNDO)


def wait_for(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


# -- undo after the forward call took effect ---------------------------------------------------


def test_undo_after_success_undoes_it_once(fakes: FakeServices, http: httpx.Client) -> None:
    assert reserve(http, fakes).status_code == 200
    undone = release(http, fakes)
    assert undone.status_code == 200
    body = undone.json()
    assert body["status"] == "released" and body["undoes"] == FWD
    assert body["order_id"] == "order-1" and body["release_id"] == "rel-000002"
    forward, undo = fakes.ledger()
    assert (forward["operation"], forward["idempotency_key"], forward["undoes"]) == (
        "reserve",
        FWD,
        None,
    )
    assert (undo["operation"], undo["idempotency_key"], undo["undoes"]) == ("release", UNDO, FWD)
    assert undo["qty"] == 2
    assert fakes.tombstones() == []

    replay = release(http, fakes)
    assert replay.status_code == 200 and replay.json() == body
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert len(fakes.ledger()) == 2
    # The forward key still replays its success: undoing it does not rewrite its answer.
    again = reserve(http, fakes)
    assert again.status_code == 200 and again.json()["reservation_id"] == "res-000001"


def test_a_second_undo_key_for_the_same_forward_is_refused(
    fakes: FakeServices, http: httpx.Client
) -> None:
    reserve(http, fakes)
    release(http, fakes)
    other = post(http, fakes, "inventory/release", RELEASE, "order-1:reserve_inventory:undo:9")
    assert other.status_code == 409 and other.json()["error"]["code"] == "already_undone"
    assert UNDO in other.json()["error"]["message"]
    assert [e["operation"] for e in fakes.ledger()] == ["reserve", "release"]


def test_ledger_endpoint_exposes_undoes_and_tombstones(
    fakes: FakeServices, http: httpx.Client
) -> None:
    reserve(http, fakes)
    release(http, fakes)
    never = {"order_id": "order-2", "amount": 5, "undoes": "order-2:charge_payment:do:1"}
    post(http, fakes, "payment/refund", never, "order-2:charge_payment:undo:1")
    ledger = http.get(f"{fakes.base_url}/_ledger").json()
    assert ledger["count"] == 2
    assert [e["undoes"] for e in ledger["entries"]] == [None, FWD]
    [tombstone] = ledger["tombstones"]
    assert tombstone["service"] == "payment"
    assert tombstone["idempotency_key"] == "order-2:charge_payment:do:1"
    assert tombstone["undo_key"] == "order-2:charge_payment:undo:1"
    assert tombstone["order_id"] == "order-2" and tombstone["seq"] == 1 and tombstone["time"]
    listed = http.get(f"{fakes.base_url}/_tombstones").json()
    assert listed == {"count": 1, "entries": [tombstone]}


# -- undo before the forward call took effect --------------------------------------------------


def test_undo_before_the_forward_tombstones_it_and_the_forward_is_refused(
    fakes: FakeServices, http: httpx.Client
) -> None:
    first = release(http, fakes)
    assert first.status_code == 200
    assert first.json() == {"order_id": "order-1", "status": "nothing_to_undo", "undoes": FWD}
    assert [(t["service"], t["idempotency_key"]) for t in fakes.tombstones()] == [
        ("inventory", FWD)
    ]

    late = reserve(http, fakes)
    assert late.status_code == 409
    error = late.json()["error"]
    assert error["code"] == "undone_before_applied"
    assert "undone before it was applied; it will never take effect" in error["message"]
    replayed = reserve(http, fakes)  # the refusal is the key's stored answer
    assert replayed.status_code == 409 and replayed.json() == late.json()
    assert replayed.headers["Idempotent-Replayed"] == "true"

    again = release(http, fakes)
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert fakes.ledger() == []
    assert fakes.stats()["refused_after_undo"] == 1
    assert fakes.stats()["tombstones"] == 1


def test_tombstones_are_per_service(fakes: FakeServices, http: httpx.Client) -> None:
    release(http, fakes)
    assert post(http, fakes, "payment/charge", {"order_id": "order-1"}, FWD).status_code == 200
    assert reserve(http, fakes).status_code == 409


def test_undo_after_a_decline_leaves_the_decline_and_tombstones(
    fakes: FakeServices, http: httpx.Client
) -> None:
    fakes.set_profile({"services": {"inventory": {"decline_order_ids": ["order-1"]}}})
    assert reserve(http, fakes).status_code == 409
    undo = release(http, fakes)
    assert undo.status_code == 200 and undo.json()["status"] == "nothing_to_undo"
    declined = reserve(http, fakes)  # the stored answer wins: still the decline
    assert declined.json()["error"]["code"] == "out_of_stock"
    assert fakes.ledger() == [] and len(fakes.tombstones()) == 1


def test_undo_after_only_transient_failures_refuses_the_forward_for_ever(
    fakes: FakeServices, http: httpx.Client
) -> None:
    fakes.set_profile({"services": {"inventory": {"fail_first_n": 1}}})
    assert reserve(http, fakes).status_code == 503  # not applied, nothing stored
    undo = release(http, fakes)  # its own first request gets the 503 too
    assert undo.status_code == 503 and fakes.tombstones() == []
    undo = release(http, fakes)
    assert undo.status_code == 200 and undo.json()["status"] == "nothing_to_undo"
    retried = reserve(http, fakes)  # the retry that would have applied it
    assert retried.status_code == 409
    assert retried.json()["error"]["code"] == "undone_before_applied"
    assert fakes.ledger() == []


# -- undo racing the forward call --------------------------------------------------------------


def test_undo_during_a_hanging_forward_wins_and_the_late_forward_is_refused(
    fakes: FakeServices, http: httpx.Client
) -> None:
    # A hang far longer than an undo takes, even on a loaded machine.
    fakes.set_profile({"services": {"inventory": {"hang_rate": 1.0, "hang_seconds": 8.0}}})
    answers: list[httpx.Response] = []
    forward = threading.Thread(target=lambda: answers.append(reserve(http, fakes)))
    forward.start()
    wait_for(lambda: fakes.stats().get("fault.hang") == 1)  # the forward is hanging
    fakes.set_profile(None)  # the undo itself does not hang
    undo = release(http, fakes)
    assert answers == [], "the undo waited for the hanging forward"
    assert undo.status_code == 200 and undo.json()["status"] == "nothing_to_undo"
    forward.join(60)
    [late] = answers
    assert late.status_code == 409
    assert late.json()["error"]["code"] == "undone_before_applied"
    assert fakes.ledger() == []
    assert [t["idempotency_key"] for t in fakes.tombstones()] == [FWD]


def test_undo_waits_for_a_forward_being_settled_and_then_undoes_it(
    fakes: FakeServices, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The forward call holds its key's lock while it is applied (slowed to 300 ms here). An undo
    # that arrives meanwhile must wait for it and undo the effect: if it did not serialise with
    # the forward key, it would find nothing, tombstone the key, and leave the effect in place.
    apply_forward = fakes.engine._forward
    inside = threading.Event()

    def slow_forward(*args: Any, **kwargs: Any) -> Any:
        inside.set()
        time.sleep(0.3)
        return apply_forward(*args, **kwargs)

    monkeypatch.setattr(fakes.engine, "_forward", slow_forward)
    answers: list[httpx.Response] = []
    forward = threading.Thread(target=lambda: answers.append(reserve(http, fakes)))
    forward.start()
    assert inside.wait(30)
    undo = release(http, fakes)
    forward.join(30)
    assert answers[0].status_code == 200
    assert undo.status_code == 200 and undo.json()["status"] == "released"
    assert [(e["operation"], e["undoes"]) for e in fakes.ledger()] == [
        ("reserve", None),
        ("release", FWD),
    ]
    assert fakes.tombstones() == []


def test_concurrent_forwards_and_undos_never_leave_an_effect_in_place(
    fakes: FakeServices, http: httpx.Client
) -> None:
    """Many forward/undo pairs sent at the same moment: each ends undone, or never applied."""
    barrier = threading.Barrier(2)

    def send(path: str, body: dict[str, Any], key: str) -> None:
        barrier.wait(30)
        post(http, fakes, path, body, key)

    for n in range(20):
        order = f"order-{n}"
        fwd, undo = f"{order}:charge_payment:do:1", f"{order}:charge_payment:undo:1"
        charge = {"order_id": order, "amount": 3}
        threads = [
            threading.Thread(target=send, args=("payment/charge", charge, fwd)),
            threading.Thread(target=send, args=("payment/refund", {**charge, "undoes": fwd}, undo)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        barrier.reset()
    charged = {e["idempotency_key"] for e in fakes.ledger() if e["undoes"] is None}
    refunded = {e["undoes"] for e in fakes.ledger() if e["undoes"] is not None}
    tombstoned = {t["idempotency_key"] for t in fakes.tombstones()}
    assert charged == refunded
    assert charged.isdisjoint(tombstoned)
    assert len(charged) + len(tombstoned) == 20


# -- validation and faults ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (ORDER, 'add "undoes"'),
        ({**ORDER, "undoes": None}, "forward call's Idempotency-Key"),
        ({**ORDER, "undoes": 17}, "forward call's Idempotency-Key"),
        ({**ORDER, "undoes": "has space"}, "forward call's Idempotency-Key"),
        ({**ORDER, "undoes": ""}, "forward call's Idempotency-Key"),
        ({**ORDER, "undoes": UNDO}, "own Idempotency-Key"),
    ],
)
def test_an_undo_without_a_valid_undoes_is_400(
    fakes: FakeServices, http: httpx.Client, body: dict[str, Any], message: str
) -> None:
    answer = post(http, fakes, "inventory/release", body, UNDO)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_request"
    assert message in answer.json()["error"]["message"]
    assert fakes.ledger() == [] and fakes.tombstones() == []
    assert release(http, fakes).json()["status"] == "nothing_to_undo"  # nothing was stored


def test_a_forward_call_with_undoes_is_400(fakes: FakeServices, http: httpx.Client) -> None:
    answer = post(http, fakes, "inventory/reserve", {**ORDER, "undoes": "x"}, FWD)
    assert answer.status_code == 400 and "undo only" in answer.json()["error"]["message"]
    assert fakes.ledger() == []


def test_undoes_naming_an_undo_is_422(fakes: FakeServices, http: httpx.Client) -> None:
    release(http, fakes)
    answer = post(http, fakes, "inventory/release", {**ORDER, "undoes": UNDO}, "another-undo")
    assert answer.status_code == 422 and answer.json()["error"]["code"] == "undoes_mismatch"


def test_faults_hit_undos_but_declines_never_do(fakes: FakeServices, http: httpx.Client) -> None:
    fakes.set_profile({"default": {"transient_rate": 1.0}})
    assert release(http, fakes).status_code == 503
    assert fakes.tombstones() == []  # a transient failure settles nothing
    fakes.set_profile({"default": {"throttle_rate": 1.0, "retry_after_seconds": 2}})
    throttled = release(http, fakes)
    assert throttled.status_code == 429 and throttled.headers["Retry-After"] == "2"
    fakes.set_profile({"default": {"decline_rate": 1.0}})
    assert release(http, fakes).json()["status"] == "nothing_to_undo"


def test_crash_after_a_tombstone_then_the_replay_answers(
    fakes: FakeServices, http: httpx.Client
) -> None:
    fakes.set_profile({"default": {"crash_after_effect_rate": 1.0}})
    with pytest.raises(httpx.RemoteProtocolError):
        release(http, fakes)
    assert len(fakes.tombstones()) == 1  # recorded before the connection dropped
    replay = release(http, fakes)
    assert replay.status_code == 200 and replay.json()["status"] == "nothing_to_undo"


def test_crash_after_an_undo_effect_then_the_replay_answers(
    fakes: FakeServices, http: httpx.Client
) -> None:
    reserve(http, fakes)
    fakes.set_profile({"default": {"crash_after_effect_rate": 1.0}})
    with pytest.raises(httpx.RemoteProtocolError):
        release(http, fakes)
    replay = release(http, fakes)
    assert replay.status_code == 200 and replay.json()["status"] == "released"
    assert [e["operation"] for e in fakes.ledger()] == ["reserve", "release"]
