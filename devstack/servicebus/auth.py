"""Shared Access Signature checks for the `$cbs` put-token exchange, as Service Bus does them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass
from urllib.parse import unquote_plus, urlparse


class TokenRejected(Exception):
    """The token is malformed, expired, signed with another key, or for another resource."""


@dataclass(frozen=True, slots=True)
class SharedAccessPolicy:
    key_name: str
    key: str

    def authorize(self, token: str, audience: str, now: float | None = None) -> str:
        """Check a `SharedAccessSignature sr=..&sig=..&se=..&skn=..` token for `audience`.

        Returns the entity path the token grants (lower case, '' for the whole namespace).
        """
        prefix = "SharedAccessSignature "
        if not isinstance(token, str) or not token.startswith(prefix):
            raise TokenRejected("the token is not a SharedAccessSignature")
        fields = {}
        for part in token[len(prefix) :].split("&"):
            name, _, value = part.partition("=")
            fields[name] = value
        missing = {"sr", "sig", "se", "skn"} - fields.keys()
        if missing:
            raise TokenRejected(f"the token lacks {', '.join(sorted(missing))}")
        if fields["skn"] != self.key_name:
            raise TokenRejected(
                f"InvalidSignature: the key name {fields['skn']!r} is not authorized "
                f"(this namespace has {self.key_name!r})"
            )
        try:
            expiry = int(fields["se"])
        except ValueError as exc:
            raise TokenRejected("the token expiry 'se' is not an integer") from exc
        signed = f"{fields['sr']}\n{fields['se']}".encode()
        expected = base64.b64encode(
            hmac.new(self.key.encode(), signed, hashlib.sha256).digest()
        ).decode()
        if not hmac.compare_digest(
            expected.encode(), unquote_plus(fields["sig"]).encode("utf-8", "surrogateescape")
        ):
            raise TokenRejected("InvalidSignature: the token has an invalid signature")
        if expiry < (now if now is not None else time.time()):
            raise TokenRejected("ExpiredToken: the token has expired")
        granted = entity_path(unquote_plus(fields["sr"]))
        wanted = entity_path(audience)
        if granted and wanted != granted and not wanted.startswith(granted + "/"):
            raise TokenRejected(f"the token for {granted!r} does not grant access to {wanted!r}")
        return wanted


def entity_path(address: str) -> str:
    """'amqps://host:port/Queue/$management' -> 'queue/$management'."""
    if "://" in address:
        address = urlparse(address).path
    return address.strip("/").lower()
