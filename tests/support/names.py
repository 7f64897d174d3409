"""Unique, storage-safe names for test resources (tables, containers, queues)."""

from __future__ import annotations

import re
import secrets
import string

_ALPHABET = string.ascii_lowercase + string.digits
SUFFIX_LENGTH = 8
MAX_LENGTH = 63  # Azure Table names: 3-63 chars, alphanumeric, starting with a letter
_issued: set[str] = set()


def unique_name(prefix: str = "t") -> str:
    """``prefix`` (lowercased, non-alphanumerics dropped) plus a random suffix, unique per call.

    The result is valid as an Azure Table name, a blob container name and a queue name: lowercase
    letters and digits only, starts with a letter, at most 63 characters.
    """
    clean = re.sub(r"[^a-z0-9]", "", prefix.lower())
    if not clean or not clean[0].isalpha():
        clean = "t" + clean
    clean = clean[: MAX_LENGTH - SUFFIX_LENGTH]
    while True:
        name = clean + "".join(secrets.choice(_ALPHABET) for _ in range(SUFFIX_LENGTH))
        if name not in _issued:
            _issued.add(name)
            return name
