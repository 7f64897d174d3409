"""The order metrics, through the OpenTelemetry metrics API.

Exported to Application Insights (customMetrics) in Azure, or to JSON-lines files locally
(:mod:`adapters.telemetry`). The names are what the Azure workbook and the dashboard query
(:data:`NAMES`); the attributes are low-cardinality on purpose (never an order id).

The recording functions are called on the hot path, once per committed transition. When no
meter provider is configured they return at the first line: no attribute dict is built, no
instrument is looked up. :func:`bind` turns them on (``adapters.telemetry.configure`` calls it once
a provider is installed; tests bind an SDK provider with an in-memory reader).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from opentelemetry import metrics
from opentelemetry.metrics import MeterProvider

from domain.events import Event, Replied, Swept
from domain.messages import OperatorAlert
from domain.order import Order, TimelineEntry
from domain.states import ProcessState
from domain.workflows import parse_ref

if TYPE_CHECKING:
    from domain.workflows import Workflow

ORDERS_STARTED: Final = "orders.started"
ORDERS_FINISHED: Final = "orders.finished"
ORDERS_FAILED: Final = "orders.failed"
STEP_DURATION: Final = "step.duration"
STEP_RETRIES: Final = "step.retries"
CIRCUIT_STATE: Final = "agent.circuit.state"

NAMES: Final[frozenset[str]] = frozenset(
    {ORDERS_STARTED, ORDERS_FINISHED, ORDERS_FAILED, STEP_DURATION, STEP_RETRIES, CIRCUIT_STATE}
)
"""Every instrument this module records (service.sweep_report.NAMES has the Supervisor's)."""

ATTRIBUTES: Final[Mapping[str, frozenset[str]]] = {
    ORDERS_STARTED: frozenset({"workflow"}),
    ORDERS_FINISHED: frozenset({"workflow"}),
    ORDERS_FAILED: frozenset({"workflow", "reason"}),
    STEP_DURATION: frozenset({"step", "outcome", "operation"}),
    STEP_RETRIES: frozenset({"step", "cause"}),
    CIRCUIT_STATE: frozenset({"agent"}),
}
"""The attributes each instrument is recorded with (customDimensions in Application Insights,
where the workbook reads them)."""

CIRCUIT_STATES: Final = {"closed": 0, "half_open": 1, "open": 2}
"""The value ``agent.circuit.state`` takes for each breaker state (service.circuit)."""

METER_NAME: Final = "orders"
log = logging.getLogger("metrics")
DURATION_BUCKETS_S: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
"""``step.duration``'s buckets, in seconds (the SDK's default ones are made for milliseconds)."""


class _Instruments:
    def __init__(self, provider: MeterProvider) -> None:
        meter = provider.get_meter(METER_NAME)
        self.counters = {
            name: meter.create_counter(name, unit=unit, description=description)
            for name, unit, description in (
                (ORDERS_STARTED, "{order}", "Orders accepted by intake"),
                (ORDERS_FINISHED, "{order}", "Orders that reached Processed"),
                (ORDERS_FAILED, "{order}", "Orders that reached Error"),
                (STEP_RETRIES, "{attempt}", "Step attempts dispatched again"),
            )
        }
        self.step_duration = meter.create_histogram(
            STEP_DURATION,
            unit="s",
            description="From a step attempt's dispatch to its reply being applied",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        self.circuit_state = meter.create_gauge(
            CIRCUIT_STATE,
            unit="1",
            description="An agent's circuit breaker: 0 closed, 1 half open, 2 open",
        )


_bound: _Instruments | None = None
_bind_lock = threading.Lock()


def bind(provider: MeterProvider | None = None) -> None:
    """Record from now on, through ``provider`` (the global meter provider if None)."""
    global _bound
    with _bind_lock:
        _bound = _Instruments(provider or metrics.get_meter_provider())


def enabled() -> bool:
    """Whether recording does anything; callers that must compute an attribute check first."""
    return _bound is not None


def order_started(workflow: str) -> None:
    if (on := _bound) is None:
        return
    on.counters[ORDERS_STARTED].add(1, {"workflow": workflow})


def record_circuit_state(agent: str, state: str) -> None:
    """An agent's breaker is now ``state`` (closed, half_open or open; service.circuit)."""
    if (on := _bound) is None:
        return
    value = CIRCUIT_STATES.get(state)
    if value is None:
        raise ValueError(
            f"unknown circuit state {state!r}; expected one of {', '.join(CIRCUIT_STATES)}"
        )
    on.circuit_state.set(value, {"agent": agent})


# ----------------------------------------------------------------- committed transitions


@dataclass(frozen=True, slots=True)
class Observation:
    """One measurement a committed transition implies (:func:`observe`)."""

    name: str
    value: float
    attributes: tuple[tuple[str, str], ...]


RETRY_CAUSES: Final = {"deferred": "circuit_open"}
"""``step.retries`` causes by timeline event; a ``released`` write's cause depends on what
released it (:func:`_retry_cause`)."""


def workflow_name(ref: str) -> str:
    """The workflow's name without its version (``order@2`` -> ``order``): the metrics'
    ``workflow`` attribute, so a new version does not split the charts."""
    try:
        return parse_ref(ref)[0]
    except LookupError:
        return ref


def observe(
    before: Order, after: Order, entry: TimelineEntry, event: Event | None, workflow: Workflow
) -> tuple[Observation, ...]:
    """What the committed write of ``after`` over ``before`` (adding ``entry``, on ``event``)
    measures. Pure: the shell records the result only after the conditional write succeeded.

    - ``orders.finished`` / ``orders.failed``: the write that enters Processed / Error (the
      failure's reason is that of the alert the write owes).
    - ``step.duration``: a reply to the attempt in flight, from the attempt's claim (its
      CompleteBy less the step's budget) to the reply's write.
    - ``step.retries``: the write that releases a step for another attempt.
    """
    found: list[Observation] = []
    name = workflow_name(after.workflow)
    if after.state is ProcessState.PROCESSED and before.state is not ProcessState.PROCESSED:
        found.append(Observation(ORDERS_FINISHED, 1, (("workflow", name),)))
    if after.state is ProcessState.ERROR and before.state is not ProcessState.ERROR:
        reason = _failure_reason(after)
        found.append(Observation(ORDERS_FAILED, 1, (("workflow", name), ("reason", reason))))
    if isinstance(event, Replied):
        duration = _attempt_duration(before, entry, event, workflow)
        if duration is not None:
            r = event.response
            outcome = "transient" if r.outcome == "failed" and r.transient else r.outcome
            attributes = (("step", r.step), ("outcome", outcome), ("operation", r.operation))
            found.append(Observation(STEP_DURATION, duration, attributes))
    if entry.event == "released" or entry.event in RETRY_CAUSES:
        cause = RETRY_CAUSES.get(entry.event) or _retry_cause(before, event)
        attributes = (("step", after.current_step), ("cause", cause))
        found.append(Observation(STEP_RETRIES, 1, attributes))
    return tuple(found)


def _failure_reason(after: Order) -> str:
    for outgoing in reversed(after.outbox):
        alert = outgoing.message
        if isinstance(alert, OperatorAlert) and alert.timeline_seq == after.timeline_seq:
            return alert.reason
    return after.compensation_cause or "unknown"


def _attempt_duration(
    before: Order, entry: TimelineEntry, event: Replied, workflow: Workflow
) -> float | None:
    r = event.response
    in_flight = (before.current_step, before.current_operation, before.attempt)
    answered = in_flight == (r.step, r.operation, r.attempt)
    if not answered or before.locked_by is None or before.complete_by is None:
        return None  # not the attempt in flight: when it was dispatched is not on record
    try:
        budget = workflow.step_named(r.step).deadline_budget
    except LookupError:
        return None
    return max(0.0, (entry.at - (before.complete_by - budget)) / timedelta(seconds=1))


def _retry_cause(before: Order, event: Event | None) -> str:
    if isinstance(event, Replied):
        return "transient"
    if isinstance(event, Swept):
        return "timeout" if before.locked_by is not None else "stale"
    return "other"


def record(observations: Iterable[Observation]) -> None:
    """Record ``observations`` (nothing when not bound)."""
    if (on := _bound) is None:
        return
    for o in observations:
        attributes = dict(o.attributes)
        if o.name == STEP_DURATION:
            on.step_duration.record(o.value, attributes)
        elif o.name in on.counters:
            on.counters[o.name].add(int(o.value), attributes)
        else:
            raise ValueError(f"no instrument {o.name!r} in adapters.metrics")


def record_transition(
    before: Order, after: Order, entry: TimelineEntry, event: Event | None, workflow: Workflow
) -> None:
    """Record what a committed transition measures (:func:`observe`); call it only after the
    conditional write succeeded. Free when not bound. Never raises: the write is done and its
    messages must still be sent, whatever happens to a measurement."""
    if _bound is None:
        return
    try:
        record(observe(before, after, entry, event, workflow))
    except Exception:
        log.warning("order %s: metrics not recorded", after.order_id, exc_info=True)
