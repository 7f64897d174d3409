"""SAS token checks for `$cbs` put-token: tokens signed the way the azure-servicebus SDK signs
them are accepted; everything else is refused with TokenRejected and a clear reason."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from urllib.parse import quote_plus, urlencode

import pytest
from azure.servicebus._base_handler import ServiceBusSharedKeyCredential
from azure.servicebus._pyamqp.utils import generate_sas_token

from devstack.servicebus.auth import SharedAccessPolicy, TokenRejected, entity_path

KEY_NAME = "RootManageSharedAccessKey"
KEY = "c2VjcmV0LWtleS1mb3ItdGVzdHMtb25seS0xMjM0NTY3OA=="
HOST = "sb://localhost:5672"
NOW = 1_700_000_000.0

POLICY = SharedAccessPolicy(KEY_NAME, KEY)


def sdk_token(audience: str, *, key_name: str = KEY_NAME, key: str = KEY) -> str:
    """A token from the SDK's own credential, exactly as a ServiceBusClient would put it."""
    return ServiceBusSharedKeyCredential(key_name, key).get_token(audience).token


def signed_token(audience: str, expiry: int, *, key: str = KEY, key_name: str = KEY_NAME) -> str:
    return generate_sas_token(audience, key_name, key, expiry)


def test_entity_path() -> None:
    assert entity_path("amqps://host:5671/Orders/$management") == "orders/$management"
    assert entity_path("sb://host/Orders") == "orders"
    assert entity_path("sb://host") == ""
    assert entity_path("sb://host/") == ""
    assert entity_path("/Orders/") == "orders"
    assert entity_path("$cbs") == "$cbs"


def test_sdk_token_for_the_entity_is_accepted() -> None:
    audience = f"{HOST}/orders"
    assert POLICY.authorize(sdk_token(audience), audience) == "orders"


def test_sdk_token_is_accepted_for_the_entity_management_node() -> None:
    token = sdk_token(f"{HOST}/orders")
    assert POLICY.authorize(token, f"{HOST}/orders/$management") == "orders/$management"
    assert POLICY.authorize(token, "amqps://localhost:5671/Orders") == "orders"


def test_entity_names_compare_case_insensitively() -> None:
    token = sdk_token(f"{HOST}/Orders")
    assert POLICY.authorize(token, f"{HOST}/orders") == "orders"


def test_namespace_wide_token_grants_every_entity() -> None:
    token = sdk_token(HOST)  # what ServiceBusClient puts for the namespace
    audiences = (f"{HOST}/orders", f"{HOST}/payments/$management", f"{HOST}/x/$deadletterqueue")
    for audience in audiences:
        assert POLICY.authorize(token, audience) == entity_path(audience)
    assert POLICY.authorize(sdk_token(f"{HOST}/"), f"{HOST}/orders") == "orders"


def test_rederived_signature_matches_what_the_broker_accepts() -> None:
    """The documented algorithm: HMAC-SHA256(key, quote_plus(uri) + '\\n' + expiry), base64."""
    uri = f"{HOST}/orders"
    expiry = int(NOW) + 60
    string_to_sign = f"{quote_plus(uri)}\n{expiry}".encode()
    signature = base64.b64encode(
        hmac.new(KEY.encode(), string_to_sign, hashlib.sha256).digest()
    ).decode()
    token = "SharedAccessSignature " + urlencode(
        {"sr": uri, "sig": signature, "se": expiry, "skn": KEY_NAME}
    )
    assert POLICY.authorize(token, uri, now=NOW) == "orders"


def test_fields_may_come_in_any_order() -> None:
    uri = f"{HOST}/orders"
    parts = sdk_token(uri).removeprefix("SharedAccessSignature ").split("&")
    fields = dict(part.split("=", 1) for part in parts)
    shuffled = "&".join(f"{k}={fields[k]}" for k in ("skn", "se", "sig", "sr"))
    assert POLICY.authorize("SharedAccessSignature " + shuffled, uri) == "orders"


