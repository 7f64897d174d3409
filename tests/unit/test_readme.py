"""The README stays a map (at most 100 lines) and its two commands stay true: each is a script
of the repository, and CI (.ci/run) runs the very test command the README gives."""

from __future__ import annotations

import os
import re
import shlex

from devstack.stack.processes import REPO_ROOT

README = REPO_ROOT / "README.md"
MAX_LINES = 100


def readme_commands() -> dict[str, str]:
    """The first ``sh`` block of the README: each command, by what its comment says it does."""
    block = re.search(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert block, "README.md has no ```sh block with its commands"
    lines = [line.split("#", 1) for line in block[1].splitlines() if line.strip()]
    return {comment.strip(): command.strip() for command, comment in lines}


def test_the_readme_is_a_map() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, (
        f"README.md has {lines} lines; keep it at most {MAX_LINES} and move details to docs/"
    )


def test_the_readme_gives_two_commands_that_exist() -> None:
    commands = readme_commands()
    assert len(commands) == 2, f"README.md's commands: {commands}"
    for command in commands.values():
        script = REPO_ROOT / shlex.split(command)[0]
        assert script.is_file() and os.access(script, os.X_OK), f"{command}: no such script"


def test_ci_runs_the_test_command_the_readme_gives() -> None:
    (test_command,) = [cmd for what, cmd in readme_commands().items() if "test" in what]
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    last = [line.strip() for line in ci.splitlines() if line.strip()][-1]
    expected = ["exec", *shlex.split(test_command)]
    assert shlex.split(last)[: len(expected)] == expected, (
        f".ci/run ends with {last!r}, not with the README's test command {test_command!r}"
    )
