"""The Agent: carry one step of one order to its remote service and report back.

Success or a refusal becomes an AgentResponse on the response queue. If complete-by passes
first, the agent stops and sends nothing (the pattern's rule): the Supervisor will find the
order past its deadline and retry it, and the idempotency key makes the retry safe even if the
remote service did apply the operation.
"""

from __future__ import annotations

import logging

from agent.outcomes import DeadlinePassed, Failed, Succeeded
from core.messages import AgentRequest, AgentResponse, BadMessage, OperatorAlert, parse_message
from core.runtime import Runtime

log = logging.getLogger("agent")


def handle_request(body: bytes | str, service: str, rt: Runtime) -> None:
    try:
        request = parse_message(body, AgentRequest)
    except BadMessage as bad:
        rt.alert(bad.to_alert(source=rt.actor(f"agent-{service}")))
        return
    if request.complete_by <= rt.clock():
        log.info(
            "%s: %s %s attempt %d arrived after its complete-by; not calling",
            service,
            request.order_id,
            request.step,
            request.attempt,
        )
        return
    try:
        outcome = rt.remote_client(service).call(
            request.action, request.payload, request.idempotency_key, request.complete_by
        )
    except ValueError as exc:  # arguments no retry could fix: a malformed request
        rt.alert(
            OperatorAlert(
                order_id=request.order_id,
                severity="error",
                reason="bad_agent_request",
                detail=f"{service} cannot carry out {request.action}: {exc}",
                source=rt.actor(f"agent-{service}"),
            )
        )
        return
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
    response = AgentResponse(
        order_id=request.order_id,
        step=request.step,
        operation=request.operation,
        attempt=request.attempt,
        outcome="succeeded" if isinstance(outcome, Succeeded) else "failed",
        transient=isinstance(outcome, Failed) and outcome.transient,
        error_code=outcome.code if isinstance(outcome, Failed) else None,
        error_message=outcome.message if isinstance(outcome, Failed) else None,
        result=outcome.result if isinstance(outcome, Succeeded) else {},
    )
    rt.bus.send(rt.settings.queue("responses"), response)
