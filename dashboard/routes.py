"""The dashboard's routes: the page, its assets, its overview summary, who the caller is, and an
order's spans from the local telemetry files (:mod:`dashboard.traces`). Everything else the page
shows or does goes through the operator API (``/api/orders``, ``/api/alerts``, ...) from the
browser. Served by the operations app beside the operator API (:func:`operator_api.app.build`),
undocumented in its OpenAPI document.

Access is the operator API's: in Azure the Functions host answers 401 without a function or host
key before any code here runs; open the dashboard as ``https://<app>/api/dashboard?code=<key>``
and the page passes the key on to every call it makes. Locally (the local host, ``func start``)
keys are not checked. Actions record the caller App Service Authentication signed in
(``X-MS-CLIENT-PRINCIPAL-NAME``), which the operator API requires; :func:`dashboard_me` tells the
page who that is, and whether sign-in is available, so it can offer to sign in before an action
(docs/dashboard.md).

Pages are sent with a Content-Security-Policy that allows only this app's own scripts and
styles (no inline script, no other origin), and every stored value the page shows is set as
text, never as HTML.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
import re
from typing import Any, Final

from fastapi import APIRouter, Request, Response

from dashboard import assets, traces
from domain import ids
from operator_api.http import PRINCIPAL_HEADER, json_response, root
from service.operations.summary import DEFAULT_WINDOW_S, MAX_WINDOW_S, MIN_WINDOW_S

router = APIRouter(prefix="/dashboard")
log = logging.getLogger("dashboard.http")

PRINCIPAL_CLAIMS_HEADER: Final = "X-MS-CLIENT-PRINCIPAL"
OPERATOR_ROLE: Final = "Operator"
"""The Entra app role an operator is assigned (docs/deploy.md, Dashboard)."""
AUTH_ENABLED_SETTING: Final = "WEBSITE_AUTH_ENABLED"
"""Set by App Service when App Service Authentication is on (the platform, not an app setting
the templates write)."""
SIGN_IN_PATH: Final = "/.auth/login/aad"
SIGN_OUT_PATH: Final = "/.auth/logout"
MAX_CLAIMS_HEADER: Final = 16 * 1024

PAGE_POLICY: Final = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        # uPlot and Swagger UI size and place elements through element.style (CSSOM), and
        # Swagger UI renders some style attributes; no stylesheet from elsewhere.
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS: Final = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
_WINDOW: Final = re.compile(r"([0-9]{1,5})([sm]?)", re.ASCII)

# ------------------------------------------------------------------------------------ pages


@router.get("")
async def dashboard_page(req: Request) -> Response:
    return _page("index.html", req)


@router.get("/api-docs")
async def dashboard_api_docs(req: Request) -> Response:
    return _page("api-docs.html", req)


@router.get("/static/{name}")
async def dashboard_static(name: str, req: Request) -> Response:
    return _asset(assets.OWN, name, req, immutable=False)


@router.get("/vendor/{name}")
async def dashboard_vendor(name: str, req: Request) -> Response:
    return _asset(assets.VENDOR, name, req, immutable=True)


# ------------------------------------------------------------------------------------- data


@router.get("/summary")
async def dashboard_summary(req: Request) -> Response:
    window = _window(req.query_params.get("window"))
    if window is None:
        return _error(
            400,
            "invalid_window",
            f"window must be {MIN_WINDOW_S // 60} to {MAX_WINDOW_S // 60} minutes, "
            "e.g. 15m or 900 (seconds)",
        )
    try:
        body = await root(req).summary.snapshot(window)
    except Exception:
        log.exception("dashboard summary failed")
        return _error(500, "internal", "the summary failed on our side; it is logged")
    return _json(200, body)


@router.get("/orders/{order_id}/trace")
async def dashboard_order_trace(order_id: str) -> Response:
    """The order's span trees from the TELEMETRY_DIR files; without that setting (Azure),
    ``local: false`` and where to look instead (:mod:`dashboard.traces`)."""
    try:
        order_id = ids.validate_order_id(order_id)
    except ids.InvalidId as exc:
        return _error(400, "invalid_order_id", str(exc))
    try:
        # Reading the files blocks: it runs on a worker thread, and the loop serves on.
        directory = traces.telemetry_dir(os.environ)
        body = await asyncio.to_thread(traces.order_trace, order_id, directory)
    except OSError as exc:
        log.warning("dashboard trace of %s: cannot read the telemetry files: %s", order_id, exc)
        return _error(
            503,
            "telemetry_unreadable",
            f"the telemetry files cannot be read ({type(exc).__name__}); check TELEMETRY_DIR",
        )
    return _json(200, body)


@router.get("/me")
async def dashboard_me(req: Request) -> Response:
    auth_enabled = os.environ.get(AUTH_ENABLED_SETTING, "").strip().lower() == "true"
    return _json(200, caller(req.headers, auth_enabled=auth_enabled))


def caller(headers: Any, *, auth_enabled: bool) -> dict[str, Any]:
    """Who the platform says is calling, their roles, and where to sign in or out.

    ``principal`` is what an action will record (the operator API takes the same header);
    ``roles`` come from App Service Authentication's claims header (none locally, where the
    local host names the caller itself). ``can_act``: the operator API will accept an action
    (someone is signed in); ``has_operator_role`` is None where no claims are given."""
    principal = (headers.get(PRINCIPAL_HEADER) or "").strip() or None
    claims = _claims(headers.get(PRINCIPAL_CLAIMS_HEADER))
    platform = claims is not None or auth_enabled
    roles = sorted(claims["roles"]) if claims is not None else []
    return {
        "principal": principal,
        "identity_provider": claims["idp"] if claims is not None else None,
        "roles": roles,
        "operator_role": OPERATOR_ROLE,
        "has_operator_role": (OPERATOR_ROLE in roles) if claims is not None else None,
        "can_act": principal is not None,
        "app_service_auth": platform,
        "sign_in": SIGN_IN_PATH if auth_enabled and principal is None else None,
        "sign_out": SIGN_OUT_PATH if claims is not None else None,
    }


def _claims(raw: str | None) -> dict[str, Any] | None:
    """The roles and identity provider in App Service Authentication's claims header."""
    if not raw or len(raw) > MAX_CLAIMS_HEADER:
        return None
    try:
        data = json.loads(base64.b64decode(raw, validate=False))
    except (ValueError, binascii.Error, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("claims"), list):
        return None
    role_type = data.get("role_typ") if isinstance(data.get("role_typ"), str) else "roles"
    roles = {
        claim["val"]
        for claim in data["claims"]
        if isinstance(claim, dict)
        and claim.get("typ") in (role_type, "roles")
        and isinstance(claim.get("val"), str)
        and len(claim["val"]) <= 256
    }
    idp = data.get("auth_typ") if isinstance(data.get("auth_typ"), str) else None
    return {"roles": roles, "idp": idp}


