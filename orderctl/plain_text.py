"""Stored text shown to people, safely: reasons, errors, alert and dead-letter bodies and
operator names are printed as :class:`rich.text.Text`, never parsed as markup or emoji codes,
with control characters shown as escapes (``\\x1b``) so stored text cannot move the cursor or
recolour the terminal; and URLs joined without ``//``.
"""

from __future__ import annotations

import re

from rich.text import Text


def join_url(base: str, *parts: str) -> str:
    """``base`` and ``parts`` joined with exactly one ``/`` between each: never ``//`` in a
    path, whatever slashes each piece ends or starts with."""
    pieces = [base.rstrip("/")] + [p.strip("/") for p in parts if p.strip("/")]
    joined = "/".join(pieces)
    return joined + "/" if parts and parts[-1].endswith("/") else joined


_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(value: object) -> str:
    """``value`` as text, with control characters (C0, DEL, C1, line/paragraph separators,
    bidi overrides) shown as escapes. Everything else is kept as it is."""
    text = "" if value is None else str(value)
    return _UNSAFE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clip(value: object, width: int, wide: bool) -> str:
    """:func:`printable`, cut to ``width`` characters (ending "…") unless ``wide``."""
    text = printable(value)
    if wide or len(text) <= width:
        return text
    return text[: width - 1] + "…"


def text(value: object, style: str = "", *, width: int | None = None, wide: bool = True) -> Text:
    """Stored data as rich Text: printed as is, never read as markup or emoji codes."""
    shown = printable(value) if width is None else clip(value, width, wide)
    return Text(shown, style=style)
