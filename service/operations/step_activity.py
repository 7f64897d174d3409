"""What each step of an order went through, read from its timeline: when it was first
requested, how long it took, how many of its attempts failed or were deferred, and why.

Pure: the order's steps and its timeline in, one :class:`StepActivity` per step out.

How the timeline says it: every entry records the order's request counter (``attempt``) after
the write, so an entry whose counter went up sent a request. A forward request (the order
Processing afterwards) is for the entry's step, except after ``step_succeeded``, whose entry
names the step that finished while the request is for the next one. ``step_succeeded`` and
``processed`` end their step's run; ``released`` (a failed attempt: transient error or a missed
deadline) and ``deferred`` (an open circuit, not a failure) name the step they happened to, and
their details are the reasons; so are the details of ``late_*`` entries (an answer after the
step was given up on; ``late_answer``: one that says only whose failure that attempt was) and
of ``settling``/``settled`` ones (an answer after the order ended). A resubmit or restart starts
the runs of the steps it redoes afresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from domain.order import StepRecord, StepState, TimelineEntry
from domain.states import ProcessState

MAX_REASONS = 10
"""The most recent reasons kept per step."""
RESTARTS = frozenset({"resubmitted", "restarted"})
ENDS = frozenset({"step_succeeded", "processed"})
LATE = frozenset(
    {"late_success", "late_decline", "late_undo", "late_answer", "settling", "settled"}
)


@dataclass(frozen=True, slots=True)
class StepActivity:
    started_at: datetime | None
    """When its latest run's first request was sent (None: never requested)."""
    duration_s: float | None
    """From then to its answer (succeeded or refused), or to now while it runs (None: not
    known, e.g. undone before it answered)."""
    requests: int
    """Forward requests of its latest run (the first and each retry)."""
    failures: int
    """Failed attempts (forward or undo) over the order's life: transient errors, deadlines."""
    deferrals: int
    """Attempts put off by an open circuit (not failures)."""
    reasons: tuple[str, ...]
    """Why its attempts failed, were deferred or answered late; most recent last."""


@dataclass
class _Run:
    started: datetime | None = None
    ended: datetime | None = None
    requests: int = 0
    failures: int = 0
    deferrals: int = 0
    reasons: list[str] = field(default_factory=list)


def step_activity(
    steps: Sequence[StepRecord], timeline: Sequence[TimelineEntry], now: datetime
) -> dict[str, StepActivity]:
    """Per step name, what its timeline entries say (see the module docstring)."""
    index = {s.name: s.index for s in steps}
    by_index = {s.index: s.name for s in steps}
    runs = {s.name: _Run() for s in steps}
    sent = 0
    for entry in sorted(timeline, key=lambda e: e.seq):
        requested = entry.attempt > sent
        sent = max(sent, entry.attempt)
        step = entry.step if entry.step in runs else None
        if step is None:
            continue
        if entry.event in RESTARTS:
            for name, run in runs.items():
                if index[name] >= index[step]:
                    runs[name] = _Run(
                        failures=run.failures, deferrals=run.deferrals, reasons=run.reasons
                    )
        if requested and entry.to_state is ProcessState.PROCESSING:
            target = by_index.get(index[step] + 1) if entry.event == "step_succeeded" else step
            if target is not None:
                _requested(runs[target], entry.at)
        if entry.event in ENDS and runs[step].ended is None:
            runs[step].ended = entry.at
        elif entry.event == "released":
            runs[step].failures += 1
            runs[step].reasons.append(entry.detail)
        elif entry.event == "deferred":
            runs[step].deferrals += 1
            runs[step].reasons.append(entry.detail)
        elif entry.event in LATE:
            runs[step].reasons.append(entry.detail)
    return {s.name: _activity(s, runs[s.name], now) for s in steps}


def _requested(run: _Run, at: datetime) -> None:
    if run.started is None or run.ended is not None:
        run.started, run.ended = at, None
    run.requests += 1


def _activity(step: StepRecord, run: _Run, now: datetime) -> StepActivity:
    duration = None
    if run.started is not None:
        # The answer's own time first; a result kept from an earlier run is older than this one.
        ends = [t for t in (step.completed_at, run.ended) if t is not None and t >= run.started]
        end = ends[0] if ends else (now if step.state is StepState.RUNNING else None)
        if end is not None:
            duration = round((end - run.started).total_seconds(), 3)
    return StepActivity(
        started_at=run.started,
        duration_s=duration,
        requests=run.requests,
        failures=run.failures,
        deferrals=run.deferrals,
        reasons=tuple(run.reasons[-MAX_REASONS:]),
    )
