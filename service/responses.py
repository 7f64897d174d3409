"""The AgentResponse that reports a remote call's outcome (pure): :func:`response_for`, which
the Agent (``service.agent``) sends."""

from __future__ import annotations

import re
from datetime import datetime

from domain.messages import EXPIRED, AgentRequest, AgentResponse
from service.outcomes import DeadlinePassed, Deferred, Failed, NothingToUndo, Succeeded

_ERROR_CODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # AgentResponse.error_code


def response_for(
    request: AgentRequest, outcome: Succeeded | NothingToUndo | Failed | Deferred
) -> AgentResponse:
    """The AgentResponse that reports ``outcome`` for ``request``, echoing its ``resume``
    unchanged (the order's snapshot, for the Scheduler: :mod:`service.resume`)."""
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


def expired(why: str) -> Failed:
    """A request the agent did not carry to its service because its time was over: the attempt
    failed on our side (a backlog, a host frozen or restarting), not at the service."""
    return Failed(code=EXPIRED, message=f"{why}; the service was not called", transient=True)


def out_of_time(
    request: AgentRequest, started: datetime, outcome: DeadlinePassed, service: str
) -> Failed:
    """A call its run budget or complete-by stopped: ``timed_out`` if the service was called
    (it may have taken effect: the retry's idempotency key makes that safe), else expired."""
    if outcome.attempts == 0:
        return expired(f"no time left to call {service} ({outcome.last_error or 'no attempt'})")
    stopped_by = (
        f"the run budget of {request.run_budget_s:g}s"
        if request.run_deadline(started) < request.complete_by
        else f"complete-by {request.complete_by.isoformat()}"
    )
    return Failed(
        code="timed_out",
        message=f"no answer from {service} within {stopped_by} ({outcome.last_error})",
        transient=True,
    )


def _error_code(code: str) -> str:
    """The service's error code, made fit for AgentResponse (a real service may send any text)."""
    if _ERROR_CODE.match(code):
        return code
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", code).strip("_.-")[:64]
    return cleaned if cleaned else "remote_error"
