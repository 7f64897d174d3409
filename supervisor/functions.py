"""The Supervisor as a timer-triggered function (schedule from the SUPERVISOR_SCHEDULE setting).

Each tick is one span; the retry and compensation messages it sends carry its trace context.
Any number of instances may tick at once: they share the work through per-bucket leases
(:mod:`supervisor.leases`).
"""

from __future__ import annotations

import azure.functions as func

from core import runtime
from core.telemetry import tracer
from supervisor.tick import run_tick

bp = func.Blueprint()


@bp.timer_trigger(arg_name="timer", schedule="%SUPERVISOR_SCHEDULE%", run_on_startup=False)
def supervisor(timer: func.TimerRequest) -> None:
    rt = runtime.current()
    with tracer.start_as_current_span("supervisor_tick") as span:
        report = run_tick(rt)
        span.set_attributes(
            {
                "supervisor.buckets_held": report.held,
                "supervisor.buckets_swept": report.swept,
                "supervisor.due": report.due,
                "supervisor.lag_s": report.lag_s,
            }
        )
