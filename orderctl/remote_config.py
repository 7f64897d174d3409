"""Where `orderctl` sends operator commands in remote mode, and with which credentials.

Remote mode is asked for with ``--api-url URL`` (``ORDERCTL_API_URL``) or ``--azd-env FILE``
(``azd env get-values`` output; ``-`` reads it from stdin). Credentials: a function key
(``--function-key``, ``ORDERCTL_FUNCTION_KEY``), sent as ``x-functions-key``, and/or a
Microsoft Entra ID token (``--entra`` or ``ORDERCTL_AUTH=entra``, for the scope ``--scope`` or
``ORDERCTL_SCOPE``, e.g. ``api://<app-client-id>/.default``), sent as a bearer token. In
Azure both are needed for actions: the Functions host checks the key on every route, App
Service Authentication turns the token into the caller an action records.

Options and environment variables win over the file; the file may carry ``ORDERCTL_*``
values too (``azd env set ORDERCTL_SCOPE ...``). The operator API is the operations app's (the
pattern app serves no HTTP); its URL is, first found: ``ORDERCTL_API_URL``,
``AZURE_OPERATIONS_APP_URL``, else ``https://<name>.azurewebsites.net/api/`` from
``AZURE_OPERATIONS_APP_NAME`` (outputs of infra/main.bicep) or ``SERVICE_OPERATIONS_NAME``.

Nothing here imports httpx or the Azure SDKs: it runs on every `orderctl` start. Secrets are
never part of a message or a repr.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit, urlunsplit

API_URL_ENV: Final = "ORDERCTL_API_URL"
FUNCTION_KEY_ENV: Final = "ORDERCTL_FUNCTION_KEY"
AUTH_ENV: Final = "ORDERCTL_AUTH"
SCOPE_ENV: Final = "ORDERCTL_SCOPE"
AZD_URL_KEYS: Final = (API_URL_ENV, "AZURE_OPERATIONS_APP_URL")
AZD_NAME_KEYS: Final = ("AZURE_OPERATIONS_APP_NAME", "SERVICE_OPERATIONS_NAME")
AUTH_MODES: Final = ("key", "entra")
LOOPBACK: Final = frozenset({"localhost", "127.0.0.1", "::1"})
_KEY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_APP_NAME: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,58}[A-Za-z0-9])?")
_ESCAPES: Final = re.compile(r"\\(.)")
_ESCAPED: Final = {"n": "\n", "t": "\t", "r": "\r"}


class RemoteError(Exception):
    """Remote mode could not be set up, or the API could not be used: one line saying what
    to do, and the exit code (2: change the input or the setup; 1: something failed)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


@dataclass(frozen=True)
class RemoteConfig:
    """A resolved remote target: the operator API's base URL (ending ``/``) and credentials."""

    api_url: str
    function_key: str | None = field(default=None, repr=False)
    entra_scope: str | None = None
    """Send an Entra ID token for this scope (None: no token)."""

    def credentials(self) -> str:
        """What is sent, in words (never the secrets themselves)."""
        sent = [name for name, on in (("a function key", self.function_key),
                                      ("an Entra token", self.entra_scope)) if on]  # fmt: skip
        return " and ".join(sent) or "no credentials"


@dataclass(frozen=True)
class RemoteOptions:
    """The remote-mode options as given (options and environment), resolved on first use."""

    api_url: str | None = None
    function_key: str | None = field(default=None, repr=False)
    entra: bool = False
    scope: str | None = None
    azd_env: str | None = None
    """A file of ``azd env get-values`` output, or ``-`` for stdin."""
    auth: str | None = None
    """ORDERCTL_AUTH from the environment: key or entra."""

    @property
    def requested(self) -> bool:
        return bool(self.api_url or self.azd_env)


