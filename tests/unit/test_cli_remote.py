"""`orderctl` in remote mode prints what it prints in process, for every operator command.

The operations app (the operator API's FastAPI behind one HTTP function) runs on a local
functions host, over operations that return the views of tests/unit/cli_views.py (stored text
full of markup and control characters); the same commands run in process over those same views.
Tables and
--json documents must be identical. Then: the credentials a deployed app asks for (a stand-in
for the Functions host's key check), `azd env get-values` output as the configuration, and
the commands that only work on the local stack.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from fastapi import FastAPI
from rich.console import Console
from typer.testing import CliRunner

import operations_app
from devstack.host import LocalHost
from operator_api.http import context
from orderctl import cli
from orderctl.local import USE_CASES
from tests.support.operations import load
from tests.unit.cli_views import Ops, use_ops
from tests.unit.test_cli_hostile_text import CONTROL, MARKUP
from tests.unit.test_cli_json import OPERATOR_COMMANDS

runner = CliRunner()
STORED = f"{MARKUP} {CONTROL}"
WIDTH = 160
KEY = "right-key-s3cr3t"
HEALTHY = {"name": "table", "ok": True, "detail": "fine", "duration_ms": 1.0}
ENV = ("ORDERCTL_API_URL", "ORDERCTL_FUNCTION_KEY", "ORDERCTL_AUTH", "ORDERCTL_SCOPE")


class Served(Ops):
    """cli_views.Ops taking every parameter the HTTP functions pass."""

    async def show_order(self, order_id, **_):
        return await super().show_order(order_id)

    async def list_alerts(self, *, limit, open_only=False, continuation=None):
        return await super().list_alerts(limit=limit, open_only=open_only)

    async def dead_letter_summary(self, **_):
        return await super().dead_letter_summary()

    async def list_dead_letters(self, queue, **_):
        return await super().list_dead_letters(queue)


def serve(patch: pytest.MonkeyPatch, ops: Ops, app: FastAPI) -> None:
    """The use cases the routes call answer as ``ops``' methods of the same names (with no
    context: FastAPI's override of the routes' ``context`` dependency gives None)."""

    async def no_context() -> None:
        return None

    async def answer(name: str, ctx: None, *args: Any, **options: Any) -> Any:
        return await getattr(ops, name)(*args, **options)

    patch.setitem(app.dependency_overrides, context, no_context)
    for use_case in USE_CASES:
        module = sys.modules[use_case.__module__]
        patch.setattr(module, use_case.__name__, functools.partial(answer, use_case.__name__))


@pytest.fixture(autouse=True)
def no_remote_environment(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def served_api() -> FastAPI:
    """The operator API the ``api_url`` host serves."""
    return load().api


@pytest.fixture(scope="module")
def api_url(served_api: FastAPI) -> Iterator[str]:
    """The operator HTTP API on a local functions host, over Served views."""
    with pytest.MonkeyPatch.context() as patch:
        serve(patch, Served(STORED), served_api)
        host = LocalHost(operations_app.serve(served_api),
                         settings={"DEVHOST_PRINCIPAL_NAME": "ann"},
                         host_json=None, http_port=0)  # fmt: skip
        host.start()
        try:
            yield host.http.base_url
        finally:
            host.stop(timeout=2)


def invoke(*args: str, input: str | None = None, env: dict[str, str] | None = None):
    return runner.invoke(cli.app, list(args), input=input, env=env, catch_exceptions=False)


def in_process(monkeypatch, *args: str):
    with monkeypatch.context() as patch:
        use_ops(patch, STORED, width=WIDTH)
        return invoke(*args)


def remote(monkeypatch, url: str, *args: str, **options):
    monkeypatch.setattr("orderctl.app.console", Console(width=WIDTH))
    return invoke("--api-url", url, *args, **options)


@pytest.mark.parametrize("json_out", [False, True], ids=["people", "json"])
@pytest.mark.parametrize(("command", "args"), OPERATOR_COMMANDS)
def test_every_operator_command_prints_the_same_remotely(
    monkeypatch, api_url, command, args, json_out
):
    argv = [command, *args, *(["--json"] if json_out else [])]
    local = in_process(monkeypatch, *argv)
    over_http = remote(monkeypatch, api_url, *argv)
    assert local.exit_code == 0, local.output
    assert over_http.exit_code == 0, over_http.output
    assert over_http.stdout == local.stdout
    if json_out:
        json.loads(over_http.stdout)


def test_status_watch_follows_over_http_the_same_way(monkeypatch, api_url):
    local = in_process(monkeypatch, "status", "order-7", "--watch", "--json")
    over_http = remote(monkeypatch, api_url, "status", "order-7", "--watch", "--json")
    assert (local.exit_code, over_http.exit_code) == (3, 3), "the order ended in Error"
    assert over_http.stdout == local.stdout


def test_a_bulk_action_asks_before_acting_over_http(monkeypatch, api_url):
    refused = remote(monkeypatch, api_url, "cancel", "--text", "x", "--reason", "r", input="n\n")
    assert refused.exit_code == 1 and "cancel these 1 order(s)?" in refused.stderr
    assert "would_cancel" in refused.stdout and "not confirmed" in refused.stderr


def test_the_operator_is_the_one_the_api_authenticated(monkeypatch, api_url, served_api):
    calls = []
    served = Served(STORED)
    monkeypatch.setattr(served, "resubmit", lambda order_id, **o: calls.append(o) or
                        Ops.resubmit(served, order_id, **o))  # fmt: skip
    serve(monkeypatch, served, served_api)
    result = remote(monkeypatch, api_url, "resubmit", "o-1", "--reason", "r", "--operator", "x")
    assert result.exit_code == 0, result.output
    assert calls == [{"operator": "ann", "reason": "r"}]


# ------------------------------------------------------------------------- credentials


class KeyedHost(BaseHTTPRequestHandler):
    """Like the Functions host: 401 with no body unless the right x-functions-key."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        KeyedHost.seen.append(dict(self.headers))
        if self.headers.get("x-functions-key") != KEY:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"status": "ok", "checks": [HEALTHY]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def keyed() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), KeyedHost)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    KeyedHost.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("options", "env", "says"),
    [
        ([], {}, "error: the operator API wants a function key (401): pass --function-key or "
                 "set ORDERCTL_FUNCTION_KEY"),
        (["--function-key", "wrong-s3cr3t"], {},
         "error: the operator API refused the function key (401): use a key of this app"),
        ([], {"ORDERCTL_FUNCTION_KEY": "wrong-s3cr3t"}, "refused the function key (401)"),
    ],
)  # fmt: skip
def test_a_missing_or_wrong_key_is_one_line_and_exit_2(keyed, options, env, says):
    for json_out in ([], ["--json"]):
        result = invoke("--api-url", keyed, *options, "health", *json_out, env=env)
        assert result.exit_code == 2
        [line] = result.stderr.strip().splitlines()
        assert line.startswith("error: ") and says in line
        assert "s3cr3t" not in result.output
    if json_out:
        assert json.loads(result.stdout)["exit_code"] == 2


