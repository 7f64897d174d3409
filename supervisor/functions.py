"""The Supervisor as a timer-triggered function (schedule from the SUPERVISOR_SCHEDULE setting).

Each tick is one span; the retry and compensation messages it sends carry its trace context.
"""

from __future__ import annotations

import logging

import azure.functions as func

from core import clients, runtime
from core.telemetry import tracer
from supervisor.leader import Leadership
from supervisor.tick import run_tick

bp = func.Blueprint()
log = logging.getLogger("supervisor")

_leadership: Leadership | None = None


def _leader(rt: runtime.Runtime) -> Leadership:
    global _leadership
    if _leadership is None:
        _leadership = Leadership(
            clients.blob_service(rt.settings.storage),
            rt.settings.lease_container,
            rt.instance_id,
        )
    return _leadership


@bp.timer_trigger(arg_name="timer", schedule="%SUPERVISOR_SCHEDULE%", run_on_startup=False)
def supervisor(timer: func.TimerRequest) -> None:
    rt = runtime.current()
    with tracer.start_as_current_span("supervisor_tick") as span:
        leader = _leader(rt).acquire()
        span.set_attribute("supervisor.leader", leader)
        if not leader:
            log.info("another supervisor holds the lease; skipping this tick")
            return
        run_tick(rt)