# ---------------------------------------------------------------------------------- helpers


def _page(name: str, req: Request) -> Response:
    try:
        body = assets.render_page(name, req.query_params.get("code"))
    except assets.MissingAsset as missing:
        log.error("dashboard page %s needs a missing asset: %s", name, missing)
        return _error(500, "missing_asset", f"the dashboard is missing a file: {missing}")
    headers = {
        **SECURITY_HEADERS,
        "Content-Security-Policy": PAGE_POLICY,
        "Cache-Control": "no-store",
    }
    return Response(body, status_code=200, media_type="text/html; charset=utf-8", headers=headers)


def _asset(folder: assets.Assets, name: str, req: Request, *, immutable: bool) -> Response:
    try:
        asset = folder.get(name)
    except assets.MissingAsset:
        return _error(404, "not_found", "no such dashboard file")
    headers = {
        **SECURITY_HEADERS,
        "ETag": asset.etag,
        "Vary": "Accept-Encoding",
        # Asset URLs carry their version (?v=): a new file is a new URL.
        "Cache-Control": "private, max-age=31536000, immutable" if immutable else "no-cache",
        "Content-Type": asset.content_type,
    }
    if asset.etag in _etags(req.headers.get("If-None-Match")):
        return Response(status_code=304, headers=headers)
    body = asset.body
    accepts = req.headers.get("Accept-Encoding") or ""
    if asset.gzipped is not None and "gzip" in accepts.lower():
        body = asset.gzipped
        headers["Content-Encoding"] = "gzip"
    return Response(body, status_code=200, headers=headers)


def _etags(value: str | None) -> set[str]:
    return {part.strip().removeprefix("W/") for part in (value or "").split(",") if part.strip()}


def _window(value: str | None) -> int | None:
    if value is None or not value.strip():
        return DEFAULT_WINDOW_S
    match = _WINDOW.fullmatch(value.strip())
    if match is None:
        return None
    seconds = int(match.group(1)) * (60 if match.group(2) == "m" else 1)
    return seconds if MIN_WINDOW_S <= seconds <= MAX_WINDOW_S else None


def _json(status: int, body: Any) -> Response:
    return json_response(status, body, SECURITY_HEADERS)


def _error(status: int, code: str, message: str) -> Response:
    return _json(status, {"error": {"code": code, "message": message}})