def test_the_right_key_from_the_environment_is_sent_as_a_header(keyed):
    result = invoke("--api-url", keyed, "health", env={"ORDERCTL_FUNCTION_KEY": KEY})
    assert result.exit_code == 0, result.output
    assert "table" in result.stdout and KEY not in result.output
    assert KeyedHost.seen[-1]["x-functions-key"] == KEY
    debug = invoke("--debug", "--api-url", keyed, "health", env={"ORDERCTL_FUNCTION_KEY": "x"})
    assert debug.exit_code == 2 and "Traceback" not in debug.output


def test_help_never_shows_a_key_from_the_environment():
    result = invoke("--help", env={"ORDERCTL_FUNCTION_KEY": KEY, "COLUMNS": "200"})
    assert result.exit_code == 0 and "ORDERCTL_FUNCTION_KEY" in result.stdout
    assert KEY not in result.stdout


def test_no_api_there_is_one_line_saying_what_to_check():
    result = invoke("--api-url", "http://127.0.0.1:9/api/", "supervisor")
    assert result.exit_code == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: cannot reach the operator API at http://127.0.0.1:9/api/")
    assert "check --api-url (ORDERCTL_API_URL)" in line


# ------------------------------------------------------------------------- azd env values


def test_azd_env_values_from_a_file_or_stdin_configure_it(monkeypatch, api_url, tmp_path):
    values = f'AZURE_ENV_NAME="dev"\nAZURE_FUNCTION_APP_NAME="x"\nORDERCTL_API_URL="{api_url}"\n'
    (tmp_path / "values.env").write_text(values)
    monkeypatch.setattr("orderctl.app.console", Console(width=WIDTH))
    from_file = invoke("--azd-env", str(tmp_path / "values.env"), "supervisor", "--json")
    assert from_file.exit_code == 0, from_file.output
    from_stdin = invoke("--azd-env", "-", "supervisor", "--json", input=values)
    assert from_stdin.stdout == from_file.stdout
    assert json.loads(from_file.stdout)["buckets"][0]["holder"] == STORED


def test_bad_azd_env_input_is_one_line(tmp_path):
    missing = invoke("--azd-env", str(tmp_path / "nothing.env"), "health")
    assert missing.exit_code == 2
    assert missing.stderr.strip().endswith("nothing.env: No such file or directory")
    nameless = invoke("--azd-env", "-", "health", input='AZURE_ENV_NAME="dev"\n')
    assert nameless.exit_code == 2
    assert "no operations app in stdin: expected AZURE_OPERATIONS_APP_NAME" in nameless.stderr
    bad = invoke("--azd-env", "-", "health", "--json", input="ORDERCTL_FUNCTION_KEY s3cr3t\n")
    assert bad.exit_code == 2 and "s3cr3t" not in bad.output
    assert json.loads(bad.stdout)["error"] == 'stdin line 1 is not KEY="value" (azd env get-values)'


# ------------------------------------------------------------------------- local only


@pytest.mark.parametrize(
    "args",
    [["submit"], ["fault"], ["workflows"], ["migrate", "--from", "order@1", "--to", "order@2",
                                            "--reason", "r"]],
)  # fmt: skip
def test_commands_of_the_local_stack_are_refused_in_remote_mode(args, tmp_path):
    result = invoke("--api-url", "http://127.0.0.1:9/api/", *args, "--workdir", str(tmp_path))
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: `orderctl {args[0]}` works on the local stack only (the operator HTTP API does "
        "not serve it): run it without --api-url/--azd-env, and ORDERCTL_API_URL unset"
    )


def test_stack_commands_and_pure_ones_still_work_in_remote_mode(tmp_path):
    where = ["--workdir", str(tmp_path)]
    assert invoke("--api-url", "http://127.0.0.1:9", "ps", *where).exit_code == 0
    diff = invoke("--api-url", "http://127.0.0.1:9", "workflow-diff", "order@1", "order@2")
    assert diff.exit_code == 0 and "order@1 → order@2" in diff.stdout
