"""Stored text that looks like markup, emoji codes or terminal control, or is very long, is
printed as it is by every command that shows stored data: never interpreted, never a crash.
Control characters are shown as escapes (they must not drive the terminal); --json carries
the exact text."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from orderctl import cli
from orderctl.app import fail
from orderctl.plain_text import printable
from tests.unit.cli_views import use_ops

runner = CliRunner()

MARKUP = "[bold red]boom[/] [/ticket 42] [link=https://x.test]y[/link] \\[x] [ :smile: :thumbs_up:"
CONTROL = "bell\x07 esc\x1b[31mred\x1b[0m cr\r nul\x00 tab\t nl\nnext \x9b c1 \u202eevil"
LONG = "L" * 10_240
HOSTILE = f"{MARKUP} {CONTROL} {LONG}"

COMMANDS = [
    ("status", ["order-7"], True),
    ("status", ["order-7", "--watch"], True),
    ("orders", ["Error"], True),
    ("orders", ["Processed", "--sort", "-created"], True),
    ("alerts", [], True),
    ("alerts", ["--open"], True),
    ("ack", ["1"], True),
    ("resubmit", ["order-7", "--reason", "r"], True),
    ("cancel", ["order-7", "--reason", "r"], True),
    ("restart", ["order-7", "--from", "charge_payment", "--reason", "r"], True),
    ("resubmit", ["--state", "Error", "--dry-run"], True),
    ("cancel", ["--text", "x", "--reason", "r", "--yes"], True),
    ("dead-letters", ["replay", "orders", "--all", "--dry-run"], True),
    ("dead-letters", ["purge", "orders", "1", "--yes"], True),
    ("health", [], True),
    ("supervisor", [], True),
    ("purge", [], True),
    ("purges", [], True),
    ("archived", ["order-7"], True),
    ("dead-letters", ["orders"], True),
]


def invoke(*args: str):
    return runner.invoke(cli.app, list(args), catch_exceptions=False)


def strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*strings(k), *strings(v))]
    if isinstance(value, list):
        return [s for item in value for s in strings(item)]
    return []


def test_printable_escapes_only_control_characters():
    assert printable(MARKUP) == MARKUP
    assert printable("a\x1b[0mb\nc\u202e") == "a\\x1b[0mb\\x0ac\\u202e"
    assert printable("émoji ✓ 日本") == "émoji ✓ 日本"


def succeeded(command: str, args: list[str], result) -> None:
    # Following an order exits with its end state: the views' order is in Error (3).
    expected = 3 if "--watch" in args else 0
    assert result.exit_code == expected, result.output[:2000]


@pytest.mark.parametrize(("command", "args", "shows_stored_text"), COMMANDS)
def test_wide_output_shows_stored_text_verbatim(monkeypatch, command, args, shows_stored_text):
    use_ops(monkeypatch, HOSTILE)
    result = invoke(command, *args, "--wide")
    succeeded(command, args, result)
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout and "\r" not in result.stdout
    assert "\u202e" not in result.stdout
    if shows_stored_text:
        assert printable(HOSTILE) in result.stdout  # one line, nothing cut or interpreted
        assert "👍" not in result.stdout and "😄" not in result.stdout


@pytest.mark.parametrize(("command", "args", "shows_stored_text"), COMMANDS)
def test_narrow_output_cuts_long_text_but_never_interprets_it(
    monkeypatch, command, args, shows_stored_text
):
    use_ops(monkeypatch, HOSTILE, width=100)
    result = invoke(command, *args)
    succeeded(command, args, result)
    assert "\x1b" not in result.stdout and "👍" not in result.stdout
    if shows_stored_text:
        assert "[bold" in result.stdout  # the cell starts with the markup, left as text


@pytest.mark.parametrize(("command", "args", "shows_stored_text"), COMMANDS)
def test_json_carries_the_exact_text(monkeypatch, command, args, shows_stored_text):
    use_ops(monkeypatch, HOSTILE)
    result = invoke(command, *args, "--json")
    succeeded(command, args, result)
    for line in result.stdout.splitlines() if "--watch" in args else [result.stdout]:
        assert HOSTILE in strings(json.loads(line))


def test_a_hostile_error_message_stays_one_escaped_line(monkeypatch):
    from contextlib import asynccontextmanager

    from service.operations.errors import OperatorError

    @asynccontextmanager
    async def operations(workdir):
        try:
            yield None
        except AttributeError:
            raise fail(f"{OperatorError('x', HOSTILE).message}", 2) from None

    monkeypatch.setattr("orderctl.connection.operations", operations)
    result = runner.invoke(cli.app, ["status", "o-1"])
    assert result.exit_code == 2
    assert "\x1b" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert MARKUP in result.stderr
