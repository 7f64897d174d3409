"""The dashboard's routes called through the operations app's HTTP function with HttpRequest
objects, as the Functions worker would: its pages, assets and caller, the vendored libraries,
and the summary's arithmetic. No browser and no services here."""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, urlencode

import azure.functions as func
import pytest

from dashboard import assets, vendor
from dashboard import routes as dashboard
from domain.order import Order
from service.operations import summary
from tests.support.operations import OperationsApp, loaded

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def ops() -> Iterator[OperationsApp]:
    with loaded() as app:
        yield app


async def get(ops: OperationsApp, path: str, *, params=None, headers=None) -> func.HttpResponse:
    """GET /api/<path> (its parts already percent-encoded) through the operations app."""
    url = f"http://localhost/api/{path}" + (f"?{urlencode(params)}" if params else "")
    return await ops.request("GET", url, headers=headers)


async def test_the_page_carries_a_strict_policy_and_versioned_asset_urls(ops):
    response = await get(ops, "dashboard")
    html = response.get_body().decode()
    assert response.status_code == 200
    policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe-eval" not in policy
    assert "frame-ancestors 'none'" in policy
    assert response.headers["Cache-Control"] == "no-store"
    assert "%%" not in html
    assert '<script src="/api/dashboard/static/app.js?v=' in html
    assert '<script src="/api/dashboard/vendor/uPlot.iife.min.js?v=' in html
    assert "<script>" not in html, "no inline script: the policy would refuse it"


async def test_the_function_key_is_passed_on_to_the_assets_and_never_unescaped(ops):
    key = "abcDEF123_-=="
    page = await get(ops, "dashboard", params={"code": key})
    html = page.get_body().decode()
    assert "app.js?v=" in html and "&amp;code=abcDEF123_-%3D%3D" in html
    hostile = '"><script>alert(1)</script>'
    page = await get(ops, "dashboard", params={"code": hostile})
    assert b"alert(1)" not in page.get_body() and b"code=" not in page.get_body()


async def test_assets_are_served_with_etags_gzip_and_nothing_else(ops):
    asset = await get(ops, "dashboard/vendor/uPlot.iife.min.js")
    assert asset.status_code == 200 and asset.mimetype == "text/javascript; charset=utf-8"
    etag = asset.headers["ETag"]
    zipped = await get(
        ops, "dashboard/vendor/uPlot.iife.min.js", headers={"Accept-Encoding": "gzip, br"}
    )
    assert zipped.headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(zipped.get_body()) == asset.get_body()
    unchanged = await get(
        ops, "dashboard/vendor/uPlot.iife.min.js", headers={"If-None-Match": etag}
    )
    assert unchanged.status_code == 304 and unchanged.get_body() == b""
    for name in ("../routes.py", "..", "VERSIONS.json", "app.js/../x", "", ".hidden.js"):
        missing = await get(ops, "dashboard/vendor/" + quote(name, safe=""))
        assert missing.status_code == 404, name
        assert json.loads(missing.get_body())["error"]["code"] == "not_found"
    own = await get(ops, "dashboard/static/index.html")
    assert own.headers["ETag"]


def test_every_asset_reference_in_a_page_names_an_existing_asset():
    for page in ("index.html", "api-docs.html"):
        text = assets.OWN.get(page).body.decode()
        for kind, name in assets._ASSET_REF.findall(text):
            (assets.OWN if kind == "static" else assets.VENDOR).get(name)


def test_the_vendored_libraries_are_the_locked_packages():
    assert vendor.check() == []
    locked = vendor.locked_versions()
    assert locked == {"uplot": locked["uplot"], "swagger-ui-dist": locked["swagger-ui-dist"]}
    package = json.loads((vendor.REPO_ROOT / "package.json").read_text())
    for name, version in locked.items():
        assert package["dependencies"][name] == version, "pinned exactly (npm --save-exact)"


