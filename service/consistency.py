"""Whether an AgentRequest agrees with the order it carries: pure, checked before any remote call.

A request leaves with a snapshot of its order as stored by the write that put the request in
the order's outbox (:mod:`service.resume`). So a request the Scheduler sent is, but for that
snapshot, one of the requests in the snapshot's outbox: the same step, operation, action,
attempt, idempotency key, forward key undone, payload and deadlines. One that is not - built
wrong or mixed up by a bug upstream, a copy carrying another write's or another order's
snapshot - must not reach the remote service: the agent refuses it with an alert and calls
nothing (:mod:`service.agent`). The check reads no table: the snapshot is in hand.

A request without a snapshot is carried out unchecked. The Scheduler leaves the snapshot out
when it would not fit in a message (:func:`service.resume.snapshot`), and refusing those would
stall every order too large to carry one; whatever such a request is answered, the Scheduler
applies the answer only if the order's own record shows it sent that request
(:mod:`domain.lifecycle`). A signed request is the app's own (:mod:`domain.signing`): this check is
defence in depth against the app's mistakes, not against a leaked key.
"""

from __future__ import annotations

from typing import Final

from pydantic import ValidationError

from domain.messages import AgentRequest
from service import resume

INCONSISTENT_REASON: Final = "inconsistent_request"


def disagreement(request: AgentRequest) -> str | None:
    """Why ``request`` is not a request its snapshot's outbox holds; None when it is one, or
    when it carries no snapshot."""
    if request.resume is None:
        return None
    stored = resume.requests_in(request.resume, request.order_id)
    if stored is None:
        return "the order snapshot it carries cannot be read or is another order's"
    # As stored, the outbox holds each request's JSON: the same request reads back the same.
    if request.model_dump(mode="json", exclude={"resume"}) in stored:
        return None
    try:
        held = [AgentRequest.model_validate(message) for message in stored]
    except ValidationError:
        return "the order snapshot it carries cannot be read or is another order's"
    sent = request.model_copy(update={"resume": None})
    for other in held:
        if _named(other) == _named(sent):
            fields = [f for f in AgentRequest.model_fields if getattr(sent, f) != getattr(other, f)]
            return f"it differs in {', '.join(fields)} from the request its order put in its outbox"
    listed = ", ".join(_named(m) for m in held) or "none"
    return f"its order's outbox holds no such request (it holds: {listed})"


def _named(request: AgentRequest) -> str:
    return f"{request.operation} {request.step} attempt {request.attempt}"
