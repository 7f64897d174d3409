"""Message signatures (domain.signing) and the door of the internal queues (service.inbound),
pure."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain import signing
from domain.messages import AgentResponse, encode, message_id_for
from domain.signing import Keyring, Rejected, SigningKey, Verified, sign, verify
from service import inbound
from tests.support.keys import new_key_text

KEY_A = SigningKey("a", b"\x01" * 32)
KEY_B = SigningKey("b", b"\x02" * 32)
RING = Keyring((KEY_A,))

queues = st.from_regex(r"[a-z][a-z0-9-]{0,40}", fullmatch=True)
message_ids = st.text(min_size=1, max_size=128)
bodies = st.binary(max_size=2048)


@given(queue=queues, message_id=message_ids, body=bodies)
def test_a_signed_message_verifies(queue, message_id, body):
    signature = sign(RING, queue=queue, message_id=message_id, body=body)
    assert verify(RING, signature, queue=queue, message_id=message_id, body=body) == Verified("a")


@given(queue=queues, message_id=message_ids, body=bodies)
def test_queue_names_are_compared_case_insensitively(queue, message_id, body):
    signature = sign(RING, queue=queue.upper(), message_id=message_id, body=body)
    assert isinstance(
        verify(RING, signature, queue=queue, message_id=message_id, body=body), Verified
    )


@given(
    queue=queues,
    message_id=message_ids,
    body=bodies,
    other_queue=queues,
    other_id=message_ids,
    other_body=bodies,
)
def test_any_change_to_what_is_signed_is_detected(
    queue, message_id, body, other_queue, other_id, other_body
):
    signature = sign(RING, queue=queue, message_id=message_id, body=body)
    changed = (other_queue.casefold(), other_id, other_body) != (queue.casefold(), message_id, body)
    verdict = verify(RING, signature, queue=other_queue, message_id=other_id, body=other_body)
    assert isinstance(verdict, Rejected) == changed
    if changed:
        assert verdict.problem == "bad_signature"


@given(body=bodies, flip=st.integers(min_value=0))
def test_a_tampered_mac_is_a_bad_signature(body, flip):
    signature = sign(RING, queue="q", message_id="m", body=body)
    prefix, mac = signature.rsplit(".", 1)
    raw = bytearray(base64.urlsafe_b64decode(mac + "="))
    raw[flip % len(raw)] ^= 0x01
    forged = f"{prefix}.{base64.urlsafe_b64encode(bytes(raw)).rstrip(b'=').decode()}"
    verdict = verify(RING, forged, queue="q", message_id="m", body=body)
    assert verdict == Rejected("bad_signature", verdict.detail)  # type: ignore[union-attr]


@given(junk=st.one_of(st.none(), st.text(max_size=80), st.binary(max_size=80), st.integers()))
def test_anything_that_is_not_a_signature_is_rejected_not_raised(junk):
    verdict = verify(RING, junk, queue="q", message_id="m", body=b"{}")
    assert isinstance(verdict, Rejected)
    assert verdict.problem in ("unsigned", "malformed_signature", "unknown_key")


def test_the_same_secret_under_another_key_id_does_not_verify():
    impostor = Keyring((SigningKey("b", KEY_A.secret),))
    signature = sign(impostor, queue="q", message_id="m", body=b"x")
    both = Keyring((KEY_A, SigningKey("b", b"\x03" * 32)))
    assert verify(both, signature, queue="q", message_id="m", body=b"x").problem == "bad_signature"  # type: ignore[union-attr]


@given(body=bodies)
def test_rotation_signs_with_the_newest_and_accepts_both(body):
    old, rotating, new = Keyring((KEY_A,)), Keyring((KEY_B, KEY_A)), Keyring((KEY_B,))
    by_old = sign(old, queue="q", message_id="m", body=body)
    by_rotating = sign(rotating, queue="q", message_id="m", body=body)
    assert by_rotating.startswith("v1.b.")
    # During the rotation, messages of either generation are accepted by every instance.
    for ring in (rotating,):
        assert verify(ring, by_old, queue="q", message_id="m", body=body) == Verified("a")
        assert verify(ring, by_rotating, queue="q", message_id="m", body=body) == Verified("b")
    # An instance still on the old key accepts the new signatures only once it knows the key.
    assert verify(old, by_rotating, queue="q", message_id="m", body=body).problem == "unknown_key"  # type: ignore[union-attr]
    # After the old key is retired, what it signed is refused by name.
    verdict = verify(new, by_old, queue="q", message_id="m", body=body)
    assert isinstance(verdict, Rejected) and verdict.problem == "unknown_key"
    assert "'a'" in verdict.detail and "known: b" in verdict.detail


@given(
    ids=st.lists(
        st.from_regex(r"[A-Za-z0-9_-]{1,32}", fullmatch=True), min_size=1, max_size=4, unique=True
    )
)
def test_keyring_text_round_trips(ids):
    text = ",".join(new_key_text(key_id) for key_id in ids)
    ring = signing.parse_keyring(text)
    assert [key.key_id for key in ring.keys] == ids
    assert ring.signing_key.key_id == ids[0]


def test_a_secret_never_shows_in_repr():
    assert "\\x01" not in repr(KEY_A) and "\\x01" not in repr(RING)


def test_properties_may_come_as_bytes_keys():
    assert signing.signature_of({b"signature": "v1.a.x"}) == "v1.a.x"
    assert signing.signature_of({"signature": "v1.a.x"}) == "v1.a.x"
    assert signing.signature_of(None) is None


# -------------------------------------------------------------------------- service.inbound


def reply() -> AgentResponse:
    return AgentResponse(
        order_id="o-1",
        step="charge_payment",
        operation="do",
        attempt=1,
        idempotency_key="o-1:charge_payment:do:1",
        outcome="succeeded",
    )


def delivery_of(message: AgentResponse, queue: str, ring: Keyring | None) -> inbound.Delivery:
    body, message_id = encode(message), message_id_for(message)
    properties = (
        {}
        if ring is None
        else {"signature": sign(ring, queue=queue, message_id=message_id, body=body)}
    )
    return inbound.Delivery(body=body, message_id=message_id, properties=properties)


def test_the_door_lets_the_apps_own_message_through():
    assert (
        inbound.check(RING, "agent-responses", delivery_of(reply(), "agent-responses", RING))
        is None
    )


@pytest.mark.parametrize(
    ("ring", "queue_signed_for", "problem"),
    [
        (None, "agent-responses", "unsigned"),
        (Keyring((KEY_B,)), "agent-responses", "unknown_key"),
        (Keyring((SigningKey("a", b"\x09" * 32),)), "agent-responses", "bad_signature"),
        (RING, "payment-requests", "bad_signature"),
    ],
)
def test_the_door_refuses_with_an_alert_naming_queue_message_and_problem(
    ring, queue_signed_for, problem
):
    delivery = delivery_of(reply(), queue_signed_for, ring)
    rejected = inbound.check(RING, "agent-responses", delivery)
    assert rejected is not None and rejected.problem == problem
    alert = inbound.untrusted_alert("responses", "agent-responses", delivery, rejected, "replies:x")
    assert alert.reason == "untrusted_message" and alert.severity == "critical"
    assert alert.order_id is None  # the order id is only the sender's claim
    assert "agent-responses" in alert.detail
    assert delivery.message_id in alert.detail
    assert f"({problem})" in alert.detail
    assert "'AgentResponse' for order 'o-1'" in alert.detail


def test_an_empty_body_is_refused_and_said_to_be_empty():
    delivery = inbound.Delivery(body=b"", message_id="m-1", properties={})
    rejected = inbound.check(RING, "inventory-requests", delivery)
    assert rejected is not None and rejected.problem == "unsigned"
    alert = inbound.untrusted_alert(
        "inventory", "inventory-requests", delivery, rejected, "agent-inventory:x"
    )
    assert "body is empty" in alert.detail


def test_a_delivery_names_itself_by_queue_role_and_message_id():
    def delivery(message_id: str, sequence_number: int | None = 7) -> inbound.Delivery:
        return inbound.Delivery(
            body=b"", message_id=message_id, properties={}, sequence_number=sequence_number
        )

    assert delivery("m-1").cause("payment") == "payment/m-1"
    assert delivery("m-1").cause("inventory") != delivery("m-1").cause("payment")
    assert delivery("").cause("orders") == "orders#7", "no MessageId: the broker's number"
    long = delivery("x" * 300).cause("orders")
    assert long.startswith("orders/sha256:") and len(long) < 64
    assert long == delivery("x" * 300, sequence_number=8).cause("orders")
    alert = inbound.untrusted_alert(
        "payment", "payment-requests", delivery("m-9"), Rejected("unsigned", "none"), "a:x"
    )
    assert alert.caused_by == "payment/m-9"