def resolve(options: RemoteOptions, read: Callable[[str], str]) -> RemoteConfig:
    """The target and credentials ``options`` describe; ``read(path)`` reads the azd file
    (``-``: stdin). Raises RemoteError naming what is missing or wrong."""
    values = parse_azd_values(read(options.azd_env), options.azd_env) if options.azd_env else {}
    url = options.api_url or api_url_from_azd(values, options.azd_env or "")
    key = options.function_key or values.get(FUNCTION_KEY_ENV) or None
    auth = (options.auth or values.get(AUTH_ENV) or "key").strip().lower()
    if auth not in AUTH_MODES:
        raise RemoteError(f"{AUTH_ENV} must be key or entra, not {auth[:20]!r}")
    scope = None
    if options.entra or auth == "entra":
        scope = (options.scope or values.get(SCOPE_ENV) or "").strip()
        if not scope:
            raise RemoteError(
                f"--entra needs the API's scope: --scope or {SCOPE_ENV}="
                "api://<app-client-id>/.default (the app registration of the function app's "
                "App Service Authentication)"
            )
    config = RemoteConfig(api_url=normalize_api_url(url), function_key=key, entra_scope=scope)
    check_transport(config)
    return config


def normalize_api_url(url: str) -> str:
    """``url`` as the operator API's base: http(s), a host, no query; a bare host gets
    ``/api/`` (the Functions host's route prefix); always ending ``/``."""
    parts = urlsplit(url.strip())
    shown = f"{parts.scheme}://{parts.hostname}" if parts.hostname else "the URL given"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(
            "--api-url must be an http(s) URL of the operator API, e.g. "
            "https://<app>.azurewebsites.net/api/ or http://127.0.0.1:7071/api/"
        )
    if parts.username or parts.password or parts.query or parts.fragment:
        raise RemoteError(
            f"--api-url {shown}...: give the URL without credentials, query or fragment "
            f"(a function key goes in --function-key or {FUNCTION_KEY_ENV})"
        )
    path = parts.path if parts.path.strip("/") else "/api/"
    if not path.endswith("/"):
        path += "/"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def check_transport(config: RemoteConfig) -> None:
    """Refuse to send a credential in clear text anywhere but this machine."""
    parts = urlsplit(config.api_url)
    secret = bool(config.function_key or config.entra_scope)
    if secret and parts.scheme == "http" and (parts.hostname or "") not in LOOPBACK:
        raise RemoteError(
            f"refusing to send {config.credentials()} over plain http to {parts.hostname}: "
            "use an https URL"
        )


def api_url_from_azd(values: Mapping[str, str], source: str) -> str:
    """The operator API's URL from ``azd env get-values`` output (see the module's doc)."""
    for key in AZD_URL_KEYS:
        if values.get(key, "").strip():
            return values[key].strip()
    for key in AZD_NAME_KEYS:
        name = values.get(key, "").strip()
        if name and _APP_NAME.fullmatch(name):
            return f"https://{name}.azurewebsites.net/api/"
    where = "stdin" if source == "-" else source
    raise RemoteError(
        f"no operations app in {where}: expected AZURE_OPERATIONS_APP_NAME (an output of "
        f"infra/main.bicep, after `azd provision`) or {API_URL_ENV}; is it the output of "
        "`azd env get-values`?"
    )


def parse_azd_values(text: str, source: str = "-") -> dict[str, str]:
    """``KEY="value"`` lines (``azd env get-values``, dotenv): double-quoted values with
    backslash escapes, single-quoted ones as they are, bare ones stripped; blank lines,
    ``#`` comments and an ``export`` prefix are allowed. A bad line is named by its number,
    never shown (it may hold a secret)."""
    values: dict[str, str] = {}
    where = "stdin" if source == "-" else source
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").lstrip()
        key, equals, value = line.partition("=")
        key = key.strip()
        if not equals or not _KEY.fullmatch(key):
            raise RemoteError(f'{where} line {number} is not KEY="value" (azd env get-values)')
        values[key] = _unquote(value.strip(), where, number)
    return values


def _unquote(value: str, where: str, number: int) -> str:
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1]
    if value.startswith('"'):
        if len(value) < 2 or not value.endswith('"') or _escaped_end(value):
            raise RemoteError(f"{where} line {number}: a quoted value is not closed")
        return _ESCAPES.sub(lambda m: _ESCAPED.get(m.group(1), m.group(1)), value[1:-1])
    return value


def _escaped_end(value: str) -> bool:
    """The closing quote is itself escaped (an odd run of backslashes before it)."""
    body = value[1:-1]
    return (len(body) - len(body.rstrip("\\"))) % 2 == 1
