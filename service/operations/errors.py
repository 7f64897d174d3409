"""Refusals of operator operations, each with an HTTP status and a stable one-word code.

Both front ends show them the same way: the HTTP API as ``{"error": {"code", "message"}}`` with
``status``, the CLI as the message and a non-zero exit.
"""

from __future__ import annotations

from typing import ClassVar


class OperatorError(Exception):
    status: ClassVar[int] = 400

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def to_json(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": self.message}}


class InvalidRequest(OperatorError):
    """The request itself is wrong: fix it before trying again (status 400, the default)."""


class Unauthenticated(OperatorError):
    """The platform named no caller: actions need to know who acts."""

    status = 401


class NotFound(OperatorError):
    status = 404


class Conflict(OperatorError):
    """The request is fine but does not apply to the thing as it is now."""

    status = 409


class TooLarge(OperatorError):
    status = 413


class ServerFault(OperatorError):
    """A fault of ours: the details are logged, never returned."""

    status = 500


class Busy(OperatorError):
    """Someone else kept changing the same thing; the same request may work in a moment."""

    status = 503
