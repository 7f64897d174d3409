"""Remote mode: the operator operations over the operator HTTP API (``/api/...``).

:class:`RemoteOperations` has the methods `orderctl` calls on
:class:`orderctl.local.LocalOperations` (:class:`orderctl.backend.OperatorBackend`);
each is one request, and the JSON answer is read into the same model the in-process call
returns, so every command prints the same tables and ``--json`` documents either way.

Refusals come back as the API sent them: ``{"error": {"code", "message"}}`` with 400, 404,
409, 413 or 503 becomes the :class:`~service.operations.errors.OperatorError` the operation raised
(the CLI prints ``message (code)``, exit 2). Everything else is a :class:`RemoteError` of one
line saying what to check: 401 and 403 (which credential to send), a 404 that is not the
API's (wrong URL, or no app there), a redirect (a login page), 5xx, no connection, a timeout,
an answer that is not the API's.

Path parameters are percent-encoded; the function key travels in ``x-functions-key`` (never
in the URL), the Entra token in ``Authorization``; neither is ever printed. Redirects are not
followed (they would carry the key elsewhere).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Final, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from orderctl.remote_config import FUNCTION_KEY_ENV, SCOPE_ENV, RemoteConfig, RemoteError
from service.operations.bulk import BulkAction
from service.operations.errors import (
    Busy,
    Conflict,
    InvalidRequest,
    NotFound,
    OperatorError,
    TooLarge,
    Unauthenticated,
)
from service.operations.models import (
    AckView,
    ActionView,
    AlertPage,
    ArchivedOrderView,
    BulkView,
    DeadLetterActionView,
    DeadLetterLogView,
    DeadLetterPage,
    DeadLetterSummary,
    HealthView,
    OrderDetail,
    OrderPage,
    PurgeRunsView,
    PurgeView,
    SupervisorView,
    WatchView,
)

M = TypeVar("M", bound=BaseModel)
KEY_HEADER: Final = "x-functions-key"
CONNECT_TIMEOUT_S: Final = 10.0
READ_TIMEOUT_S: Final = 30.0
ACTION_TIMEOUT_S: Final = 120.0
"""POSTs: a purge examines for up to 60 s, a bulk action acts on up to 100 orders."""
TOKEN_MARGIN_S: Final = 300.0
REFUSALS: Final[dict[int, type[OperatorError]]] = {
    400: InvalidRequest,
    401: Unauthenticated,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    503: Busy,
}
KEYS_HINT: Final = "`az functionapp keys list -g <resource group> -n <function app>`"


class EntraToken:
    """An Entra ID access token for ``scope`` from azure-identity's asyncio credentials
    (DefaultAzureCredential: `az login`, `azd auth login`, a managed identity, environment
    variables...), fetched on first use and again shortly before it expires."""

    def __init__(self, scope: str, credential: Any | None = None) -> None:
        self.scope = scope
        self._credential = credential
        self._owned = credential is None
        self._token: Any = None

    async def value(self) -> str:
        if self._token is None or self._token.expires_on - TOKEN_MARGIN_S <= time.time():
            self._token = await self._fetch()
        return str(self._token.token)

    async def _fetch(self) -> Any:
        from azure.core.exceptions import ClientAuthenticationError

        if self._credential is None:
            from azure.identity.aio import DefaultAzureCredential

            self._credential = DefaultAzureCredential()
        try:
            return await self._credential.get_token(self.scope)
        except ClientAuthenticationError as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise RemoteError(
                f"no Entra token for {self.scope}: {first[:200]}: sign in (`az login` or "
                f"`azd auth login`) and check --scope / {SCOPE_ENV}"
            ) from None

    async def close(self) -> None:
        if self._owned and self._credential is not None:
            await self._credential.close()


class OperatorAuth(httpx.Auth):
    """Adds the function key and the Entra token (whichever are configured) to each request."""

    def __init__(self, function_key: str | None, token: EntraToken | None) -> None:
        self._key = function_key
        self._token = token

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        if self._key:
            request.headers[KEY_HEADER] = self._key
        if self._token is not None:
            request.headers["Authorization"] = f"Bearer {await self._token.value()}"
        yield request


class RemoteOperations:
    """The operator operations of a deployed app (or of a local host serving the API)."""

    def __init__(
        self,
        config: RemoteConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        credential: Any | None = None,
    ) -> None:
        self.config = config
        scope = config.entra_scope
        self._token = EntraToken(scope, credential) if scope else None
        self._http = httpx.AsyncClient(
            base_url=config.api_url,
            auth=OperatorAuth(config.function_key, self._token),
            timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            headers={"Accept": "application/json", "User-Agent": "orderctl"},
            follow_redirects=False,
            transport=transport,
        )

    async def close(self) -> None:
        await self._http.aclose()
        if self._token is not None:
            await self._token.close()

    # ---------------------------------------------------------------------------- orders

    async def show_order(
        self, order_id: str, *, timeline_after: int = -1, timeline_limit: int = 200
    ) -> OrderDetail:
        params = {"timeline_after": timeline_after, "timeline_limit": timeline_limit}
        return await self._get(OrderDetail, path("orders", order_id), params)

    async def watch_order(
        self, order_id: str, *, after_seq: int = -1, wait_s: float = 20.0
    ) -> WatchView:
        params = {"after": after_seq, "wait": seconds(wait_s)}
        return await self._get(WatchView, path("orders", order_id, "watch"), params, wait_s=wait_s)

    async def list_orders(
        self,
        state: str,
        *,
        step: str | None = None,
        older_than: str | None = None,
        newer_than: str | None = None,
        text: str | None = None,
        sort: str | None = None,
        limit: int = 50,
        continuation: str | None = None,
    ) -> OrderPage:
        params = {"state": state, "step": step, "older_than": older_than,
                  "newer_than": newer_than, "text": text, "sort": sort, "limit": limit,
                  "continuation": continuation}  # fmt: skip
        return await self._get(OrderPage, "orders", params)

    async def resubmit(self, order_id: str, *, operator: str, reason: str) -> ActionView:
        return await self._post(
            ActionView, path("orders", order_id, "resubmit"), {"reason": reason}
        )

    async def cancel(self, order_id: str, *, operator: str, reason: str) -> ActionView:
        return await self._post(ActionView, path("orders", order_id, "cancel"), {"reason": reason})

    async def restart(self, order_id: str, *, step: str, operator: str, reason: str) -> ActionView:
        body = {"step": step, "reason": reason}
        return await self._post(ActionView, path("orders", order_id, "restart"), body)

    async def bulk(
        self,
        action: BulkAction,
        *,
        operator: str,
        reason: str | None,
        state: str | None = None,
        step: str | None = None,
        older_than: str | None = None,
        newer_than: str | None = None,
        text: str | None = None,
        dry_run: bool = False,
        order_ids: Sequence[str] | None = None,
        limit: int = 100,
    ) -> BulkView:
        body = {"reason": reason, "state": state, "step": step, "older_than": older_than,
                "newer_than": newer_than, "text": text, "dry_run": dry_run,
                "order_ids": None if order_ids is None else list(order_ids),
                "limit": limit}  # fmt: skip
        return await self._post(BulkView, path("bulk", action), body)

    async def supervisor(self) -> SupervisorView:
        return await self._get(SupervisorView, "supervisor")

    # ----------------------------------------------------------------------------- purge

    async def purge(
        self,
        *,
        operator: str,
        state: str = "all",
        older_than_days: int | None = None,
        dry_run: bool = False,
        limit: int = 1000,
    ) -> PurgeView:
        body = {"state": state, "older_than_days": older_than_days, "dry_run": dry_run,
                "limit": limit}  # fmt: skip
        return await self._post(PurgeView, "purge", body)

    async def purge_runs(self, *, limit: int = 20) -> PurgeRunsView:
        return await self._get(PurgeRunsView, "purge", {"limit": limit})

    async def archived_order(self, order_id: str, *, day: str | None = None) -> ArchivedOrderView:
        return await self._get(ArchivedOrderView, path("archive", order_id), {"day": day})

    # ---------------------------------------------------------------------------- alerts

    async def list_alerts(
        self, *, limit: int = 50, continuation: str | None = None, open_only: bool = False
    ) -> AlertPage:
        params = {"limit": limit, "continuation": continuation, "open": open_only}
        return await self._get(AlertPage, "alerts", params)

    async def acknowledge_alert(
        self, sequence_number: int, *, operator: str, reason: str | None = None
    ) -> AckView:
        body = {"reason": reason} if reason else {}
        return await self._post(AckView, path("alerts", sequence_number, "ack"), body)

    # ---------------------------------------------------------------------- dead letters

    async def dead_letter_summary(self, *, limit: int = 100) -> DeadLetterSummary:
        return await self._get(DeadLetterSummary, "dead-letters", {"limit": limit})

    async def list_dead_letters(
        self, queue: str, *, limit: int = 50, continuation: str | None = None
    ) -> DeadLetterPage:
        params = {"limit": limit, "continuation": continuation}
        return await self._get(DeadLetterPage, path("dead-letters", queue), params)

    async def replay_dead_letters(
        self,
        queue: str,
        *,
        operator: str,
        sequence_numbers: Sequence[int] | None = None,
        everything: bool = False,
        dry_run: bool = False,
        limit: int = 100,
        reason: str | None = None,
    ) -> DeadLetterActionView:
        return await self._settle(
            "replay", queue, sequence_numbers, everything, dry_run, limit, reason
        )

    async def purge_dead_letters(
        self,
        queue: str,
        *,
        operator: str,
        sequence_numbers: Sequence[int] | None = None,
        everything: bool = False,
        dry_run: bool = False,
        limit: int = 100,
        reason: str | None = None,
    ) -> DeadLetterActionView:
        return await self._settle(
            "purge", queue, sequence_numbers, everything, dry_run, limit, reason
        )

    async def dead_letter_log(self, *, limit: int = 20) -> DeadLetterLogView:
        return await self._get(DeadLetterLogView, "dead-letter-log", {"limit": limit})

    async def _settle(
        self, kind: str, queue: str, sequence_numbers: Sequence[int] | None, everything: bool,
        dry_run: bool, limit: int, reason: str | None = None,
    ) -> DeadLetterActionView:  # fmt: skip
        body = {"sequence_numbers": list(sequence_numbers) if sequence_numbers else None,
                "all": everything, "dry_run": dry_run, "limit": limit}  # fmt: skip
        if reason:
            body["reason"] = reason
        return await self._post(DeadLetterActionView, path("dead-letters", queue, kind), body)

    # ---------------------------------------------------------------------------- health

    async def health(self) -> HealthView:
        """200 when every check passes, 503 (with the same view) when one fails."""
        response = await self._send("GET", "health", timeout=self._timeout(READ_TIMEOUT_S))
        if response.status_code == 503:
            try:
                return HealthView.model_validate_json(response.content)
            except ValidationError:
                pass  # the platform's 503, not the API's
        return self._result(HealthView, response)

    # ------------------------------------------------------------------------- requests

    async def _get(
        self, model: type[M], where: str, params: dict[str, Any] | None = None, *,
        wait_s: float = 0.0,
    ) -> M:  # fmt: skip
        query = {k: query_value(v) for k, v in (params or {}).items() if v is not None}
        timeout = self._timeout(READ_TIMEOUT_S + wait_s)
        return self._result(model, await self._send("GET", where, params=query, timeout=timeout))

    async def _post(self, model: type[M], where: str, body: dict[str, Any]) -> M:
        sent = {k: v for k, v in body.items() if v is not None}
        timeout = self._timeout(ACTION_TIMEOUT_S)
        return self._result(model, await self._send("POST", where, json=sent, timeout=timeout))

    @staticmethod
    def _timeout(read_s: float) -> httpx.Timeout:
        return httpx.Timeout(read_s, connect=CONNECT_TIMEOUT_S)

    async def _send(self, method: str, where: str, **options: Any) -> httpx.Response:
        url = self.config.api_url + where
        try:
            return await self._http.request(method, where, **options)
        except httpx.TimeoutException as error:
            raise RemoteError(
                f"the operator API at {url} did not answer in time ({type(error).__name__}): "
                "check that the app is running, then try again",
                1,
            ) from None
        except httpx.HTTPError as error:
            raise RemoteError(f"cannot reach the operator API at {url} ({reason(error)}): "
                              f"{self._where_to_look()}", 1) from None  # fmt: skip

    def _where_to_look(self) -> str:
        return (
            "check --api-url (ORDERCTL_API_URL); for the local stack `orderctl ps` shows it, "
            "for Azure that the app is deployed (`azd env get-values`: AZURE_FUNCTION_APP_NAME)"
        )

    def _result(self, model: type[M], response: httpx.Response) -> M:
        if response.status_code not in (200, 202):
            raise self._refusal(response)
        try:
            return model.model_validate_json(response.content)
        except ValidationError as error:
            problem = error.errors()[0]
            where = ".".join(str(p) for p in problem["loc"]) or "the body"
            raise RemoteError(
                f"{response.request.url.copy_with(query=None)} did not answer with the "
                f"operator API's {model.__name__} ({where}: {problem['msg']}): is --api-url "
                "the operator API (…/api/), and orderctl the same version as the app?",
                1,
            ) from None

    def _refusal(self, response: httpx.Response) -> Exception:
        status = response.status_code
        error = error_of(response)
        code = error[0] if error else ""
        if status == 401:
            return RemoteError(self._unauthenticated(code == "not_signed_in"))
        if status == 403:
            return RemoteError(self._forbidden())
        if 300 <= status < 400:
            return RemoteError(
                f"the operator API redirected to {response.headers.get('location', '?')[:120]} "
                f"({status}): App Service Authentication sends unsigned callers to a login "
                "page: use --entra, or let it pass unauthenticated requests (docs/deploy.md)"
            )
        if error is not None and status in REFUSALS and not (status == 404 and code == "not_found"):
            return REFUSALS[status](code, error[1])
        url = response.request.url.copy_with(query=None)
        if status == 404:
            return RemoteError(
                f"nothing at {url} (404): wrong --api-url (the operator API's base ends /api/), "
                "or the app is not deployed there"
            )
        detail = f" {code}: {error[1][:200]}" if error else ""
        return RemoteError(
            f"the operator API failed at {url} ({status}{detail}): try again; if it goes on, "
            "see the app's logs",
            1,
        )

    def _unauthenticated(self, not_signed_in: bool) -> str:
        if not_signed_in:
            if self._token is not None:
                return (
                    "the API knows no signed-in caller (401 not_signed_in) although a token was "
                    "sent: turn on App Service Authentication for the app (docs/deploy.md, "
                    "Operator identity)"
                )
            return (
                "actions record who acted, and the API knows no signed-in caller (401 "
                "not_signed_in): add --entra (ORDERCTL_AUTH=entra) on an app with App Service "
                "Authentication; a local stack names its caller from DEVHOST_PRINCIPAL_NAME "
                "(set it before `orderctl up`)"
            )
        if not self.config.function_key:
            return (
                f"the operator API wants a function key (401): pass --function-key or set "
                f"{FUNCTION_KEY_ENV} ({KEYS_HINT}); an Entra token alone is not enough"
            )
        token = ", or the Entra token (check --scope)" if self._token is not None else ""
        return (
            f"the operator API refused the function key{token} (401): use a key of this app "
            f"({KEYS_HINT})"
        )

    def _forbidden(self) -> str:
        if self._token is not None:
            return (
                "the operator API refused the Entra token (403): check --scope / "
                f"{SCOPE_ENV} (api://<app-client-id>/.default) and that your account may call "
                "the app"
            )
        return (
            "the operator API refused access (403): App Service Authentication may require a "
            "signed-in caller (add --entra), or the app is stopped (`az functionapp start`)"
        )


def path(*parts: str | int) -> str:
    """A relative path of percent-encoded segments (``/`` in a value is encoded too)."""
    return "/".join(quote(str(part), safe="") for part in parts)


def seconds(value: float) -> str:
    """A wait as the API's ``wait`` parameter takes it: at most 3 decimals."""
    return f"{max(value, 0.0):.3f}".rstrip("0").rstrip(".")


def query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def error_of(response: httpx.Response) -> tuple[str, str] | None:
    """The API's ``{"error": {"code", "message"}}``, if that is what came back."""
    try:
        document = response.json()
    except ValueError:
        return None
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict):
        return None
    code, message = error.get("code"), error.get("message")
    if not isinstance(code, str) or not isinstance(message, str):
        return None
    return code, message


def reason(error: httpx.HTTPError) -> str:
    text = (str(error).strip().splitlines() or [""])[0]
    return text[:160] or type(error).__name__
