"""How a Table request proves who sends it: the account key (Shared Key, local connection
strings) or a Microsoft Entra token (managed identity in Azure).

Shared Key for the Table service signs ``VERB\\nContent-MD5\\nContent-Type\\nx-ms-date\\n`` and the
canonical resource: ``/account`` followed by the request's encoded path (Azurite's path-style URLs
include the account once more, as the service expects), plus ``?comp=`` when present. Tokens are
cached; a request renews one itself only when it has less than five minutes left, which a
renewal on a background thread ten minutes before keeps from happening (the async client calls
:meth:`BearerToken.authorization` on its event loop, which must not wait on the token endpoint).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
import logging
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

STORAGE_SCOPE: Final = "https://storage.azure.com/.default"
_RENEW_BEFORE_S: Final = 300
"""A request renews a token with less than this left (and waits for it)."""
_RENEW_AHEAD_S: Final = 600
"""The background renewal starts this long before a token expires."""
_RETRY_S: Final = 30.0
"""A failed background renewal is tried again after this long."""

_log = logging.getLogger(__name__)


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
    """A token credential (azure-identity, sync) turned into Authorization headers.

    The first request fetches the token. From then on a timer thread renews it
    ``_RENEW_AHEAD_S`` before it expires (again every ``_RETRY_S`` while that fails or the
    credential hands back the same token), so requests keep finding a valid one and never wait
    on the token endpoint; only a token with less than ``_RENEW_BEFORE_S`` left, which means
    the renewals have failed for five minutes, is renewed by the request itself, as before.
    An async credential (azure.identity.aio) is refused: the renewal is a thread's, not a loop's.
    """

    def __init__(self, credential: Any) -> None:
        if inspect.iscoroutinefunction(getattr(credential, "get_token", None)):
            raise TypeError(
                "BearerToken needs a sync credential (azure.identity, not azure.identity.aio): "
                "it renews the token on a thread, off the event loop"
            )
        self._credential = credential
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires_on = 0.0
        self._timer: threading.Timer | None = None

    def authorization(self, verb: str, path: str, headers: Mapping[str, str]) -> str:
        with self._lock:
            if self._token is None or time.time() > self._expires_on - _RENEW_BEFORE_S:
                self._keep(self._credential.get_token(STORAGE_SCOPE))
            return f"Bearer {self._token}"

    def _keep(self, access: Any) -> None:
        """Hold ``access`` (the lock held) and plan its renewal."""
        self._token, self._expires_on = access.token, float(access.expires_on)
        self._plan(self._expires_on - _RENEW_AHEAD_S - time.time())

    def _plan(self, delay: float) -> None:
        """Renew in the background after ``delay`` seconds (the lock held); not at all when
        that is past the point where requests renew it themselves."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if time.time() + delay >= self._expires_on - _RENEW_BEFORE_S:
            return
        # The timer holds the token weakly: one its service dropped stops renewing.
        self._timer = threading.Timer(max(delay, 0.0), _renew, args=(weakref.ref(self),))
        self._timer.daemon = True
        self._timer.start()

    def _renew(self) -> None:
        """The timer's work: fetch a token without the lock, so requests go on meanwhile."""
        try:
            access = self._credential.get_token(STORAGE_SCOPE)
        except Exception as exc:  # the request path renews it if this keeps failing
            _log.warning("could not renew the storage token ahead of time: %s", exc)
            with self._lock:
                self._plan(_RETRY_S)
            return
        with self._lock:
            if float(access.expires_on) > self._expires_on:
                self._keep(access)
            else:  # the credential's cache handed back the same token: ask again later
                self._plan(_RETRY_S)


def _renew(token: weakref.ref[BearerToken]) -> None:
    bearer = token()
    if bearer is not None:
        bearer._renew()


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
