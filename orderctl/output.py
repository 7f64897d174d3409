"""The shape of every `orderctl` command's ``--json`` document.

The ``--json`` shapes are the operator HTTP API's own models (:mod:`service.operations.models`)
where
a command is an operator operation, so the CLI and the API share field names, plus the models
below for what only the CLI does. :func:`shapes` maps each command to its shape(s);
``python -m orderctl.output`` prints the reference section of docs/orderctl.md from it.

``--json`` carries the exact stored strings; what people read goes through
:mod:`orderctl.plain_text`.
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Shape(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ComponentView(_Shape):
    name: str = Field(
        description="azurite, broker, fakes, host-0, host-1, ... (the pattern app), operations "
        "(the operations app: operator HTTP API, dashboard, retention timer)"
    )
    pid: int = Field(description="0 while it is down (being restarted)")
    running: bool
    address: str = Field(description="Where it serves (empty for the pattern app's hosts)")
    restarts: int = Field(description="Restarts by the supervisor over the stack's life")
    log: str = Field(description="Its log file (the previous starts' logs are in <log>.1)")


class StackView(_Shape):
    """`up`, `ps`: the local stack and its processes."""

    workdir: str
    running: bool
    supervisor_pid: int = Field(description="The process keeping the stack alive; 0: none")
    api_url: str = Field(
        description="The operator HTTP API (the operations app), stable while it runs"
    )
    persistent: bool = Field(
        description="Azurite and the broker keep their data across restarts of either"
    )
    already_running: bool = Field(
        default=False, description="`up` found this stack running and started nothing"
    )
    telemetry_dir: str = Field(
        default="",
        description="Where the hosts write spans and metrics (`up --telemetry`); empty: off",
    )
    components: list[ComponentView]


class DownView(_Shape):
    """`down`: what was stopped."""

    workdir: str
    was_running: bool
    stopped: dict[str, int] = Field(description="Process name -> PID stopped")


class SubmitView(_Shape):
    """`submit`: the order sent; with ``--wait``, also how it ended (the exit code says it
    too: 0 Processed, 3 Error, 4 still in flight when the wait ended)."""

    order_id: str
    workflow: str
    total_cents: int
    currency: str
    state: str | None = Field(
        default=None, description="With --wait: Processed, Error, or the state it was still in"
    )
    waited_s: float | None = Field(default=None, description="With --wait: seconds waited")
    order: Any = Field(
        default=None, description="With --wait: the order as it ended (an OrderDetail)"
    )


class FaultView(_Shape):
    """`fault`: the faults the running stack's fake services inject now."""

    fakes_url: str
    source: str = Field(
        description="Where the profile came from: clean, flaky, chaotic, stress (shipped), a "
        "file's path, or 'set at run time'"
    )
    description: str
    profile: dict[str, Any] = Field(
        description="The profile's rules that differ from a clean service (the profile file's "
        "format)"
    )
    declines_pending: dict[str, int] = Field(
        description="Service -> forward calls it will still decline (--decline-next)"
    )
    changed: bool = Field(description="This call changed the faults")


class WorkflowStepView(_Shape):
    name: str
    agent: str
    operation: str
    undo_operation: str | None


class WorkflowVersionView(_Shape):
    ref: str = Field(description="name@version, what an order records")
    current: bool = Field(description="new orders of this workflow take this version")
    steps: list[WorkflowStepView]
    in_flight: int
    in_error: int


class WorkflowsView(_Shape):
    """`workflows`: the versions this code carries, the orders on each, and whether this code
    may be deployed over them (``deployable``; with ``--check`` the exit code says it too)."""

    versions: list[WorkflowVersionView]
    needed_but_not_carried: list[str] = Field(description="refs orders need that the code lacks")
    deployable: bool
    verdict: str


class WorkflowDiffView(_Shape):
    """`workflow-diff A B`: what changed from version A to version B, one line per change."""

    old: str
    new: str
    changes: list[str]


class MigrateView(_Shape):
    """`migrate`: the orders of one version moved (or, in a dry run, that would move) to
    another, and those refused by reason."""

    from_ref: str
    to_ref: str
    dry_run: bool
    examined: int
    migrated: int
    refused: dict[str, int]


class TraceSpanView(_Shape):
    name: str
    kind: str = Field(description="CLIENT, SERVER, CONSUMER, PRODUCER or INTERNAL")
    role: str = Field(description="The process that wrote it: host, orderctl")
    start: datetime
    offset_ms: float = Field(description="Milliseconds after its trace's first span started")
    duration_ms: float
    status: str = Field(description="UNSET, OK or ERROR")
    attributes: dict[str, Any] = Field(description="As recorded: order.id, queue, ...")
    orphan: bool = Field(description="Its parent span is not in the files")
    children: list[TraceSpanView]


class TraceTreeView(_Shape):
    trace_id: str
    start: datetime
    offset_ms: float = Field(description="Milliseconds after the order's first trace started")
    duration_ms: float = Field(description="From its first span's start to its last span's end")
    why: str = Field(
        description="For a trace other than the first: why those hops are a trace of their own"
    )
    spans: list[TraceSpanView] = Field(description="Its root spans, each with its children")


