"""Entity group transactions as the Table service's ``multipart/mixed`` body, and its answer.

Built and read as text: azure-core prepares a batch by running each operation through its
pipeline on a thread pool and the ``email`` package, about 5 ms of CPU per transaction here,
which was the largest single cost of an order (docs/performance.md).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

_CRLF: Final = "\r\n"


@dataclass(frozen=True)
class Operation:
    verb: str
    url: str
    body: dict[str, Any] | None = None
    if_match: str | None = None


@dataclass
class Part:
    """One operation's answer: its status, headers (lower-case names) and body text."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""


def build(operations: Iterable[Operation]) -> tuple[str, bytes]:
    """(the batch's boundary, its body) for one change set holding ``operations``."""
    batch, changeset = f"batch_{uuid.uuid4()}", f"changeset_{uuid.uuid4()}"
    lines = [f"--{batch}", f"Content-Type: multipart/mixed; boundary={changeset}", ""]
    for op in operations:
        lines += [
            f"--{changeset}",
            "Content-Type: application/http",
            "Content-Transfer-Encoding: binary",
            "",
            f"{op.verb} {op.url} HTTP/1.1",
            "Accept: application/json;odata=minimalmetadata",
            "DataServiceVersion: 3.0",
        ]
        if op.if_match is not None:
            lines.append(f"If-Match: {op.if_match}")
        if op.body is None:
            lines += ["", ""]
            continue
        lines += [
            "Content-Type: application/json",
            "Prefer: return-no-content",
            "",
            json.dumps(op.body, separators=(",", ":"), ensure_ascii=False),
        ]
    lines += [f"--{changeset}--", f"--{batch}--", ""]
    return batch, _CRLF.join(lines).encode()


def parse(text: str) -> list[Part]:
    """The answers in a batch response, in order. A failed transaction answers with one part:
    the failing operation's status and error (its message starts ``<index>:``)."""
    parts: list[Part] = []
    current: Part | None = None
    in_headers = False
    body: list[str] = []
    for line in text.replace(_CRLF, "\n").split("\n"):
        if line.startswith("HTTP/1.1 "):
            current = Part(int(line.split(" ", 2)[1]))
            parts.append(current)
            in_headers, body = True, []
        elif current is None:
            continue
        elif in_headers:
            if line == "":
                in_headers = False
            else:
                name, _, value = line.partition(":")
                current.headers[name.strip().lower()] = value.strip()
        elif line.startswith("--"):
            current.body = "\n".join(body).strip()
            current = None
        else:
            body.append(line)
    return parts
