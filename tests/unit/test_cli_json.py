"""Every `orderctl` command takes --json and prints one document of its documented shape."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from devstack.stack.processes import REPO_ROOT
from orderctl import cli
from orderctl.output import reference, shapes, validate
from tests.unit.cli_views import fake_running_stack, use_ops

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(cli.app, list(args), catch_exceptions=False)


def command_names() -> list[str]:
    return sorted(c.name or c.callback.__name__ for c in cli.app.registered_commands)


def test_every_command_has_json_and_a_documented_shape():
    names = command_names()
    assert sorted(shapes()) == names
    for command in cli.app.registered_commands:
        name = command.name or command.callback.__name__
        result = invoke(name, "--help")
        assert "--json" in result.output, name


def test_the_help_lists_every_command_where_command_order_puts_it():
    import typer
    from typer.main import get_command

    from orderctl.app import COMMAND_ORDER, SafeGroup

    group = get_command(cli.app)
    assert isinstance(group, SafeGroup)
    assert group.list_commands(typer.Context(group)) == list(COMMAND_ORDER)


def test_docs_hold_the_current_reference():
    docs = (REPO_ROOT / "docs" / "orderctl.md").read_text()
    assert reference().strip() in docs, "regenerate: python -m orderctl.output"


def one_document(command: str, result) -> dict:
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)  # one document, nothing else on stdout
    value = validate(command, document)
    if hasattr(value, "model_dump"):  # stable: no field is dropped or renamed on the way
        assert value.model_dump(mode="json") == document
    return document


OPERATOR_COMMANDS = [
    ("status", ["order-7"]),
    ("orders", ["Error"]),
    ("orders", ["Processed", "--text", "x", "--sort", "-created", "--older-than", "1h"]),
    ("alerts", []),
    ("alerts", ["--open"]),
    ("ack", ["1", "--operator", "ann"]),
    ("resubmit", ["order-7", "--reason", "fixed"]),
    ("resubmit", ["--state", "Error", "--dry-run"]),
    ("resubmit", ["--text", "declined", "--reason", "fixed", "--yes"]),
    ("cancel", ["order-7", "--reason", "no"]),
    ("cancel", ["--step", "charge_payment", "--reason", "no", "--yes"]),
    ("restart", ["order-7", "--from", "charge_payment", "--reason", "again"]),
    ("health", []),
    ("dead-letters", ["replay", "orders", "1", "--dry-run"]),
    ("dead-letters", ["purge", "orders", "--all", "--yes"]),
    ("supervisor", []),
    ("purge", ["--older-than", "7"]),
    ("purges", []),
    ("dead-letter-log", []),
    ("dead-letter-log", ["--limit", "5"]),
    ("archived", ["order-7"]),
    ("dead-letters", []),
    ("dead-letters", ["orders"]),
]


@pytest.mark.parametrize(("command", "args"), OPERATOR_COMMANDS)
def test_operator_commands_print_their_shape(monkeypatch, command, args):
    use_ops(monkeypatch, "stored text")
    one_document(command, invoke(command, *args, "--json"))


def test_dead_letters_prints_a_summary_or_a_page(monkeypatch):
    use_ops(monkeypatch, "x")
    summary = one_document("dead-letters", invoke("dead-letters", "--json"))
    page = one_document("dead-letters", invoke("dead-letters", "orders", "--json"))
    assert "queues" in summary and page["queue"] == "orders"


def test_status_watch_prints_json_lines_of_its_documented_shape(monkeypatch):
    use_ops(monkeypatch, "stored text")
    result = invoke("status", "order-7", "--watch", "--json")
    assert result.exit_code == 3, result.output  # the order ended in Error
    for line in result.stdout.splitlines():
        document = json.loads(line)
        assert validate("status", document).model_dump(mode="json") == document


def test_stack_commands_print_their_shape(monkeypatch, tmp_path):
    stopped = one_document("ps", invoke("ps", "--json", "--workdir", str(tmp_path)))
    assert stopped["running"] is False and stopped["components"] == []
    nothing = one_document("down", invoke("down", "--json", "--workdir", str(tmp_path)))
    assert nothing == {"workdir": str(tmp_path.resolve()), "was_running": False, "stopped": {}}

    fake_running_stack(tmp_path)
    view = one_document("ps", invoke("ps", "--json", "--workdir", str(tmp_path)))
    assert view["api_url"] == "http://127.0.0.1:7071/api/"
    assert [c["name"] for c in view["components"]] == ["azurite", "host-0"]
    assert view["components"][1]["restarts"] == 2
    again = one_document("up", invoke("up", "--detach", "--json", "--workdir", str(tmp_path)))
    assert again["already_running"] is True

    from devstack import orders

    sent = []

    async def send_orders(settings, batch):
        sent.extend(batch)

    monkeypatch.setattr(orders, "send_orders", send_orders)
    args = ["submit", "--order-id", "o-1", "--item", "SKU-1:2:150", "--json"]
    submitted = one_document("submit", invoke(*args, "--workdir", str(tmp_path)))
    assert submitted == {"order_id": "o-1", "workflow": "order", "total_cents": 300,
                         "currency": "EUR", "state": None, "waited_s": None,
                         "order": None}  # fmt: skip
    assert [o.order_id for o in sent] == ["o-1"]


def test_demo_json_to_stdout(monkeypatch, tmp_path):
    from orderctl import demo

    class FakeDemo:
        def __init__(self, **options):
            self.console = options["console"]

        async def run(self):
            self.console.print("live view")  # the live view goes to stderr
            return demo.Summary(orders=2, profile="clean", workflow="order", hosts=1,
                                processed=2)  # fmt: skip

    monkeypatch.setattr(demo, "Demo", FakeDemo)
    result = invoke("demo", "--profile", "clean", "--json", "-", "--workdir", str(tmp_path))
    document = one_document("demo", result)
    assert document["processed"] == 2 and "live view" not in result.stdout


def test_a_failure_with_json_is_one_line_on_stderr_and_an_error_document(tmp_path):
    result = invoke("status", "order-1", "--json", "--workdir", str(tmp_path))
    assert result.exit_code == 2
    assert json.loads(result.stdout) == {"error": json.loads(result.stdout)["error"],
                                         "exit_code": 2}  # fmt: skip
    assert "no running stack" in json.loads(result.stdout)["error"]
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("error: no running stack")


def test_an_unexpected_error_is_one_line_unless_debug(monkeypatch):
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def operations(workdir):
        raise KeyError("the broken thing")
        yield

    monkeypatch.setattr("orderctl.connection.operations", operations)
    result = runner.invoke(cli.app, ["supervisor"])
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: KeyError: 'the broken thing' (rerun with --debug for the traceback)"
    )
    assert "Traceback" not in result.output
    debug = runner.invoke(cli.app, ["--debug", "supervisor"])
    assert isinstance(debug.exception, KeyError)


def test_version_and_completion():
    result = invoke("--version")
    assert result.exit_code == 0
    assert re.fullmatch(r"orderctl \S+ \(Python 3\.\d+\.\d+\)\n", result.stdout)
    assert "--install-completion" in invoke("--help").output


def test_invalid_orders_are_one_line_not_a_pydantic_dump(tmp_path):
    fake_running_stack(tmp_path)
    result = invoke("submit", "--order-id", "x' or 1", "--workdir", str(tmp_path))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the order is not valid: order_id")
    assert "pydantic" not in result.stderr and "For further information" not in result.stderr


def test_reference_lists_every_field_of_every_shape():
    text = reference()
    for command, options in shapes().items():
        assert f"### `orderctl {command} --json`" in text
        for shape in options:
            fields = getattr(shape, "model_fields", None) or shape.__dataclass_fields__
            for field in fields:
                assert f"- `{field}` (" in text, (command, field)


def test_docs_name_every_command():
    docs = Path(REPO_ROOT / "docs" / "orderctl.md").read_text()
    for name in command_names():
        assert f"orderctl {name}" in docs
