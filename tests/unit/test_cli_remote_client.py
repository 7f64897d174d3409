"""Remote mode's pieces on their own: the azd env values and the target they give, and the
HTTP client (orderctl.remote) against httpx.MockTransport: paths, credentials, and every kind
of answer turned into the operation's model, its refusal, or one line saying what to check."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from types import SimpleNamespace

import httpx
import pytest

from orderctl.backend import OperatorBackend
from orderctl.remote import RemoteOperations, path, seconds
from orderctl.remote_config import (
    RemoteConfig,
    RemoteError,
    RemoteOptions,
    api_url_from_azd,
    normalize_api_url,
    parse_azd_values,
    resolve,
)
from service.operations.errors import Busy, Conflict, InvalidRequest, NotFound
from tests.unit.cli_views import Ops

pytestmark = pytest.mark.anyio

AZD = """AZURE_ENV_NAME="sas-dev"
AZURE_FUNCTION_APP_NAME="func-abc123"
AZURE_OPERATIONS_APP_NAME="func-api-abc123"
# a comment, then a blank line

export ORDERCTL_SCOPE='api://1111-2222/.default'
QUOTED="a \\"b\\" \\\\ c\\nd"
BARE=plain value
EMPTY=""
"""
URL = "https://func-api-abc123.azurewebsites.net/api/"
OUTPUT_URL = {"AZURE_OPERATIONS_APP_URL": "https://ops.example.com/api/"}


# ------------------------------------------------------------------------ azd env values


def test_azd_values_are_read_as_azd_writes_them():
    values = parse_azd_values(AZD, "values.env")
    assert values == {
        "AZURE_ENV_NAME": "sas-dev",
        "AZURE_FUNCTION_APP_NAME": "func-abc123",
        "AZURE_OPERATIONS_APP_NAME": "func-api-abc123",
        "ORDERCTL_SCOPE": "api://1111-2222/.default",
        "QUOTED": 'a "b" \\ c\nd',
        "BARE": "plain value",
        "EMPTY": "",
    }


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('A="1"\nORDERCTL_FUNCTION_KEY s3cr3t-value\n', "line 2 is not KEY="),
        ('ORDERCTL_FUNCTION_KEY="s3cr3t-value\n', "line 1: a quoted value is not closed"),
        ('ORDERCTL_FUNCTION_KEY="s3cr3t-value\\"\n', "line 1: a quoted value is not closed"),
        ('9KEY="s3cr3t-value"\n', "line 1 is not KEY="),
    ],
)
def test_a_bad_line_is_named_by_number_never_shown(text, problem):
    with pytest.raises(RemoteError) as refused:
        parse_azd_values(text, "values.env")
    assert problem in refused.value.message and "values.env" in refused.value.message
    assert "s3cr3t" not in refused.value.message


@pytest.mark.parametrize(
    ("values", "url"),
    [
        ({"AZURE_OPERATIONS_APP_NAME": "func-api-abc123"}, URL),
        ({"SERVICE_OPERATIONS_NAME": "func-api-abc123"}, URL),
        (OUTPUT_URL | {"AZURE_OPERATIONS_APP_NAME": "x"}, "https://ops.example.com/api/"),
        (OUTPUT_URL | {"ORDERCTL_API_URL": "https://mine.example.com"}, "https://mine.example.com"),
    ],
)
def test_the_function_app_url_comes_from_the_bicep_outputs(values, url):
    assert api_url_from_azd(values, "-") == url


def test_values_without_a_function_app_say_what_was_expected():
    # The pattern app's name is not the operator API's: it serves no HTTP.
    for values in (
        {"AZURE_ENV_NAME": "x"},
        {"AZURE_OPERATIONS_APP_NAME": "not a/name"},
        {"AZURE_FUNCTION_APP_NAME": "func-abc123"},
    ):
        with pytest.raises(RemoteError) as refused:
            api_url_from_azd(values, "-")
        assert "no operations app in stdin: expected AZURE_OPERATIONS_APP_NAME" in str(
            refused.value
        )


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("https://app.azurewebsites.net", "https://app.azurewebsites.net/api/"),
        ("https://app.azurewebsites.net/", "https://app.azurewebsites.net/api/"),
        ("http://127.0.0.1:7071/api", "http://127.0.0.1:7071/api/"),
        (" http://localhost:7071/api/ ", "http://localhost:7071/api/"),
        ("https://gw.example.com/ops/api", "https://gw.example.com/ops/api/"),
    ],
)
def test_api_urls_are_the_apis_base(given, url):
    assert normalize_api_url(given) == url


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("app.azurewebsites.net", "must be an http(s) URL"),
        ("ftp://app.example.com/api/", "must be an http(s) URL"),
        ("https://app.example.com/api/?code=s3cr3t", "without credentials, query or fragment"),
        ("https://u:s3cr3t@app.example.com/api/", "without credentials, query or fragment"),
    ],
)
def test_bad_api_urls_are_refused_without_echoing_secrets(given, problem):
    with pytest.raises(RemoteError) as refused:
        normalize_api_url(given)
    assert problem in refused.value.message and "s3cr3t" not in refused.value.message


def read(text: str) -> Callable[[str], str]:
    return lambda source: text


def test_options_and_the_environment_win_over_the_file():
    text = AZD + 'ORDERCTL_FUNCTION_KEY="from-file"\nORDERCTL_AUTH="entra"\n'
    config = resolve(RemoteOptions(azd_env="-"), read(text))
    assert config == RemoteConfig(URL, "from-file", "api://1111-2222/.default")
    chosen = resolve(
        RemoteOptions(api_url="https://other.example.com", function_key="given",
                      scope="api://x/.default", azd_env="-"),
        read(text),
    )  # fmt: skip
    assert chosen == RemoteConfig("https://other.example.com/api/", "given", "api://x/.default")
    assert "from-file" not in repr(config) and "given" not in repr(chosen)


def test_entra_needs_a_scope_and_auth_must_be_known():
    with pytest.raises(RemoteError, match="--entra needs the API's scope: --scope or ORDER"):
        resolve(RemoteOptions(api_url=URL, entra=True), read(""))
    with pytest.raises(RemoteError, match="ORDERCTL_AUTH must be key or entra"):
        resolve(RemoteOptions(api_url=URL, auth="password"), read(""))
    plain = resolve(RemoteOptions(api_url=URL, auth="KEY"), read(""))
    assert (plain.entra_scope, plain.credentials()) == (None, "no credentials")


def test_credentials_never_go_over_plain_http_but_to_this_machine():
    with pytest.raises(RemoteError, match="refusing to send a function key over plain http"):
        resolve(RemoteOptions(api_url="http://ops.example.com", function_key="k"), read(""))
    local = resolve(RemoteOptions(api_url="http://127.0.0.1:7071", function_key="k"), read(""))
    assert local.api_url == "http://127.0.0.1:7071/api/"
    bare = resolve(RemoteOptions(api_url="http://ops.example.com"), read(""))
    assert bare.function_key is None


# ---------------------------------------------------------------------------- the client


def test_the_remote_backend_offers_every_operation_the_cli_calls():
    """RemoteOperations accepts what the protocol declares, by name (the local backend's use
    cases: tests/unit/test_local_backend.py)."""
    wanted = {
        name: inspect.signature(member)
        for name, member in vars(OperatorBackend).items()
        if callable(member) and not name.startswith("_")
    }
    assert {"show_order", "bulk", "health", "close"} <= set(wanted)
    for name, signature in wanted.items():
        offered = inspect.signature(getattr(RemoteOperations, name)).parameters
        for parameter in signature.parameters.values():
            assert parameter.name in offered, (name, parameter.name)
            assert offered[parameter.name].kind == parameter.kind, name


class Recorder:
    """A MockTransport handler answering with ``answer(request)`` and keeping each request."""

    def __init__(self, answer: Callable[[httpx.Request], httpx.Response]) -> None:
        self.answer = answer
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.answer(request)


Answer = Callable[[httpx.Request], httpx.Response]


def client(
    answer: Answer, *, key: str | None = "k1", scope: str | None = None, credential=None
) -> tuple[RemoteOperations, Recorder]:
    recorder = Recorder(answer)
    config = RemoteConfig("https://app.example.com/api/", key, scope)
    ops = RemoteOperations(config, transport=httpx.MockTransport(recorder), credential=credential)
    return ops, recorder


def answering(status: int, body: object = None, **headers: str):
    def answer(request: httpx.Request) -> httpx.Response:
        if isinstance(body, bytes | str):
            return httpx.Response(status, content=body, headers=headers)
        return httpx.Response(status, json=body, headers=headers)

    return answer


async def test_path_parameters_are_percent_encoded_and_the_key_is_a_header():
    detail = (await Ops("x").show_order("o")).model_dump(mode="json")
    ops, seen = client(answering(200, detail))
    assert (await ops.show_order("a b/c?d#é")).model_dump(mode="json") == detail
    [request] = seen.requests
    assert request.url.raw_path.split(b"?")[0] == b"/api/orders/a%20b%2Fc%3Fd%23%C3%A9"
    assert request.headers["x-functions-key"] == "k1" and "code" not in str(request.url)
    assert "authorization" not in request.headers
    assert path("dead-letters", "orders", "replay") == "dead-letters/orders/replay"


async def test_queries_and_bodies_are_what_the_api_reads():
    page = (await Ops("x").list_alerts(limit=5)).model_dump(mode="json")
    ops, seen = client(answering(200, page))
    await ops.list_alerts(limit=5, open_only=True)
    assert dict(seen.requests[0].url.params) == {"limit": "5", "open": "true"}

    bulk = (await Ops("x").bulk("cancel", operator="o", reason="r", limit=1)).model_dump(
        mode="json"
    )
    ops, seen = client(answering(200, bulk))
    await ops.bulk(
        "cancel", operator="ignored", reason="r", step="charge_payment", order_ids=["o-1"]
    )
    [request] = seen.requests
    assert request.method == "POST" and request.url.path == "/api/bulk/cancel"
    assert json.loads(request.content) == {
        "reason": "r", "step": "charge_payment", "dry_run": False, "order_ids": ["o-1"],
        "limit": 100,
    }, "no operator: the API records who it authenticated"  # fmt: skip
    assert seconds(9.87654) == "9.877" and seconds(10.0) == "10" and seconds(-1) == "0"


async def test_an_entra_token_is_fetched_once_and_renewed_before_it_expires():
    fetched = []

    class Credential:
        async def get_token(self, scope):
            fetched.append(scope)
            expires = 0 if len(fetched) == 1 else 4_000_000_000  # the first one is stale
            return SimpleNamespace(token=f"t{len(fetched)}", expires_on=expires)

    health = {"status": "ok", "checks": []}
    ops, seen = client(answering(200, health), scope="api://a/.default", credential=Credential())
    for _ in range(3):
        await ops.health()
    assert fetched == ["api://a/.default"] * 2
    assert [r.headers["authorization"] for r in seen.requests] == ["Bearer t1", "Bearer t2",
                                                                   "Bearer t2"]  # fmt: skip
    assert all(r.headers["x-functions-key"] == "k1" for r in seen.requests)


async def test_no_token_is_one_line_saying_how_to_sign_in():
    from azure.core.exceptions import ClientAuthenticationError

    class Credential:
        async def get_token(self, scope):
            raise ClientAuthenticationError("DefaultAzureCredential failed\nline two\nthree")

    ops, seen = client(answering(200, {}), scope="api://a/.default", credential=Credential())
    with pytest.raises(RemoteError) as refused:
        await ops.health()
    assert refused.value.message.startswith(
        "no Entra token for api://a/.default: DefaultAzureCredential failed: sign in"
    )
    assert "\n" not in refused.value.message and seen.requests == []


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (400, "unknown_step", InvalidRequest),
        (404, "order_not_found", NotFound),
        (409, "wrong_state", Conflict),
        (503, "busy", Busy),
    ],
)
async def test_the_apis_refusals_are_the_operations_own(status, code, kind):
    ops, _ = client(answering(status, {"error": {"code": code, "message": "why"}}))
    with pytest.raises(kind) as refused:
        await ops.restart("o-1", step="s", operator="x", reason="r")
    assert (refused.value.code, refused.value.message) == (code, "why")


@pytest.mark.parametrize(
    ("status", "body", "headers", "exit_code", "says"),
    [
        (404, {"error": {"code": "not_found", "message": "no function serves /api/x"}}, {}, 2,
         "nothing at https://app.example.com/api/orders/o-1 (404): wrong --api-url"),
        (404, "<html>Not Found</html>", {}, 2, "or the app is not deployed there"),
        (500, {"error": {"code": "internal", "message": "the request failed on our side"}}, {},
         1, "the operator API failed at https://app.example.com/api/orders/o-1 (500 internal"),
        (502, "<html>Bad Gateway</html>", {}, 1, "(502): try again"),
        (503, "", {}, 1, "(503): try again"),
        (302, "", {"location": "https://login.microsoftonline.com/x"}, 2,
         "redirected to https://login.microsoftonline.com/x (302)"),
        (200, "<html>hello</html>", {}, 1, "did not answer with the operator API's OrderDetail"),
        (200, {"items": []}, {}, 1, "OrderDetail (order: Field required)"),
    ],
)  # fmt: skip
async def test_answers_that_are_not_the_apis_are_one_line_saying_what_to_check(
    status, body, headers, exit_code, says
):
    ops, _ = client(answering(status, body, **headers))
    with pytest.raises(RemoteError) as failed:
        await ops.show_order("o-1")
    assert says in failed.value.message and failed.value.exit_code == exit_code
    assert "\n" not in failed.value.message and "k1" not in failed.value.message


@pytest.mark.parametrize(
    ("key", "scope", "status", "body", "says"),
    [
        (None, None, 401, "", "the operator API wants a function key (401): pass --function-key"),
        ("k1", None, 401, "", "the operator API refused the function key (401)"),
        ("k1", "api://a/.default", 401, "", "refused the function key, or the Entra token"),
        ("k1", None, 401, {"error": {"code": "not_signed_in", "message": "no caller"}},
         "add --entra (ORDERCTL_AUTH=entra)"),
        ("k1", "api://a/.default", 401,
         {"error": {"code": "not_signed_in", "message": "no caller"}},
         "turn on App Service Authentication"),
        ("k1", None, 403, "", "(403): App Service Authentication may require"),
        ("k1", "api://a/.default", 403, "", "refused the Entra token (403): check --scope"),
    ],
)  # fmt: skip
async def test_auth_failures_say_which_credential_to_send(key, scope, status, body, says):
    async def get_token(scope: str) -> SimpleNamespace:
        return SimpleNamespace(token="tk-s3cr3t", expires_on=4_000_000_000)

    credential = SimpleNamespace(get_token=get_token)
    ops, _ = client(answering(status, body), key=key, scope=scope, credential=credential)
    with pytest.raises(RemoteError) as refused:
        await ops.resubmit("o-1", operator="x", reason="r")
    assert says in refused.value.message and refused.value.exit_code == 2
    assert "s3cr3t" not in refused.value.message and "k1" not in refused.value.message


async def test_health_reads_the_failing_view_from_a_503():
    failing = {"status": "failing", "checks": [
        {"name": "servicebus", "ok": False, "detail": "down", "duration_ms": 3.0}]}  # fmt: skip
    ops, _ = client(answering(503, failing))
    assert (await ops.health()).status == "failing"
    ops, _ = client(answering(503, "<html>Service Unavailable</html>"))
    with pytest.raises(RemoteError, match=r"\(503\): try again"):
        await ops.health()


@pytest.mark.parametrize(
    ("error", "exit_code", "says"),
    [
        (httpx.ConnectError("[Errno 111] Connection refused"), 1,
         "cannot reach the operator API at https://app.example.com/api/supervisor ([Errno 111] "
         "Connection refused): check --api-url"),
        (httpx.ReadTimeout("timed out"), 1, "did not answer in time (ReadTimeout)"),
    ],
)  # fmt: skip
async def test_no_answer_is_one_line_saying_what_to_check(error, exit_code, says):
    def fail(request):
        raise error

    ops, _ = client(fail)
    with pytest.raises(RemoteError) as failed:
        await ops.supervisor()
    assert says in failed.value.message and failed.value.exit_code == exit_code
