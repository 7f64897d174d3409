"""Generate the app's synchronous I/O shell from its asynchronous source.

The hot path (the Scheduler's and the Agents' Service Bus triggers) runs as ``async def`` on one
event loop, on ``azure.servicebus.aio``, an asyncio Table client and ``httpx.AsyncClient``. The
Supervisor, the operator API, the purge, the CLI and most tests call the same code
synchronously. Both are one source: each module of an ``aio`` package (:func:`sources`) is
written once, async, and its sync twin is generated from it here, the way httpcore does
(``unasync``): ``async``/``await`` dropped, ``.aio`` dropped from dotted names (``core.aio.bus``
is ``core.bus``, ``azure.servicebus.aio`` is ``azure.servicebus``), and a few async names
mapped to their sync peers (:data:`NAMES`). Strings and comments are left alone.

    python -m devstack.unasync          # write the sync modules
    python -m devstack.unasync --check  # exit 1 naming each one that is not current

tests/unit/test_unasync.py runs the check, so an edit to a generated file, or to a source
without running this, fails the tests.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PACKAGES: tuple[str, ...] = ("core", "agent", "scheduler")
"""Where ``aio`` packages are looked for."""

HAND_WRITTEN: frozenset[str] = frozenset({"core/aio/primitives.py", "core/aio/http11.py"})
"""Modules under ``aio`` written in both forms by hand (what waits, and the socket I/O)."""


def sources() -> list[str]:
    """The async sources, relative to the repository: every module of an ``aio`` package but
    its ``__init__`` and :data:`HAND_WRITTEN`; each generates its path without ``aio/``."""
    found = (
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("aio/*.py")
    )
    return sorted(p for p in found if not p.endswith("/__init__.py") and p not in HAND_WRITTEN)


NAMES: dict[str, str] = {
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "StopAsyncIteration": "StopIteration",
    "AsyncIterator": "Iterator",
    "AsyncIterable": "Iterable",
    "AsyncGenerator": "Generator",
    "AbstractAsyncContextManager": "AbstractContextManager",
    "asynccontextmanager": "contextmanager",
    "AsyncExitStack": "ExitStack",
    "AsyncClient": "Client",
    "AsyncBaseTransport": "BaseTransport",
    "PooledAsyncTransport": "PooledTransport",
    "AsyncRetrying": "Retrying",
    "handle_async_request": "handle_request",
    "aclose": "close",
    "aread": "read",
    "aiter_bytes": "iter_bytes",
}
"""Async names and the sync names that take their place (whole NAME tokens only)."""

_DROPPED_KEYWORDS = frozenset({"async", "await"})


def header(source: str) -> str:
    return f"# Generated from {source} by devstack.unasync: edit that, not this.\n"


def target_of(source: str) -> str:
    parts = Path(source).parts
    if "aio" not in parts:
        raise ValueError(f"{source} is not under an aio package")
    index = parts.index("aio")
    return str(Path(*parts[:index], *parts[index + 1 :]))


def unasync_text(text: str) -> str:
    """``text`` (async Python) as its sync twin; formatting kept, except where tokens drop."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    row, col = 1, 0
    skip_gap = False
    for i, tok in enumerate(tokens):
        gap = _between(lines, (row, col), tok.start)
        if not skip_gap or "\n" in gap:  # the space after a dropped keyword goes with it
            out.append(gap)
        skip_gap = False
        row, col = tok.end
        if tok.type == tokenize.NAME and tok.string in _DROPPED_KEYWORDS:
            skip_gap = True
            continue
        if tok.type == tokenize.OP and tok.string == "." and _next_is_aio(tokens, i):
            continue
        if tok.type == tokenize.NAME and tok.string == "aio" and _previous_is_dot(tokens, i):
            continue
        if tok.type == tokenize.NAME:
            out.append(NAMES.get(tok.string, tok.string))
        else:
            out.append(tok.string)
    return "".join(out)


def _next_is_aio(tokens: list[tokenize.TokenInfo], i: int) -> bool:
    nxt = tokens[i + 1] if i + 1 < len(tokens) else None
    return nxt is not None and nxt.type == tokenize.NAME and nxt.string == "aio"


def _previous_is_dot(tokens: list[tokenize.TokenInfo], i: int) -> bool:
    return i > 0 and tokens[i - 1].type == tokenize.OP and tokens[i - 1].string == "."


def _between(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> str:
    """The source text from ``start`` to ``end`` (rows from 1), as tokenize counts them."""
    (r0, c0), (r1, c1) = start, end
    if r0 > len(lines):
        return ""
    if r0 == r1:
        return lines[r0 - 1][c0:c1]
    parts = [lines[r0 - 1][c0:]]
    parts.extend(lines[r0 : r1 - 1])
    if r1 <= len(lines):
        parts.append(lines[r1 - 1][:c1])
    return "".join(parts)


def generate(source: str) -> str:
    """The sync module ``source`` generates: header and text, its imports sorted and the whole
    formatted as ruff does (dropping ``.aio`` can make two imports of one module, dropping
    ``await`` can leave a call that fits on one line)."""
    text = (ROOT / source).read_text()
    synced = header(source) + unasync_text(text)
    target = str(ROOT / target_of(source))
    sorted_ = _ruff(
        ["check", "--quiet", "--select", "I", "--fix-only", "--exit-zero"], synced, target
    )
    return _ruff(["format", "--quiet"], sorted_, target)


def _ruff(command: list[str], text: str, filename: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "--stdin-filename", filename, "-"],
        input=text, capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"ruff {command[0]} failed on {filename}: {done.stderr}")
    return done.stdout


def stale() -> Iterator[str]:
    """The generated modules that differ from what their sources generate now."""
    for source in sources():
        target = ROOT / target_of(source)
        if not target.exists() or target.read_text() != generate(source):
            yield target_of(source)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        behind = list(stale())
        for path in behind:
            print(f"{path} is not what its async source generates: run python -m devstack.unasync")
        return 1 if behind else 0
    if args:
        print("usage: python -m devstack.unasync [--check]", file=sys.stderr)
        return 2
    for source in sources():
        target = ROOT / target_of(source)
        text = generate(source)
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote {target_of(source)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
