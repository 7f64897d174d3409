"""The Supervisor as a timer-triggered function (schedule from the SUPERVISOR_SCHEDULE setting).

Each tick is one span. What it writes or sends for an order runs in a ``supervisor_recover``
span in that order's trace, linked to the tick (service/sweep.py), so the retry and
compensation messages continue the order's trace.
Any number of instances may tick at once: they share the work through per-bucket leases
(:mod:`service.leases`). A tick that finds many rows due hands them out to every instance
through the scheduler-commands queue (:mod:`service.hand_out`, :mod:`service.recovery`). The
Runtime is the composition root's (:mod:`service.composition`).
"""

from __future__ import annotations

import azure.functions as func

from adapters.telemetry import tracer
from service.composition import Root
from service.runtime import Runtime
from service.sweep import run_tick


def blueprint(root: Root) -> func.Blueprint:
    bp = func.Blueprint()

    @bp.timer_trigger(arg_name="timer", schedule="%SUPERVISOR_SCHEDULE%", run_on_startup=False)
    async def supervisor(timer: func.TimerRequest) -> None:
        await tick(root.runtime())

    return bp


async def tick(rt: Runtime) -> None:
    """One tick of the Supervisor, in its own span."""
    with tracer.start_as_current_span("supervisor_tick") as span:
        report = await run_tick(rt)
        span.set_attributes(
            {
                "supervisor.buckets_held": report.held,
                "supervisor.buckets_swept": report.swept,
                "supervisor.due": report.due,
                "supervisor.handed_out": report.handed_out,
                "supervisor.left": report.left,
                "supervisor.lag_s": report.lag_s,
            }
        )
