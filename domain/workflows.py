"""Workflows as data: ordered steps, each done by one agent, each with its undo and budget.

The Scheduler walks a workflow forward; compensation walks the completed steps backwards
through their ``undo_operation``. Nothing here talks to a queue or to storage.

Idempotency rule (every step follows it; see :mod:`domain.ids`): a step presents
``<order_id>:<step>:<do|undo>:<generation>`` to its remote service, the same for every attempt
and redelivery, so the service applies each direction of each step at most once per generation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from types import MappingProxyType
from typing import Final

from domain import ids
from domain.agents import AGENT_NAMES

MAX_VERSION: Final = 9999
MAX_STEPS: Final = 90
"""Create writes details + process + timeline + one row per step in one 100-operation batch."""


class UnknownStep(LookupError):
    """A step name that the workflow does not have (bad input, or a reply for another flow)."""


class UnknownWorkflow(LookupError):
    """A workflow name, or a version of it, that this deployment does not carry."""


VERSION_MARK: Final = "@"
"""Between a workflow's name and its version in a reference: ``order@2``."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long to wait before retry number ``failure_count`` (the pattern's extended wait).

    ``delay = min(cap, base_delay * factor ** (failure_count - 1))``, then reduced by up to
    ``jitter`` (a fraction, 0-1) at random, so retries of many orders failing together spread out
    instead of arriving in one wave. The result is never above ``cap`` and never below
    ``(1 - jitter)`` times the un-jittered delay.
    """

    base_delay: timedelta
    factor: float
    cap: timedelta
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.base_delay <= timedelta(0):
            raise ValueError(f"base_delay must be positive, got {self.base_delay}")
        if self.factor < 1.0:
            raise ValueError(f"factor must be >= 1 so delays never shrink, got {self.factor}")
        if self.cap < self.base_delay:
            raise ValueError(f"cap {self.cap} is below base_delay {self.base_delay}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter is a fraction from 0 to 1, got {self.jitter}")

    def nominal_delay(self, failure_count: int) -> timedelta:
        """The delay before jitter."""
        if failure_count < 1:
            raise ValueError(f"failure_count starts at 1, got {failure_count}")
        cap_s = self.cap.total_seconds()
        try:
            seconds = self.base_delay.total_seconds() * self.factor ** (failure_count - 1)
        except OverflowError:
            seconds = cap_s
        return timedelta(seconds=min(seconds, cap_s))

    def delay(self, failure_count: int, draw: float) -> timedelta:
        """The nominal delay less up to ``jitter`` of it: ``draw`` (0 to 1) says how much."""
        return self.nominal_delay(failure_count) * (1.0 - self.jitter * draw)


@dataclass(frozen=True, slots=True)
class Step:
    """One unit of work at one remote service.

    ``operation``/``undo_operation`` are the remote service's action names (``reserve`` /
    ``release``); ``undo_operation`` is None for a step with nothing to undo.
    ``complete_by_budget`` is how long one attempt may take once its agent starts it (start to
    reply). ``queue_budget`` is how long its request may wait for an agent before that (a
    backlog, a cold start). An attempt's CompleteBy, the Supervisor's deadline, is the claim
    plus both; the agent stops its own call ``complete_by_budget`` after it started and
    reports a timeout, so a hung call is retried at once while a queued one is left to wait.
    """

    name: str
    agent: str
    """An agent of the catalog (:mod:`domain.agents`)."""
    operation: str
    undo_operation: str | None
    complete_by_budget: timedelta
    queue_budget: timedelta = timedelta(0)

    def __post_init__(self) -> None:
        ids.validate_name(self.name, "step name")
        if self.agent not in AGENT_NAMES:
            raise ValueError(f"step {self.name}: agent {self.agent!r} is not one of {AGENT_NAMES}")
        ids.validate_name(self.operation, "action name")
        if self.undo_operation is not None:
            ids.validate_name(self.undo_operation, "action name")
        if self.complete_by_budget <= timedelta(0):
            raise ValueError(f"step {self.name}: complete_by_budget must be positive")
        if self.queue_budget < timedelta(0):
            raise ValueError(f"step {self.name}: queue_budget must not be negative")

    @property
    def deadline_budget(self) -> timedelta:
        """From claim to CompleteBy: the wait for an agent, then the call."""
        return self.queue_budget + self.complete_by_budget

    @property
    def compensable(self) -> bool:
        return self.undo_operation is not None

    def action_for(self, operation: ids.Operation) -> str:
        """The remote action for a direction: ``do`` -> operation, ``undo`` -> undo_operation."""
        if operation == "do":
            return self.operation
        if self.undo_operation is None:
            raise ValueError(f"step {self.name} has no undo operation")
        return self.undo_operation

    def idempotency_key(self, order_id: str, operation: ids.Operation, generation: int) -> str:
        return ids.idempotency_key(order_id, self.name, operation, generation)


@dataclass(frozen=True, slots=True)
class Workflow:
    """An ordered, non-empty list of uniquely named steps plus how to retry and when to stop.

    ``failure_threshold``: the number of failed attempts after which the Supervisor stops
    retrying and compensates (the pattern's "failure threshold"). ``version``: definitions
    change; an order records the version it started on (:attr:`ref`) and every decision about
    it uses that version's definition (docs/versioning.md).
    """

    name: str
    steps: tuple[Step, ...]
    retry: RetryPolicy
    failure_threshold: int = 3
    version: int = 1
    _index: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ids.validate_name(self.name, "workflow name")
        if not 1 <= self.version <= MAX_VERSION:
            raise ValueError(f"workflow {self.name}: version must be 1 to {MAX_VERSION}")
        if not self.steps:
            raise ValueError(f"workflow {self.name} has no steps")
        if len(self.steps) > MAX_STEPS:
            raise ValueError(
                f"workflow {self.name} has {len(self.steps)} steps; at most {MAX_STEPS}"
            )
        index: dict[str, int] = {}
        for position, step in enumerate(self.steps):
            if step.name in index:
                raise ValueError(f"workflow {self.name} has two steps named {step.name!r}")
            index[step.name] = position
        if self.failure_threshold < 1:
            raise ValueError(f"workflow {self.name}: failure_threshold must be at least 1")
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "_index", MappingProxyType(index))

    @property
    def ref(self) -> str:
        """What an order records: name and version, ``order@2``."""
        return f"{self.name}{VERSION_MARK}{self.version}"

    @property
    def first_step(self) -> Step:
        return self.steps[0]

    @property
    def step_names(self) -> tuple[str, ...]:
        return tuple(step.name for step in self.steps)

    def index_of(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise UnknownStep(
                f"workflow {self.name!r} has no step {str(name)[:64]!r}; "
                f"its steps are: {', '.join(self.step_names)}"
            ) from None

    def step_named(self, name: str) -> Step:
        return self.steps[self.index_of(name)]

    def next_step(self, after: str) -> Step | None:
        """The step after ``after``, or None when ``after`` is the last one."""
        position = self.index_of(after) + 1
        return self.steps[position] if position < len(self.steps) else None


DEFAULT_RETRY: Final = RetryPolicy(
    base_delay=timedelta(seconds=5), factor=2.0, cap=timedelta(minutes=5), jitter=0.2
)

DEFAULT_QUEUE_BUDGET: Final = timedelta(seconds=60)
"""Room for a backlog or a cold start: an attempt's request may wait this long for an agent."""


def _shipped_step(name: str, agent: str, operation: str, undo_operation: str | None) -> Step:
    """A step of the workflows below: 30 s per call, after up to DEFAULT_QUEUE_BUDGET queued."""
    return Step(name, agent, operation, undo_operation, timedelta(seconds=30), DEFAULT_QUEUE_BUDGET)


ORDER_WORKFLOW: Final = Workflow(
    name="order",
    steps=(
        _shipped_step("reserve_inventory", "inventory", "reserve", "release"),
        _shipped_step("charge_payment", "payment", "charge", "refund"),
        _shipped_step("create_shipment", "shipping", "create", "cancel"),
    ),
    retry=DEFAULT_RETRY,
)

ORDER_WORKFLOW_V2: Final = Workflow(
    name="order",
    version=2,
    steps=(
        ORDER_WORKFLOW.step_named("reserve_inventory"),
        replace(ORDER_WORKFLOW.step_named("charge_payment"), undo_operation="void"),
        _shipped_step("verify_address", "shipping", "verify", None),
        ORDER_WORKFLOW.step_named("create_shipment"),
    ),
    retry=DEFAULT_RETRY,
)
"""The order workflow, second version: the charge is undone by a void (not a refund) and the
shipping address is verified before a shipment is created. A new step in the middle and a
different undo are breaking changes: orders started on version 1 finish on version 1."""

SINGLE_STEP_WORKFLOW: Final = Workflow(
    name="single_step", steps=(ORDER_WORKFLOW.step_named("reserve_inventory"),), retry=DEFAULT_RETRY
)
"""One step only: for benchmarks that measure the machinery rather than the flow."""

WORKFLOWS: Final[Mapping[str, Workflow]] = MappingProxyType(
    {flow.ref: flow for flow in (ORDER_WORKFLOW, ORDER_WORKFLOW_V2, SINGLE_STEP_WORKFLOW)}
)
"""Every version this deployment carries, by reference (``order@1``). Drop a version only once
no order in flight or in Error refers to it (``orderctl workflows check``)."""
WORKFLOW_NAMES: Final = tuple(dict.fromkeys(flow.name for flow in WORKFLOWS.values()))
DEFAULT_WORKFLOW: Final = ORDER_WORKFLOW.name


def parse_ref(ref: str) -> tuple[str, int]:
    """``order@2`` -> ("order", 2). A bare name is version 1: orders stored before versions."""
    name, mark, version = str(ref).partition(VERSION_MARK)
    if not mark:
        return name, 1
    if not version.isdigit() or not 1 <= int(version) <= MAX_VERSION:
        raise UnknownWorkflow(f"{str(ref)[:64]!r} is not a workflow reference like order@2")
    return name, int(version)


def workflow_ref(name: str, version: int) -> str:
    return f"{name}{VERSION_MARK}{version}"


def resolve(flows: Mapping[str, Workflow], ref: str) -> Workflow:
    """The definition an order recorded (``ref``; a bare name is version 1), or UnknownWorkflow
    naming what is missing and what this deployment carries."""
    name, version = parse_ref(ref)
    flow = flows.get(workflow_ref(name, version))
    if flow is None:
        raise UnknownWorkflow(
            f"this deployment has no workflow {workflow_ref(name, version)!r}; it carries "
            f"{', '.join(sorted(flows))}"
        )
    return flow