def claims_header(roles: list[str], *, role_typ: str = "roles") -> str:
    claims = [{"typ": "name", "val": "ann@example.com"}]
    claims += [{"typ": role_typ, "val": role} for role in roles]
    principal = {"auth_typ": "aad", "claims": claims, "role_typ": role_typ}
    return base64.b64encode(json.dumps(principal).encode()).decode()


def test_the_caller_as_the_platform_names_it():
    local = dashboard.caller({"X-MS-CLIENT-PRINCIPAL-NAME": "dev"}, auth_enabled=False)
    assert local["principal"] == "dev" and local["can_act"] is True
    assert local["has_operator_role"] is None and local["sign_in"] is None
    nobody = dashboard.caller({}, auth_enabled=True)
    assert nobody["can_act"] is False and nobody["sign_in"] == "/.auth/login/aad"
    operator = dashboard.caller(
        {
            "X-MS-CLIENT-PRINCIPAL-NAME": "ann@example.com",
            "X-MS-CLIENT-PRINCIPAL": claims_header(
                ["Operator"],
                role_typ="http://schemas.microsoft.com/ws/2008/06/identity/claims/role",
            ),
        },
        auth_enabled=True,
    )
    assert operator["roles"] == ["Operator"] and operator["has_operator_role"] is True
    assert operator["identity_provider"] == "aad" and operator["sign_out"] == "/.auth/logout"
    reader = dashboard.caller(
        {"X-MS-CLIENT-PRINCIPAL-NAME": "bob", "X-MS-CLIENT-PRINCIPAL": claims_header([])},
        auth_enabled=True,
    )
    assert reader["has_operator_role"] is False
    garbled = dashboard.caller(
        {"X-MS-CLIENT-PRINCIPAL-NAME": "eve", "X-MS-CLIENT-PRINCIPAL": "%%%not base64"},
        auth_enabled=False,
    )
    assert garbled["roles"] == [] and garbled["has_operator_role"] is None


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, 900), ("15m", 900), ("300", 300), ("60m", 3600), ("4m", None), ("2h", None)],
)
def test_summary_window(value, seconds):
    assert dashboard._window(value) == seconds


async def test_a_bad_window_is_refused(ops):
    response = await get(ops, "dashboard/summary", params={"window": "1y"})
    assert response.status_code == 400
    assert json.loads(response.get_body())["error"]["code"] == "invalid_window"


def order(**changes) -> Order:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    base = {
        "order_id": "o-1",
        "workflow": "order@1",
        "state": "Processed",
        "locked_by": None,
        "complete_by": None,
        "failure_count": 0,
        "attempt": 3,
        "generation": 1,
        "current_step": "create_shipment",
        "current_operation": "do",
        "reply_to": None,
        "payload": {},
        "steps": (),
        "created_at": at,
        "updated_at": at + timedelta(seconds=2),
    }
    return Order(**(base | changes))  # type: ignore[arg-type]


def test_retries_and_latency_of_finished_orders():
    steps = {"order@1": 3}
    assert summary._retries(order(), steps) == 0
    assert summary._retries(order(attempt=5), steps) == 2
    assert summary._retries(order(attempt=9, generation=2), steps) == 0, "earlier runs count"
    assert summary._retries(order(workflow="gone@7"), steps) == 0
    assert summary._latencies([order(), order(generation=2)]) == [2.0]
    values = [float(n) for n in range(1, 101)]
    assert summary._percentile(values, 50) == 50.0
    assert summary._percentile(values, 99) == 99.0
    assert summary._percentile([], 50) is None
    now = datetime(2026, 1, 1, 0, 15, tzinfo=UTC)
    counts = summary._bucket_counts(
        [now - timedelta(seconds=1), now - timedelta(seconds=899), now - timedelta(hours=1)],
        now,
        30,
    )
    assert len(counts) == summary.BUCKETS and counts[-1] == 1 and counts[0] == 1
    assert sum(counts) == 2
