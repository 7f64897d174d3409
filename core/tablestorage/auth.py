"""How a Table request proves who sends it: the account key (Shared Key, local connection
strings) or a Microsoft Entra token (managed identity in Azure).

Shared Key for the Table service signs ``VERB\\nContent-MD5\\nContent-Type\\nx-ms-date\\n`` and the
canonical resource: ``/account`` followed by the request's encoded path (Azurite's path-style URLs
include the account once more, as the service expects), plus ``?comp=`` when present. Tokens are
cached and renewed five minutes before they expire.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

STORAGE_SCOPE: Final = "https://storage.azure.com/.default"
_RENEW_BEFORE_S: Final = 300


class Auth(Protocol):
    def authorization(self, verb: str, path: str, headers: Mapping[str, str]) -> str:
        """The Authorization header for a request to ``path`` (encoded, with its leading /)."""
        ...


@dataclass(frozen=True)
class SharedKey:
    account: str
    key: bytes

    @classmethod
    def of(cls, account: str, key_base64: str) -> SharedKey:
        return cls(account, base64.b64decode(key_base64, validate=True))

    def authorization(self, verb: str, path: str, headers: Mapping[str, str]) -> str:
        resource = f"/{self.account}{path.split('?', 1)[0]}"
        if "?comp=" in path or "&comp=" in path:
            comp = path.split("comp=", 1)[1].split("&", 1)[0]
            resource += f"?comp={comp}"
        text = "\n".join(
            (verb, "", headers.get("Content-Type", ""), headers["x-ms-date"], resource)
        )
        digest = hmac.new(self.key, text.encode(), hashlib.sha256).digest()
        return f"SharedKey {self.account}:{base64.b64encode(digest).decode()}"


class BearerToken:
    """A token credential (azure-identity) turned into Authorization headers, renewed early."""

    def __init__(self, credential: Any) -> None:
        self._credential = credential
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires_on = 0.0

    def authorization(self, verb: str, path: str, headers: Mapping[str, str]) -> str:
        with self._lock:
            if self._token is None or time.time() > self._expires_on - _RENEW_BEFORE_S:
                access = self._credential.get_token(STORAGE_SCOPE)
                self._token, self._expires_on = access.token, float(access.expires_on)
            return f"Bearer {self._token}"


@dataclass(frozen=True)
class ConnectionString:
    endpoint: str
    """The table service's URL, without a trailing slash."""
    auth: SharedKey


_DEVELOPMENT: Final = {
    "AccountName": "devstoreaccount1",
    "AccountKey": (
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
    ),
    "TableEndpoint": "http://127.0.0.1:10002/devstoreaccount1",
}
"""``UseDevelopmentStorage=true``: Azurite's published well-known account, not a secret."""


def parse_connection_string(text: str) -> ConnectionString:
    """A storage connection string's table endpoint and key; raises ValueError naming what is
    missing."""
    parts = dict(item.split("=", 1) for item in text.split(";") if "=" in item)
    if parts.get("UseDevelopmentStorage", "").lower() == "true":
        parts = {**_DEVELOPMENT, **parts}
    missing = [name for name in ("AccountName", "AccountKey") if not parts.get(name)]
    if missing:
        raise ValueError(f"the storage connection string lacks {' and '.join(missing)}")
    endpoint = parts.get("TableEndpoint")
    if not endpoint:
        protocol = parts.get("DefaultEndpointsProtocol", "https")
        suffix = parts.get("EndpointSuffix", "core.windows.net")
        endpoint = f"{protocol}://{parts['AccountName']}.table.{suffix}"
    try:
        auth = SharedKey.of(parts["AccountName"], parts["AccountKey"])
    except ValueError:
        raise ValueError("the storage connection string's AccountKey is not base64") from None
    return ConnectionString(endpoint.rstrip("/"), auth)
