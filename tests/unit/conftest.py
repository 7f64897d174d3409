"""Unit tests run as if the developer's shell pointed orderctl nowhere: remote-mode settings
from the environment would send the CLI's commands to some deployed app."""

from __future__ import annotations

import pytest

REMOTE_SETTINGS = ("ORDERCTL_API_URL", "ORDERCTL_FUNCTION_KEY", "ORDERCTL_AUTH", "ORDERCTL_SCOPE")


@pytest.fixture(autouse=True)
def _local_orderctl(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in REMOTE_SETTINGS:
        monkeypatch.delenv(name, raising=False)