def test_wrong_key_is_rejected() -> None:
    audience = f"{HOST}/orders"
    other_key = base64.b64encode(b"another key entirely").decode()
    with pytest.raises(TokenRejected, match="InvalidSignature: the token has an invalid signature"):
        POLICY.authorize(sdk_token(audience, key=other_key), audience)


def test_wrong_key_name_is_rejected_naming_both() -> None:
    audience = f"{HOST}/orders"
    with pytest.raises(TokenRejected) as caught:
        POLICY.authorize(sdk_token(audience, key_name="SendOnly"), audience)
    message = str(caught.value)
    assert "InvalidSignature" in message and "'SendOnly'" in message and repr(KEY_NAME) in message


def test_expired_token_is_rejected() -> None:
    audience = f"{HOST}/orders"
    token = signed_token(audience, int(NOW) - 1)
    with pytest.raises(TokenRejected, match="ExpiredToken: the token has expired"):
        POLICY.authorize(token, audience, now=NOW)
    assert POLICY.authorize(token, audience, now=NOW - 1) == "orders", "valid up to its expiry"


def test_expiry_defaults_to_the_wall_clock() -> None:
    audience = f"{HOST}/orders"
    with pytest.raises(TokenRejected, match="ExpiredToken"):
        POLICY.authorize(signed_token(audience, int(time.time()) - 10), audience)
    assert POLICY.authorize(signed_token(audience, int(time.time()) + 600), audience) == "orders"


def test_tampered_expiry_is_rejected_as_a_bad_signature() -> None:
    audience = f"{HOST}/orders"
    token = signed_token(audience, int(NOW) + 60)
    tampered = token.replace(f"se={int(NOW) + 60}", f"se={int(NOW) + 999_999}")
    assert tampered != token
    with pytest.raises(TokenRejected, match="invalid signature"):
        POLICY.authorize(tampered, audience, now=NOW)


def test_token_for_another_entity_is_rejected() -> None:
    token = sdk_token(f"{HOST}/orders")
    with pytest.raises(TokenRejected) as caught:
        POLICY.authorize(token, f"{HOST}/payments")
    message = str(caught.value)
    assert "'orders'" in message and "'payments'" in message and "does not grant" in message


def test_token_for_an_entity_does_not_grant_a_longer_name_with_the_same_prefix() -> None:
    with pytest.raises(TokenRejected, match="does not grant"):
        POLICY.authorize(sdk_token(f"{HOST}/orders"), f"{HOST}/orders-archive")


@pytest.mark.parametrize(
    ("token", "why"),
    [
        (None, "not a SharedAccessSignature"),
        (b"SharedAccessSignature sr=x", "not a SharedAccessSignature"),
        ("", "not a SharedAccessSignature"),
        ("Bearer abc.def.ghi", "not a SharedAccessSignature"),
        ("SharedAccessSignature ", "lacks se, sig, skn, sr"),
        ("SharedAccessSignature sr=a&sig=b&se=1", "lacks skn"),
        ("SharedAccessSignature sr=a&sig=b&skn=" + KEY_NAME, "lacks se"),
        (f"SharedAccessSignature sr=a&sig=b&se=soon&skn={KEY_NAME}", "'se' is not an integer"),
        (f"SharedAccessSignature sr=a&sig=not-base64&se=1&skn={KEY_NAME}", "invalid signature"),
    ],
)
def test_malformed_tokens_are_rejected_with_the_reason(token: object, why: str) -> None:
    with pytest.raises(TokenRejected, match=why):
        POLICY.authorize(token, f"{HOST}/a", now=NOW)  # type: ignore[arg-type]


@pytest.mark.parametrize("sig", ["%C3%A9", "%FF", "\u00e9t\u00e9"])
def test_non_ascii_signature_is_rejected_not_crashed(sig: str) -> None:
    """hmac.compare_digest raises TypeError for non-ASCII str; a hostile token must still get a
    TokenRejected (the broker only turns TokenRejected into a 401 reply)."""
    token = f"SharedAccessSignature sr=a&sig={sig}&se={int(NOW) + 60}&skn={KEY_NAME}"
    with pytest.raises(TokenRejected, match="invalid signature"):
        POLICY.authorize(token, f"{HOST}/a", now=NOW)
