"""The Agent: carry one step of one order to its remote service and report back.

A request must first agree with the order snapshot it carries (:mod:`service.consistency`): one
that does not is refused with an ``inconsistent_request`` alert, and nothing is called or
answered; the step is retried from the order's record once its deadline passes.

Every answer is an AgentResponse on the response queue, naming the request's idempotency key
and echoing the request's ``resume`` unchanged (the order's state, for the Scheduler):

- ``succeeded``: the service applied the operation (or had applied it before);
- ``nothing_to_undo``: an undo whose forward call never took effect; the service now refuses
  that forward key for ever;
- ``failed``: a refusal (not transient: e.g. a decline, or ``undone_before_applied``) or
  retries exhausted (transient);
- ``deferred``: the circuit to the service is open; nothing definitive happened, try again at
  ``retry_at``.

The call may run for the request's run budget from when the agent starts it, and never past
complete-by. A call stopped by either reports ``failed`` (transient, ``timed_out``): the service
was called and did not answer in time. A request taken up after complete-by is not carried
out (the pattern's rule: its time is over, the Supervisor retries it) but answered ``failed``
(transient, ``expired``): the attempt never left our side. Either answer counts only while its
attempt is still in flight, as the Supervisor's release past CompleteBy would; later, it tells
the Scheduler whose failure that attempt was (domain.lifecycle). The idempotency key makes every
retry safe even if the remote service did apply the operation.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime
from typing import TYPE_CHECKING

from domain.messages import (
    EXPIRED,
    AgentRequest,
    AgentResponse,
    BadMessage,
    MessageTooLarge,
    OperatorAlert,
    parse_message,
)
from service.consistency import INCONSISTENT_REASON, disagreement
from service.outcomes import DeadlinePassed, Deferred, Failed, NothingToUndo, Succeeded
from service.remote_calls import RemoteServiceClient

if TYPE_CHECKING:  # the agent needs the Runtime's parts, not the module (which builds stores)
    from service.runtime import Runtime

log = logging.getLogger("agent")


async def handle_request(
    body: bytes | str, service: str, rt: Runtime, *, caused_by: str | None = None
) -> None:
    """``caused_by``: the request's :meth:`service.inbound.Delivery.cause`, which tells the
    alerts of two requests apart (None: the alert is named by its text)."""
    try:
        request = parse_message(body, AgentRequest)
    except BadMessage as bad:
        await rt.alert(bad.to_alert(source=rt.actor(f"agent-{service}"), caused_by=caused_by))
        return
    problem = disagreement(request)
    if problem is not None:
        await rt.alert(
            OperatorAlert(
                order_id=request.order_id,
                severity="error",
                reason=INCONSISTENT_REASON,
                detail=(
                    f"{service} refused {request.operation} {request.step} attempt "
                    f"{request.attempt} (key {request.idempotency_key}) without calling its "
                    f"service: {problem}. A signed request that disagrees with the order it "
                    "carries is a bug upstream or a mixed-up message; the step is retried from "
                    "the order's record once its deadline passes."
                ),
                source=rt.actor(f"agent-{service}"),
                caused_by=caused_by,
            )
        )
        return
    started = rt.clock()
    if request.complete_by <= started:
        log.info(
            "%s: %s %s attempt %d arrived after its complete-by; not calling",
            service,
            request.order_id,
            request.step,
            request.attempt,
        )
        late = (started - request.complete_by).total_seconds()
        await _reply(rt, response_for(request, expired(f"taken up {late:.1f}s after complete-by")))
        return
    try:
        outcome = await remote_client(rt, service).call(
            request.action,
            request.payload,
            request.idempotency_key,
            request.run_deadline(started),
            undoes=request.undoes,
        )
    except ValueError as exc:  # arguments no retry could fix: a malformed request
        await rt.alert(
            OperatorAlert(
                order_id=request.order_id,
                severity="error",
                reason="bad_agent_request",
                detail=f"{service} cannot carry out {request.action}: {exc}",
                source=rt.actor(f"agent-{service}"),
                caused_by=caused_by,
            )
        )
        return
    if isinstance(outcome, DeadlinePassed):
        outcome = out_of_time(request, started, outcome, service)
    if isinstance(outcome, Deferred):
        log.info(
            "%s: %s %s attempt %d deferred to %s: circuit open (%s)",
            service,
            request.order_id,
            request.step,
            request.attempt,
            outcome.retry_at.isoformat(),
            outcome.last_error,
        )
    await _reply(rt, response_for(request, outcome))


async def _reply(rt: Runtime, response: AgentResponse) -> None:
    try:
        await rt.bus.send(rt.settings.queue("responses"), response)
    except MessageTooLarge:
        if response.resume is None:
            raise
        # The snapshot only spares the Scheduler a read; the answer must get through.
        log.warning("reply for %s too large with its snapshot; sent without", response.order_id)
        await rt.bus.send(
            rt.settings.queue("responses"), response.model_copy(update={"resume": None})
        )


def remote_client(rt: Runtime, service: str) -> RemoteServiceClient:
    """The client of ``service``, built once per runtime (on the runtime's remote HTTP)."""
    client = rt.agent_clients.get(service)
    if client is None:
        client = RemoteServiceClient(service, rt.remote_http, rt.breakers.get(service), rng=rt.rng)
        rt.agent_clients[service] = client
    return client


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
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", code).strip("_.-")[:64] or "remote_error"
