"""Signing keys for tests: fresh random entries of ``MESSAGE_SIGNING_KEYS``."""

from __future__ import annotations

import base64
import secrets

from domain.signing import MIN_SECRET_BYTES


def new_key_text(key_id: str = "k1") -> str:
    """A fresh ``<key id>:<base64 secret>`` entry (random); :func:`domain.signing.parse_keyring`
    checks the key id."""
    return f"{key_id}:{base64.b64encode(secrets.token_bytes(MIN_SECRET_BYTES)).decode('ascii')}"
