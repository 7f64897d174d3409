"""The account key a Table request is signed with (Shared Key: local connection strings), and
the scope a Microsoft Entra token is asked for (managed identity in Azure: the pipeline's
:class:`~adapters.tables.pipeline.BearerTokenPolicy` fetches and renews tokens).

Shared Key for the Table service signs ``VERB\\nContent-MD5\\nContent-Type\\nx-ms-date\\n`` and the
canonical resource: ``/account`` followed by the request's encoded path (Azurite's path-style URLs
include the account once more, as the service expects), plus ``?comp=`` when present.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

STORAGE_SCOPE: Final = "https://storage.azure.com/.default"


@dataclass(frozen=True)
class SharedKey:
    account: str
    key: bytes

    @classmethod
    def of(cls, account: str, key_base64: str) -> SharedKey:
        return cls(account, base64.b64decode(key_base64, validate=True))

    def authorization(self, verb: str, path: str, headers: Mapping[str, str]) -> str:
        """The Authorization header for a request to ``path`` (encoded, with its leading /)."""
        resource = f"/{self.account}{path.split('?', 1)[0]}"
        if "?comp=" in path or "&comp=" in path:
            comp = path.split("comp=", 1)[1].split("&", 1)[0]
            resource += f"?comp={comp}"
        text = "\n".join(
            (verb, "", headers.get("Content-Type", ""), headers["x-ms-date"], resource)
        )
        digest = hmac.new(self.key, text.encode(), hashlib.sha256).digest()
        return f"SharedKey {self.account}:{base64.b64encode(digest).decode()}"


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
