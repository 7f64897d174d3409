"""The Agent: carry one step of one order to its remote service and report back.

Every answer is an AgentResponse on the response queue, naming the request's idempotency key
and echoing the request's ``resume`` unchanged (the order's state for the Scheduler, which the
agent never reads):

- ``succeeded``: the service applied the operation (or had applied it before);
- ``nothing_to_undo``: an undo whose forward call never took effect; the service now refuses
  that forward key for ever;
- ``failed``: a refusal (not transient: e.g. a decline, or ``undone_before_applied``) or
  retries exhausted (transient);
- ``deferred``: the circuit to the service is open; nothing definitive happened, try again at
  ``retry_at``.

The call may run for the request's run budget from when the agent starts it, and never past
complete-by. A request picked up after complete-by is dropped, and a call stopped by
complete-by sends nothing (the pattern's rule): the Supervisor will find the order past its
deadline and retry it. A call stopped earlier by its own run budget reports ``failed``
(transient, ``timed_out``), so the Scheduler retries a hung call at once instead of waiting
for the Supervisor. Either way the idempotency key makes the retry safe even if the remote
service did apply the operation.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agent.circuit import breaker_for
from agent.outcomes import DeadlinePassed, Deferred, Failed
from agent.remote_client import RemoteServiceClient
from agent.responses import response_for
from core.messages import (
    AgentRequest,
    AgentResponse,
    BadMessage,
    MessageTooLarge,
    OperatorAlert,
    parse_message,
)

if TYPE_CHECKING:  # the agent needs the Runtime's parts, not the module (which builds stores)
    from core.runtime import Runtime

log = logging.getLogger("agent")


async def handle_request(body: bytes | str, service: str, rt: Runtime) -> None:
    try:
        request = parse_message(body, AgentRequest)
    except BadMessage as bad:
        await rt.alert(bad.to_alert(source=rt.actor(f"agent-{service}")))
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
            )
        )
        return
    if isinstance(outcome, DeadlinePassed) and request.run_deadline(started) < request.complete_by:
        outcome = Failed(
            code="timed_out",
            message=(
                f"no answer from {service} within the run budget of {request.run_budget_s:g}s"
                f" ({outcome.last_error})"
            ),
            transient=True,
        )
    if isinstance(outcome, DeadlinePassed):
        log.info(
            "%s: %s %s attempt %d passed complete-by (%s); sending nothing",
            service,
            request.order_id,
            request.step,
            request.attempt,
            outcome.last_error,
        )
        return
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
        client = RemoteServiceClient(service, rt.remote_http, breaker_for(service), rng=rt.rng)
        rt.agent_clients[service] = client
    return client
