"""The AgentResponse that reports a remote call's outcome: pure, shared by both forms of the
Agent (``agent.handler`` is generated from ``agent.aio.handler``, devstack.unasync), which
import :func:`response_for` from here."""

from __future__ import annotations

import re

from agent.outcomes import Deferred, Failed, NothingToUndo, Succeeded
from core.messages import AgentRequest, AgentResponse

_ERROR_CODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # AgentResponse.error_code


def response_for(
    request: AgentRequest, outcome: Succeeded | NothingToUndo | Failed | Deferred
) -> AgentResponse:
    """The AgentResponse that reports ``outcome`` for ``request``, echoing its ``resume``
    unchanged (the order's snapshot, for the Scheduler: :mod:`core.resume`)."""
    common = {
        "order_id": request.order_id,
        "step": request.step,
        "operation": request.operation,
        "attempt": request.attempt,
        "idempotency_key": request.idempotency_key,
        "resume": request.resume,
    }
    match outcome:
        case Succeeded(result=result):
            return AgentResponse(**common, outcome="succeeded", result=result)
        case NothingToUndo(result=result):
            return AgentResponse(**common, outcome="nothing_to_undo", result=result)
        case Failed(code=code, message=message, transient=transient):
            return AgentResponse(
                **common,
                outcome="failed",
                transient=transient,
                error_code=_error_code(code),
                error_message=message,
            )
        case Deferred(retry_at=retry_at):
            return AgentResponse(**common, outcome="deferred", retry_at=retry_at)
    raise TypeError(f"no response for {type(outcome).__name__}")


def _error_code(code: str) -> str:
    """The service's error code, made fit for AgentResponse (a real service may send any text)."""
    if _ERROR_CODE.match(code):
        return code
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", code).strip("_.-")[:64]
    return cleaned if cleaned else "remote_error"