class TraceView(_Shape):
    """`trace ID`: the order's spans from the local telemetry files, one tree per trace, in
    time order."""

    order_id: str
    directory: str
    span_count: int
    traces: list[TraceTreeView]


class ErrorView(_Shape):
    """On failure, with ``--json``: one document on stdout (and the one-line error on
    stderr); the exit code is not 0."""

    error: str
    exit_code: int


def shapes() -> dict[str, tuple[Any, ...]]:
    """Each command's ``--json`` document: one of these (dead-letters: the summary without a
    QUEUE, the page with one, the action's outcome for replay and purge; status: the order, or
    with --watch one WatchView per line, a change each; resubmit and cancel: the action on one
    order, or the bulk view with a filter). A failure prints :class:`ErrorView` instead.
    (Imported here, not at the top: the operator models and the demo load the Azure SDKs, and
    every `orderctl` start, shell completion included, would pay for that.)"""
    from orderctl.demo import Summary as DemoSummary
    from service.operations.models import (
        AckView,
        ActionView,
        AlertPage,
        ArchivedOrderView,
        BulkView,
        DeadLetterActionView,
        DeadLetterLogView,
        DeadLetterPage,
        DeadLetterSummary,
        HealthView,
        OrderDetail,
        OrderPage,
        PurgeRunsView,
        PurgeView,
        SupervisorView,
        WatchView,
    )

    return {
        "up": (StackView,),
        "down": (DownView,),
        "ps": (StackView,),
        "submit": (SubmitView,),
        "status": (OrderDetail, WatchView),
        "trace": (TraceView,),
        "orders": (OrderPage,),
        "alerts": (AlertPage,),
        "ack": (AckView,),
        "resubmit": (ActionView, BulkView),
        "cancel": (ActionView, BulkView),
        "restart": (ActionView,),
        "supervisor": (SupervisorView,),
        "purge": (PurgeView,),
        "purges": (PurgeRunsView,),
        "archived": (ArchivedOrderView,),
        "dead-letters": (DeadLetterSummary, DeadLetterPage, DeadLetterActionView),
        "dead-letter-log": (DeadLetterLogView,),
        "fault": (FaultView,),
        "health": (HealthView,),
        "demo": (DemoSummary,),
        "workflows": (WorkflowsView,),
        "workflow-diff": (WorkflowDiffView,),
        "migrate": (MigrateView,),
    }


def to_json(value: BaseModel) -> str:
    return value.model_dump_json(indent=2) + "\n"


def write_json(value: BaseModel) -> None:
    """One JSON document on stdout, written as is: never through rich (no markup, no wrap)."""
    sys.stdout.write(to_json(value))
    sys.stdout.flush()


def write_json_line(value: BaseModel) -> None:
    """One JSON document on one line of stdout (JSON lines: a stream of documents)."""
    sys.stdout.write(value.model_dump_json() + "\n")
    sys.stdout.flush()


def validate(command: str, document: object) -> Any:
    """``document`` read as one of ``command``'s shapes; raises ValueError if it is none."""
    problems = []
    for shape in shapes()[command]:
        try:
            return TypeAdapter(shape).validate_python(document)
        except ValueError as error:
            problems.append(f"{shape.__name__}: {error}")
    raise ValueError(f"{command} --json matches none of its shapes: " + " | ".join(problems))


def reference() -> str:
    """The ``--json`` reference of docs/orderctl.md: each command's shape(s) and their fields,
    then the shapes nested in them."""
    lines = []
    nested: dict[str, dict[str, Any]] = {}
    for command, options in shapes().items():
        names = " or ".join(f"`{shape.__name__}`" for shape in options)
        lines.append(f"### `orderctl {command} --json`: {names}\n")
        for shape in options:
            schema = TypeAdapter(shape).json_schema(mode="serialization")
            nested |= schema.get("$defs", {})
            if len(options) > 1:
                lines.append(f"`{shape.__name__}`:\n")
            lines.extend(_fields(schema))
            lines.append("")
    lines.append("### Nested shapes\n")
    for name in sorted(nested):
        lines.append(f"`{name}`:\n")
        lines.extend(_fields(nested[name]))
        lines.append("")
    return "\n".join(lines)


def _fields(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", ()))
    rows = []
    for name, spec in schema.get("properties", {}).items():
        note = " ".join(spec.get("description", "").split())
        optional = "" if name in required else " (optional)"
        rows.append(f"- `{name}` ({_kind(spec)}){optional}" + (f": {note}" if note else ""))
    return rows


def _kind(spec: dict[str, Any]) -> str:
    if "$ref" in spec:
        return spec["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in spec:
        return " or ".join(_kind(s) for s in spec["anyOf"])
    kind = spec.get("type", "any")
    if kind == "array":
        return f"list of {_kind(spec.get('items', {}))}"
    if kind == "object" and isinstance(spec.get("additionalProperties"), dict):
        return f"map to {_kind(spec['additionalProperties'])}"
    if spec.get("format") == "date-time":
        return "date-time"
    return str(kind)


if __name__ == "__main__":
    print(reference())
