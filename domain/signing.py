"""Signatures on the app's internal messages: HMAC-SHA256 over the queue, MessageId and body.

Anyone who may send to an agent, reply or command queue could otherwise steer orders: a
request for an order that does not exist makes a real charge, a forged success reply marks a
step done that never happened. So the app signs every message it sends and its triggers on
those queues accept only messages signed with a key of the app (:mod:`service.inbound`).

What is signed, each part length-prefixed so no two inputs share an encoding: the destination
queue (case-folded: entity names are case-insensitive), so a request for one agent cannot be
replayed onto another's queue or the reply queue; the MessageId, which names the order, step,
operation and attempt (duplicate detection drops a replay within its window, and the lifecycle
ignores a reply for a step no longer in flight); and the body. The signature travels in the
application property ``signature`` as ``v1.<key id>.<base64url HMAC>``.

Keys rotate without downtime: ``MESSAGE_SIGNING_KEYS`` holds one or more ``<key id>:<base64
secret>`` separated by commas, newest first. Messages are signed with the first and accepted
under any. To rotate, put the new key first and keep the old one until the messages it signed
have drained (the longest a message may wait: retry delays and dead letters included), then
drop it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

SIGNATURE_PROPERTY: Final = "signature"
SIGNING_KEYS_SETTING: Final = "MESSAGE_SIGNING_KEYS"
MIN_SECRET_BYTES: Final = 32
_VERSION: Final = "v1"
_KEY_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,32}", re.ASCII)
_MAC: Final = re.compile(r"[A-Za-z0-9_-]{43}", re.ASCII)  # 32 bytes, base64url, unpadded
_LOCAL_KEY_LABEL: Final = b"scheduler-agent-supervisor/message-signing/v1"


class KeyringError(ValueError):
    """MESSAGE_SIGNING_KEYS is malformed; the message says what is wrong and what to write."""


@dataclass(frozen=True)
class SigningKey:
    key_id: str
    secret: bytes = field(repr=False)


@dataclass(frozen=True)
class Keyring:
    """The keys a process signs with (the first) and accepts (any)."""

    keys: tuple[SigningKey, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise KeyringError("a keyring needs at least one key")
        ids = [key.key_id for key in self.keys]
        if len(set(ids)) != len(ids):
            raise KeyringError(f"key ids must be distinct, got {ids}")

    @property
    def signing_key(self) -> SigningKey:
        return self.keys[0]

    def get(self, key_id: str) -> SigningKey | None:
        return next((key for key in self.keys if key.key_id == key_id), None)


def parse_keyring(text: str, *, setting: str = SIGNING_KEYS_SETTING) -> Keyring:
    """``<key id>:<base64 secret>[,<key id>:<base64 secret>...]``, newest first."""
    example = f"{setting}=k2026a:<base64 of {MIN_SECRET_BYTES} random bytes>"
    entries = [entry.strip() for entry in text.split(",")]
    if not any(entries):
        raise KeyringError(f"{setting} is empty; set it like {example}")
    keys = []
    for position, entry in enumerate(entries, start=1):
        key_id, sep, encoded = entry.partition(":")
        key_id = key_id.strip()
        if not sep or not _KEY_ID.fullmatch(key_id):
            raise KeyringError(
                f"{setting} entry {position} must be <key id>:<base64 secret>, the key id 1-32 "
                f"letters, digits, '-' or '_' (e.g. {example}); the value is not shown"
            )
        try:
            secret = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise KeyringError(
                f"{setting} key {key_id!r}: the secret is not valid base64"
            ) from None
        if len(secret) < MIN_SECRET_BYTES:
            raise KeyringError(
                f"{setting} key {key_id!r}: the secret is {len(secret)} bytes; use at least "
                f"{MIN_SECRET_BYTES} random bytes (e.g. `openssl rand -base64 32`)"
            )
        keys.append(SigningKey(key_id, secret))
    try:
        return Keyring(tuple(keys))
    except KeyringError as exc:
        raise KeyringError(f"{setting}: {exc}") from None


def local_keyring(shared_access_key: str) -> Keyring:
    """The key of a local stack, derived from its broker's SAS key.

    Every process given that stack's connection string (hosts, orderctl, tests) agrees on it
    without another setting, and each stack's broker draws its own SAS key. Whoever holds the
    SAS key may send anything anyway, so deriving from it weakens nothing locally.
    """
    secret = hmac.new(shared_access_key.encode("utf-8"), _LOCAL_KEY_LABEL, hashlib.sha256)
    return Keyring((SigningKey("local", secret.digest()),))


def _canonical(queue: str, message_id: str, body: bytes) -> bytes:
    parts = (_VERSION.encode(), queue.casefold().encode("utf-8"), message_id.encode("utf-8"), body)
    return b"".join(len(part).to_bytes(8, "big") + part for part in parts)


def _mac(secret: bytes, queue: str, message_id: str, body: bytes) -> str:
    digest = hmac.new(secret, _canonical(queue, message_id, body), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def sign(keyring: Keyring, *, queue: str, message_id: str, body: bytes) -> str:
    """The ``signature`` property of a message for ``queue`` (signed with the newest key)."""
    key = keyring.signing_key
    return f"{_VERSION}.{key.key_id}.{_mac(key.secret, queue, message_id, body)}"


Problem = Literal["unsigned", "malformed_signature", "unknown_key", "bad_signature"]


@dataclass(frozen=True)
class Verified:
    key_id: str


@dataclass(frozen=True)
class Rejected:
    problem: Problem
    detail: str


def verify(
    keyring: Keyring, signature: object, *, queue: str, message_id: str, body: bytes
) -> Verified | Rejected:
    """Whether ``signature`` is this keyring's signature of the message; if not, why not."""
    if signature is None or signature == "" or signature == b"":
        return Rejected("unsigned", f"it carries no '{SIGNATURE_PROPERTY}' property")
    if isinstance(signature, bytes):
        signature = signature.decode("ascii", errors="replace")
    if not isinstance(signature, str):
        return Rejected(
            "malformed_signature",
            f"its '{SIGNATURE_PROPERTY}' property is a {type(signature).__name__}, not text",
        )
    version, _, rest = signature.partition(".")
    key_id, _, mac = rest.partition(".")
    if version != _VERSION or not _KEY_ID.fullmatch(key_id) or not _MAC.fullmatch(mac):
        return Rejected(
            "malformed_signature",
            f"its signature is not of the form {_VERSION}.<key id>.<mac> ({signature[:24]!r}...)",
        )
    key = keyring.get(key_id)
    if key is None:
        known = ", ".join(k.key_id for k in keyring.keys)
        return Rejected(
            "unknown_key",
            f"it is signed with key {key_id!r}, which is not configured (known: {known}); "
            "a retired key, or a sender without the app's key",
        )
    if not hmac.compare_digest(mac, _mac(key.secret, queue, message_id, body)):
        return Rejected(
            "bad_signature",
            f"its signature (key {key_id!r}) does not match its queue, MessageId and body: "
            "altered, replayed onto another queue, or signed with another secret",
        )
    return Verified(key_id)


def signature_of(properties: Mapping[object, object] | None) -> object:
    """The ``signature`` application property, whether the SDK hands keys as str or bytes."""
    if not properties:
        return None
    value = properties.get(SIGNATURE_PROPERTY)
    if value is None:
        value = properties.get(SIGNATURE_PROPERTY.encode("ascii"))
    return value
