"""Offline checks of infra/ against the code, the local settings and the broker's entity config.

No Bicep CLI and no Azure here: every ``.bicep`` file is parsed with pycep-parser (syntax and
structure only; it resolves no module, symbol or ARM schema), and the checks read the parsed
declarations statically. Each check takes paths and returns a list of problems (empty when all
is well), so ``tests/infra/test_mutations.py`` can run the very same checks on a mutated copy
and prove that they fail.

What the code reads and emits comes from the code itself (:func:`code_facts`): the settings
module is run against a recording environment, the bindings come from indexing ``function_app``
the way the Functions host does, the Supervisor's metrics from recording one tick's metrics
with an in-memory OpenTelemetry reader, the metric names the workbook must chart from
``adapters.metrics.NAMES`` and ``service.sweep_report.NAMES``, and what each function does to
queues,
tables, blob containers and secrets from reading its code (:mod:`tests.infra.code_access`),
which :func:`check_data_roles` holds against the role assignments of the app's identity. The
workbook's JSON and the KQL of its charts are read by :mod:`tests.infra.workbook`.

pycep renders a string literal and an identifier alike (``'orders'`` and ``orders`` both become
``"orders"``). The checks therefore take names from literal arrays as they are, and follow a
bare name through variables and module parameters only where an expression is expected; a name
the checks cannot read statically is reported, never guessed.

The templates deploy one of two shapes (:data:`SHAPES`), chosen by main.bicep's ``vnetEnabled``:
public endpoints, or a private network. A :class:`Layout` names the shape its checks read, and
:func:`run_all` runs every check in each. Reading a shape evaluates only what depends on that one
parameter (:meth:`Infra.value`): ``vnetEnabled ? a : b``, ``!x``, ``empty(x)`` and ``if (...)``
conditions, followed through variables, module parameters and module outputs. Any other condition
(``if (!empty(principalId))``) is the operator's choice at deploy time: its resource is read as
deployed, as before.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pycep import BicepParser

from tests.infra import code_access, workbook
from tests.infra.code_access import Access, CodeAccess

REPO_ROOT = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------------------ policy

SHAPE_PARAMETER = "vnetEnabled"
SHAPES: Mapping[str, Mapping[str, Any]] = {
    # Shape -> the main.bicep parameters that make it (docs/deploy.md, Private network).
    "public": {SHAPE_PARAMETER: False},
    "private": {SHAPE_PARAMETER: True},
}

HOST_SETTINGS: Mapping[str, str] = {
    # Settings of the Functions host itself, not read by the app code, so the "every setting is
    # used" rule exempts them by name. FUNCTIONS_EXTENSION_VERSION is deliberately not set:
    # Flex Consumption sets it itself (and the runtime comes from functionAppConfig).
    "AzureWebJobsStorage__blobServiceUri": "host storage, identity-based: its blobs",
    "AzureWebJobsStorage__tableServiceUri": "host storage, identity-based: its diagnostic events",
    "AzureWebJobsStorage__credential": "host storage, identity-based",
    "AzureWebJobsStorage__clientId": "host storage: which user-assigned identity",
    "APPLICATIONINSIGHTS_CONNECTION_STRING": "host telemetry target",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING": "host telemetry with Entra ID (local auth off)",
    "PYTHON_ENABLE_OPENTELEMETRY": "the Python worker makes the host's invocation span current "
    "in each call (adapters/telemetry.py)",
}

FORBIDDEN_SETTINGS: Mapping[str, str] = {
    "PYTHON_THREADPOOL_THREAD_COUNT": "the Python worker's threads run sync functions, and every "
    "function is async def (tests/unit/test_function_app.py): they run on its event loop",
    "ServiceBusConnection": "a connection string (secret); use the __fullyQualifiedNamespace form",
    "StateStorage": "a connection string (secret); use the __tableServiceUri form",
    "SUPERVISOR_LEASE_CONTAINER": "the Supervisor's blob lease is gone; its bucket leases are "
    "rows of SUPERVISION_TABLE",
    "AzureWebJobsStorage": "a connection string (secret); use the __blobServiceUri form",
    "AzureWebJobsStorage__accountName": "the host builds the public cloud's host names from it; "
    "name the services by their URIs (__blobServiceUri, __tableServiceUri), which every cloud "
    "and a private network resolve",
    "FUNCTIONS_WORKER_RUNTIME": "Flex Consumption rejects it; the runtime is functionAppConfig",
    "FUNCTIONS_EXTENSION_VERSION": "Flex Consumption sets it itself",
    "WEBSITE_TIME_ZONE": "Flex Consumption rejects it; schedules run in UTC",
    "WEBSITE_RUN_FROM_PACKAGE": "Flex Consumption deploys from functionAppConfig.deployment",
}

UNREFERENCED_QUEUES: Mapping[str, str] = {
    # Declared queues that no app setting names, and why they exist anyway.
    "order-status": "the default reply queue submitters name for StatusUpdate messages",
}

ARCHIVE_CONTAINER_SETTING = "ARCHIVE_CONTAINER"
BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"

ALLOWED_ROLES: Mapping[str, str] = {
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "Storage Blob Data Owner",
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": "Storage Blob Data Contributor",
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",
    "76199698-9eea-4c19-bc75-cec21354c6b6": "Storage Table Data Reader",
    "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39": "Azure Service Bus Data Sender",
    "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0": "Azure Service Bus Data Receiver",
    "3913510d-42f4-4e42-8a64-420c390055eb": "Monitoring Metrics Publisher",
    "4633458b-17de-408a-b874-0445c86b69e6": "Key Vault Secrets User",
}

KNOWN_BROAD_ROLES: Mapping[str, str] = {
    "8e3af657-a8ff-443c-a75c-2fe8c4bcb635": "Owner",
    "b24988ac-6180-49ef-a2ac-17ca41fa4eb2": "Contributor",
    "18d7d88d-d35e-4fb5-a5c3-7773c20a72d9": "User Access Administrator",
    "090c5cfd-751d-490a-894a-3ce6f1109419": "Azure Service Bus Data Owner",
    "17d1049b-9a84-46fb-8f53-869881c3d3ab": "Storage Account Contributor",
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": "Storage Queue Data Contributor",
}

REQUIRED_OUTPUTS = (
    "AZURE_LOCATION",
    "AZURE_TENANT_ID",
    "AZURE_RESOURCE_GROUP",
    "AZURE_FUNCTION_APP_NAME",
    "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE",
    "AZURE_STORAGE_TABLE_ENDPOINT",
)

# The Supervisor alerts (app/alerts.bicep): log search alerts on the Application Insights
# component, where the app's OpenTelemetry metrics land in customMetrics under their own names.
SUPERVISOR_LAG_METRIC = "supervisor.lag"
"""Gauge, seconds: how long the most overdue order had been due when a tick found it."""
SUPERVISOR_TICK_METRIC = "supervisor.tick.duration"
"""Recorded once by every completed tick: its absence means the Supervisor is not running."""
SUPERVISOR_METRIC_KINDS: Mapping[str, str | None] = {
    # Metric -> the OpenTelemetry data type the alert's aggregation makes sense for (None: any).
    SUPERVISOR_LAG_METRIC: "Gauge",  # max(value) of a gauge is the worst lag reported
    SUPERVISOR_TICK_METRIC: None,  # only counted
}
LAG_THRESHOLD_PARAMETER = "supervisorLagAlertSeconds"
LOG_ALERT_FREQUENCY = "PT5M"
SILENCE_WINDOW = "PT15M"

_GUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SETTING_REFERENCE = re.compile(r"%([A-Za-z0-9_]+)%")
_SECRET_FUNCTION = re.compile(r"\blist[A-Z][A-Za-z]*\s*\(")


class CheckError(Exception):
    """The infra cannot be read the way the checks expect (a problem in itself)."""


@dataclass(frozen=True)
class App:
    """One of the two function apps deployed from the one package: its entry module, the
    main.bicep module that deploys it (app/function.bicep), its azd service, and the flag of
    app/servicebus.bicep that marks the queues its identity may receive from."""

    name: str
    entry: str
    module: str
    service: str
    receive_flag: str

    def say(self, problems: Iterable[str]) -> list[str]:
        return [f"{self.name} app: {problem}" for problem in problems]


PATTERN = App("pattern", "function_app", "pattern", "pattern", "receivedByPattern")
OPERATIONS = App("operations", "operations_app", "operations", "operations", "receivedByOperations")
APPS = (PATTERN, OPERATIONS)
SCRIPT_FILE_SETTING = "PYTHON_SCRIPT_FILE_NAME"
"""The Python worker's setting naming the app's entry file (default function_app.py)."""


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """Where the checked files live, relative to a repository root (a real one or a copy), and
    which shape of the templates (:data:`SHAPES`) the checks read."""

    root: Path
    shape: str = "public"

    @property
    def infra(self) -> Path:
        return self.root / "infra"

    @property
    def main_bicep(self) -> Path:
        return self.infra / "main.bicep"

    @property
    def parameters_json(self) -> Path:
        return self.infra / "main.parameters.json"

    @property
    def broker_config(self) -> Path:
        return self.root / "devstack" / "servicebus" / "Config.json"

    @property
    def local_settings_example(self) -> Path:
        return self.root / "local.settings.json.example"

    @property
    def azure_yaml(self) -> Path:
        return self.root / "azure.yaml"

    @property
    def host_json(self) -> Path:
        return self.root / "host.json"


# --------------------------------------------------------------------------- parsing


@cache
def _parse_text(text: str) -> dict[str, Any]:
    return BicepParser().parse(text=text)


def parse_bicep(path: Path) -> dict[str, Any]:
    """pycep's dict for one file (raises whatever pycep raises on a syntax error)."""
    return _parse_text(path.read_text(encoding="utf-8"))


def bicep_files(infra: Path) -> list[Path]:
    return sorted(infra.rglob("*.bicep"))


def _unquote(key: str) -> str:
    return key[1:-1] if len(key) >= 2 and key[0] == key[-1] == "'" else key


@dataclass
class BicepFile:
    path: Path
    tree: dict[str, Any]

    @property
    def params(self) -> dict[str, Any]:
        return self.tree.get("parameters") or {}

    @property
    def variables(self) -> dict[str, Any]:
        return self.tree.get("variables") or {}

    @property
    def resources(self) -> dict[str, Any]:
        return self.tree.get("resources") or {}

    @property
    def modules(self) -> dict[str, Any]:
        return self.tree.get("modules") or {}

    @property
    def outputs(self) -> dict[str, Any]:
        return self.tree.get("outputs") or {}


@dataclass
class Infra:
    """All .bicep files under one infra/ directory, parsed. A module file deployed more than
    once (app/function.bicep: one per app) is read as one of its deployments: :meth:`bind`."""

    layout: Layout
    files: dict[Path, BicepFile] = field(default_factory=dict)
    bound: dict[Path, str] = field(default_factory=dict)
    """Module file -> the symbol of the main.bicep module whose parameters it is read with."""
    shape: Mapping[str, Any] = field(default_factory=dict)
    """main.bicep parameter -> its value in the shape read (:data:`SHAPES`)."""

    def bind(self, app: App) -> Infra:
        """This infra as ``app``'s deployment sees it: the module file ``app.module`` deploys
        takes that module's parameters."""
        return self.bind_module(app.module, f" (the {app.name} app)")

    def bind_module(self, symbol: str, what: str = "") -> Infra:
        """This infra as main.bicep's module ``symbol`` deploys its file (with its parameters)."""
        module = self.main.modules.get(symbol)
        if module is None or module.get("type") != "local":
            raise CheckError(f"infra/main.bicep has no module {symbol}{what}")
        path = _module_path(self.main.path, module["detail"]["path"])
        return dataclasses.replace(self, bound={**self.bound, path: symbol})

    @classmethod
    def load(cls, layout: Layout) -> Infra:
        if layout.shape not in SHAPES:
            raise CheckError(f"unknown shape {layout.shape!r}: one of {sorted(SHAPES)}")
        infra = cls(layout, shape=SHAPES[layout.shape])
        for path in bicep_files(layout.infra):
            try:
                infra.files[path.resolve()] = BicepFile(path, parse_bicep(path))
            except Exception as exc:
                raise CheckError(f"{_rel(layout, path)} does not parse: {exc}") from None
        if layout.main_bicep.resolve() not in infra.files:
            raise CheckError("infra/main.bicep is missing")
        return infra

    @property
    def main(self) -> BicepFile:
        return self.files[self.layout.main_bicep.resolve()]

    def rel(self, path: Path) -> str:
        return _rel(self.layout, path)

    def resources(
        self, type_: str, *, existing: bool = False
    ) -> Iterator[tuple[BicepFile, str, dict]]:
        """(file, symbol, resource) for every resource of ``type_`` (declared, or existing) that
        this shape may deploy: in a file it deploys, under no condition it makes false."""
        for bicep in self.files.values():
            if not self.deployed(bicep):
                continue
            for symbol, resource in bicep.resources.items():
                if (
                    resource.get("type") == type_
                    and bool(resource.get("existing")) == existing
                    and self.may_deploy(bicep, resource)
                ):
                    yield bicep, symbol, resource

    def one_resource(self, type_: str) -> tuple[BicepFile, str, dict]:
        found = list(self.resources(type_))
        if len(found) != 1:
            raise CheckError(f"expected exactly one declared {type_}, found {len(found)}")
        return found[0]

    def declarations(self, target: BicepFile) -> Iterator[tuple[BicepFile, str, dict]]:
        """(file, symbol, module) of every local module declaration that deploys ``target`` in
        this shape (only the one it is bound to, if it is), from a file this shape deploys."""
        chosen = self.bound.get(target.path.resolve())
        for bicep in self.files.values():
            for symbol, module in bicep.modules.items():
                if module.get("type") != "local" or chosen not in (None, symbol):
                    continue
                path = _module_path(bicep.path, module["detail"]["path"])
                deploys = path == target.path.resolve() and self.may_deploy(bicep, module)
                if deploys and self.deployed(bicep):
                    yield bicep, symbol, module

    def callers(self, target: BicepFile) -> Iterator[tuple[BicepFile, dict]]:
        """(file, module body: name, params) of every declaration that deploys ``target``."""
        for bicep, _, module in self.declarations(target):
            yield bicep, _body(module)

    def deployed(self, bicep: BicepFile) -> bool:
        """Whether this shape deploys the file: main.bicep, or a module some declaration of a
        deployed file may deploy."""
        return bicep is self.main or next(self.declarations(bicep), None) is not None

    def may_deploy(self, bicep: BicepFile, declaration: dict[str, Any]) -> bool:
        """Whether a resource or module declaration is deployed unless its condition is false
        in this shape (an unknown condition: deployed)."""
        condition = (declaration.get("config") or {}).get("condition")
        return condition is None or self.value(bicep, condition) is not False

    def module_file(self, bicep: BicepFile, symbol: str) -> BicepFile | None:
        """The file local module ``symbol`` of ``bicep`` deploys."""
        module = bicep.modules.get(symbol)
        if module is None or module.get("type") != "local":
            return None
        return self.files.get(_module_path(bicep.path, module["detail"]["path"]))

    def settle(self, bicep: BicepFile, expr: Any, depth: int = 0) -> tuple[BicepFile, Any]:
        """(file, expression) that ``expr`` comes down to in this shape: variables, module
        parameters (through the one declaration that deploys the file) and module outputs
        followed, and a conditional whose condition this shape decides replaced by its branch."""
        if depth > 50:
            raise CheckError(f"{self.rel(bicep.path)}: {_short(expr)} refers to itself")
        if isinstance(expr, str):
            if expr in bicep.variables:
                return self.settle(bicep, bicep.variables[expr]["value"], depth + 1)
            if expr in bicep.params and bicep is not self.main:
                callers = list(self.callers(bicep))
                if len(callers) == 1:
                    caller, config = callers[0]
                    passed = config.get("params") or {}
                    if expr in passed:
                        return self.settle(caller, passed[expr], depth + 1)
                    default = bicep.params[expr].get("default")
                    if default is not None:
                        return self.settle(bicep, default, depth + 1)
            return bicep, expr
        operator = expr.get("operator") if isinstance(expr, dict) and len(expr) == 1 else None
        if isinstance(operator, dict) and operator.get("type") == "conditional":
            operands = operator["operands"]
            condition = self.value(bicep, operands["condition"], depth + 1)
            if isinstance(condition, bool):
                branch = operands["true_value" if condition else "false_value"]
                return self.settle(bicep, branch, depth + 1)
        if isinstance(operator, dict) and operator.get("type") == "property_accessor":
            module, _, output = _flat(expr).partition(".outputs.")
            target = self.module_file(bicep, module) if output and "." not in output else None
            if target is not None and output in target.outputs:
                return self.settle(target, target.outputs[output]["value"], depth + 1)
        return bicep, expr

    def value(self, bicep: BicepFile, expr: Any, depth: int = 0) -> Any:
        """The value of ``expr`` in this shape, or :data:`UNKNOWN`: literals; main.bicep's shape
        parameters (any other parameter is the operator's choice: unknown); ``!x``; ``c ? a :
        b``; ``empty(x)``; through :meth:`settle`."""
        bicep, expr = self.settle(bicep, expr, depth)
        if isinstance(expr, str):
            if expr in bicep.params:
                return self.shape.get(expr, UNKNOWN) if bicep is self.main else UNKNOWN
            return expr
        if not isinstance(expr, dict):
            return expr  # bool, number, null, array
        operator, function = expr.get("operator"), expr.get("function")
        if len(expr) == 1 and isinstance(operator, dict):
            if operator.get("type") == "not":
                inner = self.value(bicep, operator["operands"]["bool_value"], depth + 1)
                return not inner if isinstance(inner, bool) else UNKNOWN
            return UNKNOWN
        if len(expr) == 1 and isinstance(function, dict):
            if function.get("type") == "empty":
                tested = self.value(bicep, function["parameters"]["item_to_test"], depth + 1)
                return _is_empty(tested)
            return UNKNOWN
        return expr  # an object literal

    def resolve(self, bicep: BicepFile, expr: Any) -> Any:
        """The literal value of ``expr`` in ``bicep``: follows variables and, for a module
        parameter, the value its single caller passes; a conditional this shape decides is its
        branch. Raises CheckError when not static."""
        if isinstance(expr, dict) and set(expr) == {"operator"}:
            op = expr["operator"]
            if op["type"] == "conditional":
                condition = self.value(bicep, op["operands"]["condition"])
                if isinstance(condition, bool):
                    branch = op["operands"]["true_value" if condition else "false_value"]
                    return self.resolve(bicep, branch)
            if op["type"] == "property_accessor":
                base = self.resolve(bicep, op["operands"]["operand_1"])
                key = op["operands"]["operand_2"]
                if isinstance(base, dict) and isinstance(key, str):
                    base = {_unquote(k): v for k, v in base.items()}
                    if key in base:
                        return self.resolve(bicep, base[key])
            raise CheckError(f"{self.rel(bicep.path)}: {_short(expr)} is not a static value")
        if isinstance(expr, dict) and set(expr) == {"function"}:
            raise CheckError(f"{self.rel(bicep.path)}: {_short(expr)} is not a static value")
        if not isinstance(expr, str):
            return expr
        if expr in bicep.variables:
            return self.resolve(bicep, bicep.variables[expr]["value"])
        if expr in bicep.params:
            callers = list(self.callers(bicep))
            if len(callers) == 1:
                caller, config = callers[0]
                params = config.get("params") or {}
                if expr in params:
                    return self.resolve(caller, params[expr])
            default = bicep.params[expr].get("default")
            if default is not None:
                return default
            raise CheckError(f"{self.rel(bicep.path)}: parameter {expr} has no static value")
        return expr


class _Unknown:
    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN: Any = _Unknown()
"""What :meth:`Infra.value` returns for a value the shape does not decide."""


def _is_empty(value: Any) -> Any:
    """``empty(value)``: a string with literal text beside its interpolations is never empty."""
    if isinstance(value, str) and "${" in value:
        return False if _INTERPOLATION.sub("", value) else UNKNOWN
    if isinstance(value, (str, list, dict)):
        return len(value) == 0
    return UNKNOWN


@cache
def _module_path(declaring: Path, relative: str) -> Path:
    return (declaring.parent / relative).resolve()


def _rel(layout: Layout, path: Path) -> str:
    try:
        return str(path.resolve().relative_to(layout.root.resolve()))
    except ValueError:
        return str(path)


def _short(expr: Any) -> str:
    text = json.dumps(expr, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _camel(name: str) -> str:
    return name[:1].lower() + name[1:]


def _body(resource: dict[str, Any]) -> dict[str, Any]:
    """The declaration body of a resource, inside its loop or condition if it has one."""
    config = resource.get("config") or {}
    if "loop_type" in config or "condition" in config:
        return config.get("config") or {}
    return config


def _checked(check: Callable[..., list[str]]) -> Callable[..., list[str]]:
    """Turn a CheckError raised while reading the infra into a reported problem."""

    def run(*args: Any, **kwargs: Any) -> list[str]:
        try:
            return check(*args, **kwargs)
        except CheckError as exc:
            return [str(exc)]

    run.__name__ = check.__name__
    run.__doc__ = check.__doc__
    return run


# ------------------------------------------------------------------ what the code reads


@dataclass(frozen=True)
class CodeFacts:
    """What the app code reads, taken from the code (see :func:`code_facts`)."""

    settings_read: frozenset[str]
    """Every setting name the app's entry point looks up when it loads, with an identity-based
    configuration (:func:`settings_read_on_load`)."""
    local_only: frozenset[str]
    """Connection-string settings: read locally, never set in Azure."""
    binding_settings: frozenset[str]
    """``%NAME%`` references in the indexed bindings (queue names, the timer schedule)."""
    binding_connections: frozenset[str]
    """Connection names of the bindings; the host reads their identity-based forms."""
    trigger_queue_settings: frozenset[str]
    """Settings naming the queues a Service Bus trigger consumes."""
    queue_settings: frozenset[str]
    """adapters.settings.QUEUE_SETTINGS: every queue the app sends to or receives from."""
    operator_read_queue_settings: frozenset[str] = frozenset()
    """Settings naming the queues the code itself reads (the operator API peeks and settles
    alerts and dead letters), besides what the triggers receive: from :attr:`access`."""
    metrics: Mapping[str, str] = field(default_factory=dict, compare=False)
    """Metric name -> OpenTelemetry data type (Gauge, Sum, Histogram) of what one Supervisor
    tick records."""
    access: CodeAccess = field(default_factory=lambda: CodeAccess({}), compare=False)
    """What each function does to queues, tables, containers and secrets
    (:mod:`tests.infra.code_access`), its trigger's receives included."""
    http_auth_levels: Mapping[str, str] = field(default_factory=dict, compare=False)
    """HTTP-triggered function -> the ``authLevel`` of its trigger, as indexed."""
    metric_names: frozenset[str] = frozenset()
    """Every metric the code defines: ``adapters.metrics.NAMES | service.sweep_report.NAMES``."""
    metric_attributes: Mapping[str, frozenset[str]] = field(default_factory=dict, compare=False)
    """Metric -> the attributes it is recorded with (``adapters.metrics.ATTRIBUTES``,
    ``service.sweep_report.ATTRIBUTES``)."""

    @property
    def storage_name_settings(self) -> dict[str, str]:
        """Setting -> ``table`` or ``container``: the settings that name a table or a blob
        container the code uses."""
        kinds = {"table": "table", "blob": "container"}
        return {
            a.resource[1]: kinds[a.service]
            for accesses in self.access.accesses.values()
            for a in accesses
            if a.service in kinds and a.resource[0] == "setting"
        }

    @property
    def required_settings(self) -> frozenset[str]:
        host_reads = {
            f"{connection}__{part}"
            for connection in self.binding_connections
            for part in ("fullyQualifiedNamespace", "credential", "clientId")
        }
        return frozenset(
            (self.settings_read - self.local_only) | self.binding_settings | host_reads
        )


Facts = Mapping[str, CodeFacts]
"""Each app's :class:`CodeFacts`, by app name (:func:`code_facts`)."""


class _RecordingEnv(Mapping[str, str]):
    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = dict(values)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return self._values[key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def settings_read_by_code(root: Path = REPO_ROOT) -> tuple[set[str], set[str]]:
    """(names read, connection-string names) by ``RetentionSettings.from_env`` in its Azure
    form: every setting either app may read (the operations app's; what each one does read:
    :func:`settings_read_on_load`)."""
    from adapters.retention_settings import RetentionSettings

    env, local_only = azure_environment(root)
    recorder = _RecordingEnv(env)
    RetentionSettings.from_env(recorder)
    return recorder.read, local_only


_SETTINGS_ON_LOAD_SCRIPT = """
import json, sys
from adapters import settings

read = set()
looked_up = settings._Given.get_field_value

def recording(self, field, field_name):
    read.add(field_name)
    return looked_up(self, field, field_name)

settings._Given.get_field_value = recording
import ENTRY
json.dump(sorted(read), sys.stdout)
"""


def settings_read_on_load(root: Path, app: App) -> set[str]:
    """The settings ``app``'s entry point looks up when it loads (its check of the settings,
    :meth:`adapters.settings.Settings.check_on_load`), in a fresh interpreter whose environment
    is the Azure one (:func:`azure_environment`): the pattern app reads none of the retention
    purge's, the operations app reads them too."""
    from adapters.settings import CONNECTION_NAMES

    env, _ = azure_environment(root)
    settings = settings_read_by_code(root)[0] | env.keys()
    # This process's environment (PATH, the venv) less any app setting a test may have set.
    process = {
        name: value
        for name, value in os.environ.items()
        if name not in settings and not name.startswith(CONNECTION_NAMES)
    }
    read = _fresh_json(
        _SETTINGS_ON_LOAD_SCRIPT.replace("ENTRY", app.entry),
        root,
        f"loading {app.entry} with the Azure settings",
        env=process | env,
    )
    if not read:
        raise CheckError(f"{app.entry} read no setting when it loaded: it checks none on load")
    return set(read)


def azure_environment(root: Path = REPO_ROOT) -> tuple[dict[str, str], set[str]]:
    """(settings, connection-string names): local.settings.json.example with the connection
    strings replaced by identity-based endpoints, so the code takes the branch it takes in
    Azure."""
    from adapters import settings as settings_module
    from domain import signing
    from tests.support.keys import new_key_text

    example = json.loads(Layout(root).local_settings_example.read_text())["Values"]
    sb, st = settings_module.SERVICEBUS_CONNECTION, settings_module.STATE_STORAGE_CONNECTION
    local_only = {sb, st}
    env = {k: v for k, v in example.items() if k not in local_only}
    env |= {
        f"{sb}__fullyQualifiedNamespace": "example.servicebus.windows.net",
        f"{sb}__clientId": "00000000-0000-0000-0000-000000000000",
        f"{st}__tableServiceUri": "https://example.table.core.windows.net/",
        f"{st}__blobServiceUri": "https://example.blob.core.windows.net/",
        f"{st}__clientId": "00000000-0000-0000-0000-000000000000",
        # In Azure a Key Vault reference, resolved by the platform before the code reads it.
        signing.SIGNING_KEYS_SETTING: new_key_text("k1"),
    }
    return env, local_only


_INDEX_SCRIPT = """
import json, os, sys
import ENTRY as app_module

def source(function):
    code = function.get_user_function().__code__
    return {
        "function": function.get_function_name(),
        "path": os.path.relpath(code.co_filename),
        "line": code.co_firstlineno,
    }

json.dump(
    [
        {**json.loads(f.get_function_json()), SOURCE_KEY: source(f)}
        for f in app_module.app.get_functions()
    ],
    sys.stdout,
)
""".replace("SOURCE_KEY", repr("x-source"))
SOURCE_KEY = "x-source"
TRIGGER = "its serviceBusTrigger"
"""Where a function's trigger receives (the ``where`` of that Access)."""
"""The function's name, and where its user function is defined: ``{function, path, line}``."""


def indexed_functions(root: Path = REPO_ROOT, entry: str = PATTERN.entry) -> list[dict[str, Any]]:
    """The function.json documents the host indexes for the app ``entry`` (a module), from a
    fresh interpreter (the FunctionApp object allows one get_functions() call, and nothing leaks
    into the test process), each with where its user function is defined (:data:`SOURCE_KEY`)."""
    script = _INDEX_SCRIPT.replace("ENTRY", entry)
    return _fresh_json(script, root, f"indexing {entry}")


_ROUTES_SCRIPT = """
import json, os, sys
from fastapi.routing import APIRoute
import operations_app

def walk(routes):
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "original_router"):  # a router FastAPI includes lazily
            yield from walk(route.original_router.routes)
        else:
            raise SystemExit(f"cannot read route {route!r} of operations_app.api")

json.dump(
    {
        route.name: [os.path.relpath(route.endpoint.__code__.co_filename),
                     route.endpoint.__code__.co_firstlineno]
        for route in walk(operations_app.api.routes)
    },
    sys.stdout,
)
"""


def route_entries(root: Path = REPO_ROOT) -> dict[str, tuple[str, int]]:
    """Route name -> (path, line) of its endpoint: what the operations app's one HTTP function
    hands each request to (FastAPI), read from ``operations_app.api`` in a fresh interpreter."""
    found = _fresh_json(_ROUTES_SCRIPT, root, "listing the operations app's routes")
    return {name: (path, line) for name, (path, line) in found.items()}


def _fresh_json(script: str, root: Path, what: str, env: Mapping[str, str] | None = None) -> Any:
    """What ``script`` prints as JSON, run by a fresh interpreter in ``root`` (in ``env``:
    default, this process's environment)."""
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise CheckError(f"{what} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout)


_METRICS_SCRIPT = """
import json, sys
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
from service.sweep_report import record_tick
from service.sweep_report import TickReport
record_tick(TickReport())
json.dump({m.name: type(m.data).__name__ for rm in reader.get_metrics_data().resource_metrics
           for sm in rm.scope_metrics for m in sm.metrics}, sys.stdout)
"""


def metrics_recorded_by_a_tick(root: Path = REPO_ROOT) -> dict[str, str]:
    """Metric name -> data type of what ``record_tick`` records for one (empty) Supervisor tick,
    read with an in-memory OpenTelemetry reader in a fresh interpreter (the global meter
    provider is set once per process)."""
    return _fresh_json(_METRICS_SCRIPT, root, "recording the Supervisor's metrics")


_METRIC_NAMES_SCRIPT = """
import json, sys
from adapters.metrics import ATTRIBUTES as orders_attributes, NAMES as orders
from service.sweep_report import ATTRIBUTES as supervisor_attributes, NAMES as supervisor
attributes = {**orders_attributes, **supervisor_attributes}
json.dump({"names": sorted(orders | supervisor),
           "attributes": {name: sorted(keys) for name, keys in attributes.items()}}, sys.stdout)
"""


def metrics_defined(root: Path = REPO_ROOT) -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """``adapters.metrics.NAMES | service.sweep_report.NAMES`` of the code under ``root``, and each
    one's attributes, read in a fresh interpreter (like the other facts: nothing is imported
    into the test process)."""
    found = _fresh_json(_METRIC_NAMES_SCRIPT, root, "reading the metric names")
    attributes = {name: frozenset(keys) for name, keys in found["attributes"].items()}
    return frozenset(found["names"]), attributes


def code_facts(root: Path = REPO_ROOT) -> dict[str, CodeFacts]:
    """Each app's facts, by app name (:data:`APPS`)."""
    _, local_only = settings_read_by_code(root)
    metrics = metrics_recorded_by_a_tick(root)
    metric_names, metric_attributes = metrics_defined(root)
    return {
        app.name: CodeFacts(
            **_app_facts(root, app, settings_read_on_load(root, app), local_only),
            metrics=metrics,
            metric_names=metric_names,
            metric_attributes=metric_attributes,
        )
        for app in APPS
    }


def _app_facts(root: Path, app: App, read: set[str], local_only: set[str]) -> dict[str, Any]:
    from adapters.settings import QUEUE_SETTINGS

    binding_settings: set[str] = set()
    connections: set[str] = set()
    trigger_queues: set[str] = set()
    functions = indexed_functions(root, app.entry)
    access = code_access_of(root, functions, app)
    for function in functions:
        for binding in function["bindings"]:
            for value in binding.values():
                if isinstance(value, str):
                    binding_settings.update(_SETTING_REFERENCE.findall(value))
            if binding.get("connection"):
                connections.add(binding["connection"])
            if binding.get("type") == "serviceBusTrigger":
                trigger_queues.update(_SETTING_REFERENCE.findall(binding.get("queueName", "")))
    return {
        "settings_read": frozenset(read),
        "local_only": frozenset(local_only),
        "binding_settings": frozenset(binding_settings),
        "binding_connections": frozenset(connections),
        "trigger_queue_settings": frozenset(trigger_queues),
        "queue_settings": frozenset(QUEUE_SETTINGS.values()),
        "operator_read_queue_settings": frozenset(
            a.resource[1]
            for accesses in access.accesses.values()
            for a in accesses
            if a.kind == "receive" and a.resource[0] == "setting" and a.where != TRIGGER
        ),
        "access": access,
        "http_auth_levels": {
            function[SOURCE_KEY]["function"]: str(binding.get("authLevel", "")).lower()
            for function in functions
            for binding in function["bindings"]
            if binding.get("type") == "httpTrigger"
        },
    }


def code_access_of(root: Path, functions: list[dict[str, Any]], app: App = PATTERN) -> CodeAccess:
    """What each indexed function's code under ``root`` does (:func:`code_access.analyse`),
    plus the receives of its Service Bus trigger. For the operations app, whose one HTTP
    function is the worker's ASGI bridge (not our code), each route of its FastAPI app."""
    entries = {
        f[SOURCE_KEY]["function"]: (f[SOURCE_KEY]["path"], f[SOURCE_KEY]["line"])
        for f in functions
        if "site-packages" not in f[SOURCE_KEY]["path"]
    }
    if app is OPERATIONS:
        entries |= route_entries(root)
    receives = {
        f[SOURCE_KEY]["function"]: {
            Access("queue", "receive", ("setting", queue), TRIGGER)
            for binding in f["bindings"]
            if binding.get("type") == "serviceBusTrigger"
            for queue in _SETTING_REFERENCE.findall(binding.get("queueName", ""))
        }
        for f in functions
    }
    env, _ = azure_environment(REPO_ROOT)
    names = settings_read_by_code(REPO_ROOT)[0]
    analysed = code_access.analyse(root, entries, env, names, entry=app.entry)
    return dataclasses.replace(
        analysed,
        accesses={
            name: accesses | receives.get(name, set())
            for name, accesses in analysed.accesses.items()
        },
    )


# ----------------------------------------------------------------------------- checks


def check_bicep_parses(layout: Layout) -> list[str]:
    """Every .bicep parses; every local module and loadJsonContent file it names exists."""
    problems = []
    files = bicep_files(layout.infra)
    if not files:
        return [f"no .bicep file under {_rel(layout, layout.infra)}"]
    for path in files:
        text = path.read_text(encoding="utf-8")
        try:
            tree = parse_bicep(path)
        except Exception as exc:
            first = str(exc).strip().splitlines()[:3]
            problems.append(f"{_rel(layout, path)} does not parse: {' | '.join(first)}")
            continue
        for name, module in (tree.get("modules") or {}).items():
            if module.get("type") == "local":
                target = path.parent / module["detail"]["path"]
                if not target.is_file():
                    problems.append(f"{_rel(layout, path)}: module {name} -> missing {target.name}")
        for loaded in re.findall(r"load(?:Json|Text|Yaml)Content\(\s*'([^']+)'", text):
            if not (path.parent / loaded).is_file():
                problems.append(f"{_rel(layout, path)}: loads missing file {loaded}")
    return problems


@_checked
def check_api_versions(layout: Layout) -> list[str]:
    """No preview API version anywhere."""
    infra = Infra.load(layout)
    return [
        f"{infra.rel(bicep.path)}: {symbol} uses preview API {resource['api_version']}"
        for bicep in infra.files.values()
        for symbol, resource in bicep.resources.items()
        if "preview" in str(resource.get("api_version", ""))
    ]


def declared_queues(infra: Infra) -> dict[str, dict[str, Any]]:
    """Queue name -> declaration (``name``, ``receivedByApp``, ``properties``) of the Service
    Bus module, read from the literal array its queue resource loop iterates over."""
    bicep, symbol, resource = infra.one_resource("Microsoft.ServiceBus/namespaces/queues")
    loop = (resource.get("config") or {}).get("loop_type")
    if not loop:
        raise CheckError(f"{infra.rel(bicep.path)}: {symbol} must loop over a declared array")
    array = infra.resolve(bicep, loop["detail"]["array_name"])
    if not isinstance(array, list):
        raise CheckError(f"{infra.rel(bicep.path)}: the queue list is not a literal array")
    queues: dict[str, dict[str, Any]] = {}
    for entry in array:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            raise CheckError(f"{infra.rel(bicep.path)}: queue entry without a literal name")
        if name in queues:
            raise CheckError(f"{infra.rel(bicep.path)}: queue {name} is declared twice")
        queues[name] = entry
    return queues


def broker_queues(config_json: Path) -> dict[str, dict[str, Any]]:
    """Queue name -> properties (camelCase, as in ARM) of the emulator-format entity config."""
    config = json.loads(config_json.read_text())
    queues: dict[str, dict[str, Any]] = {}
    for namespace in config["UserConfig"]["Namespaces"]:
        for queue in namespace.get("Queues", []):
            queues[queue["Name"]] = {
                _camel(key): value for key, value in (queue.get("Properties") or {}).items()
            }
    return queues


@_checked
def check_queues_match_broker(layout: Layout) -> list[str]:
    """The Service Bus module declares exactly the broker's queues, with the same properties."""
    infra = Infra.load(layout)
    declared = declared_queues(infra)
    broker = broker_queues(layout.broker_config)
    config = json.loads(layout.broker_config.read_text())
    problems = [
        f"Config.json declares topics {[t.get('Name') for t in ns['Topics']]}; infra declares none"
        for ns in config["UserConfig"]["Namespaces"]
        if ns.get("Topics")
    ]
    for name in sorted(broker.keys() - declared.keys()):
        problems.append(f"queue {name} is in devstack/servicebus/Config.json but not in infra")
    for name in sorted(declared.keys() - broker.keys()):
        problems.append(f"queue {name} is in infra but not in devstack/servicebus/Config.json")
    for name in sorted(declared.keys() & broker.keys()):
        infra_props = declared[name].get("properties") or {}
        for key, expected in broker[name].items():
            actual = infra_props.get(key)
            if expected == "" and actual in (None, ""):
                continue  # ForwardTo / ForwardDeadLetteredMessagesTo: none
            if actual != expected or type(actual) is not type(expected):
                problems.append(
                    f"queue {name}: {key} is {actual!r} in infra, {expected!r} in Config.json"
                )
        for key in sorted(infra_props.keys() - broker[name].keys()):
            problems.append(f"queue {name}: infra sets {key}, which Config.json does not declare")
    return problems


def function_app_settings(infra: Infra) -> dict[str, Any]:
    """Setting name -> value expression of the function app (the ``appsettings`` config) as the
    deployment ``infra`` is bound to (:meth:`Infra.bind`) sets it."""
    configs = [
        (bicep, resource)
        for bicep, _, resource in infra.resources("Microsoft.Web/sites/config")
        if _body(resource).get("name") == "appsettings"
    ]
    if len(configs) != 1:
        raise CheckError(f"expected one sites/config 'appsettings' resource, found {len(configs)}")
    bicep, resource = configs[0]
    value = _resolve_object(infra, bicep, _body(resource)["properties"])
    return {_unquote(key): item for key, item in value.items()}


def _resolve_object(infra: Infra, bicep: BicepFile, expr: Any) -> dict[str, Any]:
    """Like Infra.resolve, but keeps the values of the object as expressions (they may be
    runtime values, e.g. module outputs); only the object itself must be static. A union() of
    objects is their merge, the later ones winning."""
    if isinstance(expr, dict) and set(expr) == {"function"}:
        function = expr["function"]
        if function["type"] != "union":
            raise CheckError(
                f"{infra.rel(bicep.path)}: {_short(expr)} must be an object or union()"
            )
        merged: dict[str, Any] = {}
        for part in function["parameters"].values():
            merged |= {_unquote(k): v for k, v in _resolve_object(infra, bicep, part).items()}
        return merged
    if isinstance(expr, dict) and not ({"operator", "function"} & set(expr)):
        return expr
    if isinstance(expr, str) and expr in bicep.variables:
        return _resolve_object(infra, bicep, bicep.variables[expr]["value"])
    if isinstance(expr, str) and expr in bicep.params:
        callers = list(infra.callers(bicep))
        if len(callers) == 1 and expr in (callers[0][1].get("params") or {}):
            caller, config = callers[0]
            return _resolve_object(infra, caller, config["params"][expr])
    raise CheckError(f"{infra.rel(bicep.path)}: {_short(expr)} is not a static object")


@_checked
def check_app_settings(layout: Layout, facts: Facts) -> list[str]:
    """Each function app sets every setting its code reads and nothing else but host settings;
    the operations app names its entry file for the Python worker, the pattern app takes the
    worker's default (function_app.py)."""
    infra = Infra.load(layout)
    problems = []
    for app in APPS:
        problems += app.say(_app_settings_problems(layout, infra.bind(app), facts[app.name], app))
    for _, symbol, resource in infra.resources("Microsoft.Web/sites"):
        site_config = (_body(resource).get("properties") or {}).get("siteConfig") or {}
        if "appSettings" in site_config:
            problems.append(f"{symbol}: app settings belong in the 'appsettings' config only")
    return problems


def _app_settings_problems(layout: Layout, infra: Infra, facts: CodeFacts, app: App) -> list[str]:
    settings = function_app_settings(infra)
    required = facts.required_settings
    problems = [
        f"app setting {name} is read by the code but not set in infra"
        for name in sorted(required - settings.keys())
    ]
    for name in sorted(HOST_SETTINGS.keys() - settings.keys()):
        problems.append(f"host setting {name} ({HOST_SETTINGS[name]}) is not set in infra")
    for name in sorted(settings.keys() - required - HOST_SETTINGS.keys() - {SCRIPT_FILE_SETTING}):
        reason = FORBIDDEN_SETTINGS.get(name, "nothing in the code or the host reads it")
        problems.append(f"app setting {name} is set in infra but must not be: {reason}")
    script = settings.get(SCRIPT_FILE_SETTING, f"{PATTERN.entry}.py")
    if script != f"{app.entry}.py":
        problems.append(
            f"{SCRIPT_FILE_SETTING} is {script!r}: the Python worker would load {script}, not "
            f"{app.entry}.py"
        )
    for name, value in settings.items():
        if isinstance(value, str) and re.search(r"AccountKey=|SharedAccessKey=", value):
            problems.append(f"app setting {name} holds a key")
        if name.endswith("__credential") and value != "managedidentity":
            problems.append(f"app setting {name} is {value!r}, must be 'managedidentity'")
        if name.endswith("__clientId") and not _last_name(value).lower().endswith("clientid"):
            problems.append(f"app setting {name} is {_short(value)}, not the identity's client id")
    return problems


@_checked
def check_queue_settings(layout: Layout, facts: Facts) -> list[str]:
    """Queue settings name declared queues, agree with local.settings.json.example, and every
    declared queue is named by a setting (or is a listed exception), in each app."""
    infra = Infra.load(layout)
    problems = []
    for app in APPS:
        problems += app.say(_queue_setting_problems(layout, infra.bind(app), facts[app.name]))
    return problems


def _queue_setting_problems(layout: Layout, infra: Infra, facts: CodeFacts) -> list[str]:
    declared = declared_queues(infra)
    settings = function_app_settings(infra)
    example = json.loads(layout.local_settings_example.read_text())["Values"]
    problems = []
    named = set()
    for setting in sorted(facts.queue_settings):
        value = settings.get(setting)
        if value is None:
            problems.append(f"queue setting {setting} is not set in infra")
            continue
        if not isinstance(value, str):
            problems.append(f"queue setting {setting} must be a literal queue name in infra")
            continue
        named.add(value)
        if value not in declared:
            problems.append(f"{setting} names queue {value!r}, which infra does not declare")
        if example.get(setting) != value:
            problems.append(
                f"{setting} is {value!r} in infra but {example.get(setting)!r} in "
                "local.settings.json.example"
            )
    for name in sorted(declared.keys() - named - UNREFERENCED_QUEUES.keys()):
        problems.append(f"queue {name} is declared but no app setting names it")
    for name in sorted(UNREFERENCED_QUEUES.keys() - declared.keys()):
        problems.append(f"listed exception {name} is not a declared queue any more")
    return problems


@_checked
def check_receiver_queues(layout: Layout, facts: Facts) -> list[str]:
    """Each app's flag in the Service Bus module (``receivedByPattern``,
    ``receivedByOperations``: which queues get the Receiver role for that app's identity) marks
    exactly the queues that app's code reads: those its Service Bus triggers consume, and those
    the operator API peeks or settles (a role on a queue covers its dead-letter sub-queue)."""
    infra = Infra.load(layout)
    declared = declared_queues(infra)
    problems = []
    for app in APPS:
        settings = function_app_settings(infra.bind(app))
        app_facts = facts[app.name]
        triggered = {settings.get(setting) for setting in app_facts.trigger_queue_settings}
        operator = {settings.get(setting) for setting in app_facts.operator_read_queue_settings}
        marked = {name for name, queue in declared.items() if queue.get(app.receive_flag) is True}
        read = triggered | operator
        problems += app.say(
            f"queue {name} is read by its code (a trigger or the operator API) but is not "
            f"{app.receive_flag} (no Receiver role)"
            for name in sorted(read - marked, key=str)
        )
        problems += app.say(
            f"queue {name} is {app.receive_flag} but nothing in its code reads it (Receiver role "
            "not needed)"
            for name in sorted(marked - read, key=str)
        )
    return problems


@_checked
def check_storage_names(layout: Layout, facts: Facts) -> list[str]:
    """Tables and containers declared in the storage module are exactly those the code of
    either app uses (through the settings that name them in that app, or by a literal name) plus
    each app's deployment package container, and agree with local.settings.json.example."""
    infra = Infra.load(layout)
    example = json.loads(layout.local_settings_example.read_text())["Values"]
    tables = set()
    for bicep, symbol, resource in infra.resources(
        "Microsoft.Storage/storageAccounts/tableServices/tables"
    ):
        tables |= _declared_names(infra, bicep, symbol, resource)
    containers = set()
    for bicep, symbol, resource in infra.resources(
        "Microsoft.Storage/storageAccounts/blobServices/containers"
    ):
        containers |= _declared_names(infra, bicep, symbol, resource)
    packages = {_deployment_container(infra.bind(app)) for app in APPS}
    expected: dict[str, set[str]] = {"table": set(), "container": packages}
    problems = []
    literal = {"table": "table", "blob": "container"}
    for app_facts in facts.values():
        for accesses in app_facts.access.accesses.values():
            for access in accesses:
                if access.service in literal and access.resource[0] == "literal":
                    expected[literal[access.service]].add(access.resource[1])
    named = {
        (app, setting, kind)
        for app in APPS
        for setting, kind in facts[app.name].storage_name_settings.items()
    }
    for app, setting, kind in sorted(named, key=lambda found: (found[1], found[0].name)):
        value = function_app_settings(infra.bind(app)).get(setting)
        if not isinstance(value, str):
            problems += app.say([f"{setting} must be a literal {kind} name in infra"])
            continue
        expected[kind].add(value)
        if example.get(setting, value) != value:
            problems.append(
                f"{setting} is {value!r} in infra but {example[setting]!r} in "
                "local.settings.json.example"
            )
    for kind, declared in (("table", tables), ("container", containers)):
        for name in sorted(expected[kind] - declared):
            problems.append(f"{kind} {name} is used but the storage module does not declare it")
        for name in sorted(declared - expected[kind]):
            problems.append(f"{kind} {name} is declared but nothing uses it")
    return problems


def _declared_names(infra: Infra, bicep: BicepFile, symbol: str, resource: dict) -> set[str]:
    config = resource["config"]
    loop = config.get("loop_type")
    if loop:
        origin, array = parameter_origin(infra, bicep, loop["detail"]["array_name"])
        array = infra.resolve(origin, array)
        item = loop["detail"]["item_name"]
        if config["config"].get("name") != item or not isinstance(array, list):
            raise CheckError(
                f"{infra.rel(bicep.path)}: {symbol} must loop over a literal array of names"
            )
        # Entries are names, or variables of the file that writes the array holding names.
        return {infra.resolve(origin, entry) for entry in array}
    return {infra.resolve(bicep, _body(resource).get("name"))}


def _deployment_container(infra: Infra) -> str:
    bicep, symbol, resource = infra.one_resource("Microsoft.Web/sites")
    try:
        value = _body(resource)["properties"]["functionAppConfig"]["deployment"]["storage"]["value"]
    except (KeyError, TypeError):
        raise CheckError(f"{symbol}: no functionAppConfig.deployment.storage.value") from None
    names = _INTERPOLATION.findall(value) if isinstance(value, str) else []
    if not names or not value.endswith("}"):
        raise CheckError(f"{symbol}: deployment storage value must end with the container name")
    return infra.resolve(bicep, names[-1])


def granted_roles(infra: Infra) -> list[tuple[str, str, str]]:
    """(file, symbol, role definition id) of every role assignment."""
    return [
        (
            infra.rel(bicep.path),
            symbol,
            _role_id(
                infra, bicep, (_body(resource).get("properties") or {}).get("roleDefinitionId")
            ),
        )
        for bicep, symbol, resource in infra.resources("Microsoft.Authorization/roleAssignments")
    ]


@_checked
def check_roles(layout: Layout, allowed: Mapping[str, str] = ALLOWED_ROLES) -> list[str]:
    """Only allowed role definitions are granted (or even mentioned), no custom roles."""
    infra = Infra.load(layout)
    problems = []

    def name(role_id: str) -> str:
        return KNOWN_BROAD_ROLES.get(role_id.lower(), "not on the allowed list")

    for path, symbol, role_id in granted_roles(infra):
        if role_id.lower() not in allowed:
            problems.append(f"{path}: {symbol} grants {role_id} ({name(role_id)})")
    for path in bicep_files(layout.infra):
        for guid in sorted(set(_GUID.findall(path.read_text()))):
            if guid.lower() not in allowed:
                problems.append(f"{_rel(layout, path)} mentions role id {guid} ({name(guid)})")
    for bicep, symbol, _ in infra.resources("Microsoft.Authorization/roleDefinitions"):
        problems.append(f"{infra.rel(bicep.path)}: {symbol} defines a custom role")
    if not granted_roles(infra):
        problems.append("no role assignment at all: the app's identity could not do anything")
    return problems


# ------------------------------------------------------------ data roles the code needs

ROLE_ACTIONS: Mapping[str, frozenset[tuple[str, str]]] = {
    # What each built-in data role lets its holder do, by (service, kind of operation); from
    # the roles' data actions in the Azure built-in roles reference.
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": frozenset({("blob", "read"), ("blob", "write")}),
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": frozenset({("blob", "read"), ("blob", "write")}),
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": frozenset({("table", "read"), ("table", "write")}),
    "76199698-9eea-4c19-bc75-cec21354c6b6": frozenset({("table", "read")}),
    "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39": frozenset({("queue", "send")}),
    "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0": frozenset({("queue", "receive")}),
    "4633458b-17de-408a-b874-0445c86b69e6": frozenset({("secret", "read")}),
}

SCOPE_TYPES: Mapping[str, tuple[str, bool]] = {
    # Resource type of a role assignment's scope -> (what it covers, whether it is one named
    # resource of that kind rather than all of them).
    "Microsoft.Storage/storageAccounts": ("storage", False),
    "Microsoft.Storage/storageAccounts/blobServices": ("blob", False),
    "Microsoft.Storage/storageAccounts/blobServices/containers": ("blob", True),
    "Microsoft.Storage/storageAccounts/tableServices": ("table", False),
    "Microsoft.Storage/storageAccounts/tableServices/tables": ("table", True),
    "Microsoft.ServiceBus/namespaces": ("queue", False),
    "Microsoft.ServiceBus/namespaces/queues": ("queue", True),
    "Microsoft.KeyVault/vaults": ("secret", False),
    "Microsoft.KeyVault/vaults/secrets": ("secret", True),
}
_WHOLE = {"queue": "the namespace", "table": "the storage account", "blob": "the storage account"}
_KEY_VAULT_REFERENCE = re.compile(r"@Microsoft\.KeyVault\((?P<args>[^)]*)\)")


@dataclass(frozen=True)
class Grant:
    """One role assignment: who, which role, on what."""

    role_id: str
    principal: str
    """Where the principal id comes from, e.g. ``identity.outputs.principalId``."""
    scope: str
    """What the scope covers: a SCOPE_TYPES kind, ``group`` (no scope: the resource group)
    or ``other``."""
    names: frozenset[str] | None
    """The one resource (or, for a loop, each resource) of that kind; None: all of them."""
    where: str

    def covers(self, service: str, kind: str, name: str | None) -> bool:
        """Whether this grant allows ``kind`` on the ``service`` resource ``name`` (None: a
        resource named at run time, which only a grant on all of them covers)."""
        if (service, kind) not in ROLE_ACTIONS.get(self.role_id, frozenset()):
            return False
        if self.scope == "group" or (self.scope == "storage" and service in ("table", "blob")):
            return True
        if self.scope != service:
            return False
        if self.names is None:
            return True
        return name is not None and name.lower() in {n.lower() for n in self.names}


def role_grants(infra: Infra) -> list[Grant]:
    grants = []
    for bicep, symbol, resource in infra.resources("Microsoft.Authorization/roleAssignments"):
        body = _body(resource)
        props = body.get("properties") or {}
        scope, names = _scope(infra, bicep, body.get("scope"))
        grants.append(
            Grant(
                role_id=_role_id(infra, bicep, props.get("roleDefinitionId")).lower(),
                principal=_origin_text(infra, bicep, props.get("principalId")),
                scope=scope,
                names=names,
                where=f"{infra.rel(bicep.path)}: {symbol}",
            )
        )
    return grants


def _role_id(infra: Infra, bicep: BicepFile, role: Any) -> str:
    if isinstance(role, dict) and role.get("function", {}).get("type") == (
        "subscription_resource_id"
    ):
        role = role["function"]["parameters"]["resource_name_1"]
    try:
        return str(infra.resolve(bicep, role))
    except CheckError:
        return f"<not static: {_short(role)}>"


def _flat(expr: Any) -> str:
    """``identity.outputs.principalId`` for that accessor chain; a bare name as it is."""
    if isinstance(expr, str):
        return expr
    operator = expr.get("operator", {}) if isinstance(expr, dict) else {}
    operands = operator.get("operands") or {}
    if operator.get("type") == "property_accessor":
        return f"{_flat(operands['operand_1'])}.{_flat(operands['operand_2'])}"
    if operator.get("type") == "index_accessor":
        return f"{_flat(operands['operand_1'])}[{_flat(operands['operand_2'])}]"
    return _short(expr)


def _origin_text(infra: Infra, bicep: BicepFile, expr: Any) -> str:
    return _flat(parameter_origin(infra, bicep, expr)[1])


def _scope(infra: Infra, bicep: BicepFile, scope: Any) -> tuple[str, frozenset[str] | None]:
    if scope is None:
        return "group", None
    operator = scope.get("operator", {}) if isinstance(scope, dict) else {}
    if operator.get("type") == "index_accessor":
        scope = operator["operands"]["operand_1"]
    resource = bicep.resources.get(scope) if isinstance(scope, str) else None
    if resource is None:
        raise CheckError(f"{infra.rel(bicep.path)}: role scope {_short(scope)} is not a resource")
    kind, named = SCOPE_TYPES.get(resource.get("type", ""), ("other", False))
    return kind, frozenset(_resource_names(infra, bicep, resource)) if named else None


def _resource_names(infra: Infra, bicep: BicepFile, resource: dict[str, Any]) -> list[str]:
    """The name of a resource, or of each resource its loop declares."""
    config = resource.get("config") or {}
    loop = config.get("loop_type")
    name = _body(resource).get("name")
    if not loop:
        return [str(infra.resolve(bicep, name))]
    item = loop["detail"]["item_name"]
    names = []
    for element in _static_array(infra, bicep, loop["detail"]["array_name"]):
        value = _apply(element, item, name)
        if not isinstance(value, str):
            raise CheckError(f"{infra.rel(bicep.path)}: a looped resource name is not static")
        names.append(value)
    return names


def _static_array(infra: Infra, bicep: BicepFile, expr: Any) -> list[Any]:
    """A literal array: through variables, module parameters and module outputs, and the
    ``map``/``filter`` of one with property lambdas (``filter(queues, q => q.receivedByApp)``)."""
    if isinstance(expr, list):
        return expr
    if isinstance(expr, str) and expr in bicep.variables:
        return _static_array(infra, bicep, bicep.variables[expr]["value"])
    if isinstance(expr, str) and expr in bicep.params:
        caller, passed = parameter_origin(infra, bicep, expr)
        if caller is not bicep or passed != expr:
            return _static_array(infra, caller, passed)
    if isinstance(expr, dict) and "loop_type" in expr:  # [for item in array: expression]
        detail = expr["loop_type"]["detail"]
        items = _static_array(infra, bicep, detail["array_name"])
        return [_apply(item, detail["item_name"], expr["config"]) for item in items]
    function = expr.get("function") if isinstance(expr, dict) else None
    if function and function["type"] in ("map", "filter"):
        params = list(function["parameters"].values())
        items = _static_array(infra, bicep, params[0])
        lambda_ = params[1].get("detail") or {}
        var, body = lambda_.get("var_1"), lambda_.get("expression")
        if function["type"] == "filter":
            return [item for item in items if _apply(item, var, body) is True]
        return [_apply(item, var, body) for item in items]
    flat = _flat(expr) if isinstance(expr, dict) else ""
    module, _, output = flat.partition(".outputs.")
    if output and module in bicep.modules and bicep.modules[module].get("type") == "local":
        path = (bicep.path.parent / bicep.modules[module]["detail"]["path"]).resolve()
        target = infra.files[path]
        return _static_array(infra, target, target.outputs[output]["value"])
    raise CheckError(f"{infra.rel(bicep.path)}: {_short(expr)} is not a static array")


def _apply(element: Any, var: str, body: Any) -> Any:
    """``body`` (the item itself, or a property of it) for one array element."""
    if body == var:
        return element
    path = _flat(body).split(".")
    if path[0] != var or not isinstance(element, dict):
        return None
    value: Any = element
    for key in path[1:]:
        value = (
            {_unquote(k): v for k, v in value.items()}.get(key) if isinstance(value, dict) else None
        )
    return value


def app_identity(infra: Infra) -> str:
    """The module whose user-assigned identity the function app runs as (``identity``)."""
    bicep, symbol, site = infra.one_resource("Microsoft.Web/sites")
    keys = list((_body(site).get("identity") or {}).get("userAssignedIdentities") or {})
    names = [n for key in keys for n in _INTERPOLATION.findall(key)]
    if len(names) != 1:
        raise CheckError(f"{symbol}: expected one user-assigned identity, found {keys}")
    origin = _origin_text(infra, bicep, names[0])
    if not origin.endswith(".outputs.id"):
        raise CheckError(f"{symbol}: its identity is {origin}, not an identity module's id")
    return origin.removesuffix(".outputs.id")


def key_vault_references(infra: Infra) -> dict[str, str]:
    """App setting -> the Key Vault secret it is a reference to (``@Microsoft.KeyVault(...)``,
    resolved by the platform before the code reads the setting)."""
    found = {}
    for setting, value in function_app_settings(infra).items():
        match = _KEY_VAULT_REFERENCE.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            continue
        args = dict(part.split("=", 1) for part in match["args"].split(";") if "=" in part)
        if "SecretName" in args:
            found[setting] = args["SecretName"]
            continue
        reference = re.findall(r"\$\{([^}]+)\}", args.get("SecretUri", ""))
        module, _, output = (reference[0] if reference else "").partition(".outputs.")
        if not output or module not in infra.main.modules:
            raise CheckError(f"app setting {setting}: cannot tell which secret {value} names")
        path = (infra.main.path.parent / infra.main.modules[module]["detail"]["path"]).resolve()
        target = infra.files[path]
        secret = _flat(target.outputs[output]["value"]).split(".")[0]
        resource = target.resources.get(secret) or {}
        if resource.get("type") != "Microsoft.KeyVault/vaults/secrets":
            raise CheckError(f"app setting {setting}: {reference[0]} is not a Key Vault secret")
        found[setting] = str(infra.resolve(target, _body(resource).get("name")))
    return found


def _access_name(access: Any, settings: Mapping[str, Any]) -> str | None:
    """The resource an access names, as the deployment names it (None: named at run time)."""
    origin, name = access.resource
    if origin == "runtime":
        return None
    if origin == "literal":
        return name
    value = settings.get(name)
    if not isinstance(value, str):
        raise CheckError(f"app setting {name} names a {access.service} but is not a literal")
    return value


def _roles_for(service: str, kind: str) -> str:
    return " or ".join(
        sorted(
            ALLOWED_ROLES[r] for r, actions in ROLE_ACTIONS.items() if (service, kind) in actions
        )
    )


@_checked
def check_data_roles(layout: Layout, facts: Facts) -> list[str]:
    """Every operation a function's (or route's) code performs on a queue, table, container or
    secret (:mod:`tests.infra.code_access`), and every Key Vault reference among the app
    settings, is allowed by a role assignment of that app's own identity whose scope covers
    that resource."""
    infra = Infra.load(layout)
    problems = []
    for app in APPS:
        problems += app.say(_data_role_problems(infra.bind(app), facts[app.name]))
    return problems


def _data_role_problems(infra: Infra, facts: CodeFacts) -> list[str]:
    settings = function_app_settings(infra)
    identity = app_identity(infra)
    grants = [g for g in role_grants(infra) if g.principal == f"{identity}.outputs.principalId"]
    access = facts.access
    problems = [
        f"{where}: the role check cannot classify this client call (add it to "
        "tests/infra/code_access.py OPERATIONS as a read or a write)"
        for where in access.unclassified
    ]
    problems += [
        f"{where}: an Azure operation on a client the role check lost track of (say which "
        "client it is: annotate or assign it where the code can see it)"
        for where in access.unfollowed
    ]
    uncovered: dict[tuple[str, str, str | None], list[tuple[str, Any]]] = {}
    for function, operations in sorted(access.accesses.items()):
        for operation in sorted(operations):
            name = _access_name(operation, settings)
            if not any(g.covers(operation.service, operation.kind, name) for g in grants):
                key = (operation.service, operation.kind, name)
                uncovered.setdefault(key, []).append((function, operation))
    for (service, kind, name), where in uncovered.items():
        functions = sorted({function for function, _ in where})
        first = where[0][1]
        scope = (
            f"{service} {name!r} or {_WHOLE.get(service, 'wider')}"
            if name
            else (_WHOLE.get(service, "every resource"))
        )
        problems.append(
            f"{', '.join(functions)}: {first.describe(settings)}"
            + (f" (and {len(where) - 1} more)" if len(where) > 1 else "")
            + f", but no role of the app identity allows it: grant {_roles_for(service, kind)} "
            f"on {scope}"
        )
    problems += _key_vault_reference_problems(infra, identity, grants)
    return problems


HOST_ROLES: Mapping[str, str] = {
    # Roles an app's identity holds for the Functions host, not for its code.
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "the Functions host's storage (AzureWebJobsStorage)",
    "3913510d-42f4-4e42-8a64-420c390055eb": "the host's and the worker's telemetry",
}


@_checked
def check_surplus_roles(layout: Layout, facts: Facts) -> list[str]:
    """No app identity holds a role its code never uses: each of its role assignments allows
    some operation of that app's code, or a Key Vault reference among its app settings, or is
    one the Functions host needs (:data:`HOST_ROLES`). With :func:`check_data_roles` (every
    operation covered), each app holds the roles its own code needs and no others.

    Nor on more queues than it uses them on: a Service Bus role on the whole namespace is
    surplus unless the code uses it on a queue named at run time (a submitter's reply queue);
    an app that names every queue it sends to or receives from holds the role on those queues.
    (Table roles stay on the storage account: the Functions host writes tables of its own.)"""
    infra = Infra.load(layout)
    problems = []
    for app in APPS:
        bound = infra.bind(app)
        settings = function_app_settings(bound)
        identity = app_identity(bound)
        used = {
            (operation.service, operation.kind, _access_name(operation, settings))
            for operations in facts[app.name].access.accesses.values()
            for operation in operations
        }
        used |= {("secret", "read", secret) for secret in key_vault_references(bound).values()}
        for grant in role_grants(bound):
            if grant.principal != f"{identity}.outputs.principalId" or grant.role_id in HOST_ROLES:
                continue
            role = ALLOWED_ROLES.get(grant.role_id, grant.role_id)
            covered = [use for use in used if grant.covers(*use)]
            if not covered:
                problems += app.say(
                    [f"{grant.where} grants {role} to its identity, but nothing in its code "
                     "needs it: drop it (least privilege)"]
                )  # fmt: skip
            elif grant.names is None and {s for s, _, _ in covered} == {"queue"}:
                named = sorted({str(name) for _, _, name in covered})
                if None not in {name for _, _, name in covered}:  # none named at run time
                    problems += app.say(
                        [f"{grant.where} grants {role} to its identity on every queue of the "
                         f"namespace, but its code uses it only on {', '.join(named)}: grant "
                         "it on those queues alone (least privilege)"]
                    )  # fmt: skip
    return problems


def _key_vault_reference_problems(infra: Infra, identity: str, grants: list[Grant]) -> list[str]:
    references = key_vault_references(infra)
    if not references:
        return []
    problems = []
    bicep, symbol, site = infra.one_resource("Microsoft.Web/sites")
    chosen = (_body(site).get("properties") or {}).get("keyVaultReferenceIdentity")
    if chosen is None or _origin_text(infra, bicep, chosen) != f"{identity}.outputs.id":
        problems.append(
            f"{infra.rel(bicep.path)}: {symbol}: keyVaultReferenceIdentity must be the app's "
            f"user-assigned identity ({identity}.outputs.id): the platform resolves Key Vault "
            "references with it, and otherwise with a system-assigned identity the app has not"
        )
    for setting, secret in sorted(references.items()):
        if not any(g.covers("secret", "read", secret) for g in grants):
            problems.append(
                f"app setting {setting} is a Key Vault reference to secret {secret!r}, but no "
                f"role of the app identity allows reading it: grant {_roles_for('secret', 'read')} "
                "on that secret"
            )
    return problems


@_checked
def check_required_roles(layout: Layout) -> list[str]:
    """Each allowed app role is actually granted (the app cannot run without them)."""
    infra = Infra.load(layout)
    granted = {role_id.lower() for _, _, role_id in granted_roles(infra)}
    return [
        f"role {role} ({role_id}) is never granted"
        for role_id, role in ALLOWED_ROLES.items()
        if role_id not in granted
    ]


@_checked
def check_security(layout: Layout) -> list[str]:
    """Shared keys and local auth off, TLS 1.2, HTTPS only, no secrets read in templates."""
    infra = Infra.load(layout)
    problems = []

    def expect(kind: str, symbol: str, props: dict, key: str, value: Any) -> None:
        if props.get(key) != value:
            problems.append(f"{kind} {symbol}: {key} is {props.get(key)!r}, must be {value!r}")

    for _, symbol, res in infra.resources("Microsoft.Storage/storageAccounts"):
        props = _body(res).get("properties") or {}
        expect("storage account", symbol, props, "allowSharedKeyAccess", False)
        expect("storage account", symbol, props, "minimumTlsVersion", "TLS1_2")
        expect("storage account", symbol, props, "supportsHttpsTrafficOnly", True)
        expect("storage account", symbol, props, "allowBlobPublicAccess", False)
    namespaces = list(infra.resources("Microsoft.ServiceBus/namespaces"))
    for bicep, symbol, res in namespaces:
        props = _body(res).get("properties") or {}
        expect("Service Bus namespace", symbol, props, "disableLocalAuth", True)
        expect("Service Bus namespace", symbol, props, "minimumTlsVersion", "1.2")
        sku = _sku_name(infra, bicep, res)
        if sku not in ("Standard", "Premium"):
            problems.append(
                f"Service Bus namespace {symbol}: sku {sku!r} has no duplicate "
                "detection or scheduled messages; use Standard"
            )
    components = list(infra.resources("Microsoft.Insights/components"))
    for _, symbol, res in components:
        props = _body(res).get("properties") or {}
        expect("Application Insights", symbol, props, "DisableLocalAuth", True)
    for _, symbol, res in infra.resources("Microsoft.OperationalInsights/workspaces"):
        features = (_body(res).get("properties") or {}).get("features") or {}
        expect("Log Analytics", symbol, features, "disableLocalAuth", True)
    for kind, found in (("Service Bus namespace", namespaces), ("App Insights", components)):
        if not found:
            problems.append(f"no {kind} declared")
    for _, symbol, res in infra.resources("Microsoft.Web/sites"):
        config = _body(res)
        props = config.get("properties") or {}
        expect("function app", symbol, props, "httpsOnly", True)
        identity = config.get("identity") or {}
        expect("function app", symbol, identity, "type", "UserAssigned")
        app_config = props.get("functionAppConfig") or {}
        expect("function app", symbol, app_config.get("runtime") or {}, "name", "python")
        expect("function app", symbol, app_config.get("runtime") or {}, "version", "3.11")
        auth = ((app_config.get("deployment") or {}).get("storage") or {}).get(
            "authentication"
        ) or {}
        expect("function app", symbol, auth, "type", "UserAssignedIdentity")
    vaults = list(infra.resources("Microsoft.KeyVault/vaults"))
    for _, symbol, res in vaults:
        props = _body(res).get("properties") or {}
        expect("Key Vault", symbol, props, "enableRbacAuthorization", True)
    if not vaults:
        problems.append("no Key Vault declared: MESSAGE_SIGNING_KEYS has nowhere to live")
    for _, symbol, res in infra.resources("Microsoft.Web/serverfarms"):
        sku = _body(res).get("sku") or {}
        expect("plan", symbol, sku, "name", "FC1")
        expect("plan", symbol, sku, "tier", "FlexConsumption")
    for path in bicep_files(layout.infra):
        for call in _SECRET_FUNCTION.findall(path.read_text()):
            problems.append(
                f"{_rel(layout, path)} calls {call.strip()}...): templates hold no keys"
            )
    return problems


def _sku_name(infra: Infra, bicep: BicepFile, resource: dict[str, Any]) -> Any:
    """A resource's SKU name in this shape (its sku object may be chosen by a condition)."""
    sku = infra.value(bicep, _body(resource).get("sku"))
    return infra.value(bicep, sku.get("name")) if isinstance(sku, dict) else UNKNOWN


@_checked
def check_parameters(layout: Layout) -> list[str]:
    """main.parameters.json maps only main.bicep parameters, covers every parameter without a
    default, and takes azd's environment name, location and principal id."""
    infra = Infra.load(layout)
    params = infra.main.params
    file_params = json.loads(layout.parameters_json.read_text())["parameters"]
    problems = [
        f"main.parameters.json sets {name}, which main.bicep does not declare"
        for name in sorted(file_params.keys() - params.keys())
    ]
    problems += [
        f"main.bicep parameter {name} has no default and is not in main.parameters.json"
        for name, param in sorted(params.items())
        if param.get("default") is None and name not in file_params and not _azd_generated(param)
    ]
    expected = {
        "environmentName": "${AZURE_ENV_NAME}",
        "location": "${AZURE_LOCATION}",
        "principalId": "${AZURE_PRINCIPAL_ID}",
    }
    for name, value in expected.items():
        actual = (file_params.get(name) or {}).get("value")
        if actual != value:
            problems.append(f"main.parameters.json: {name} is {actual!r}, must be {value!r}")
    scope = (infra.main.tree.get("globals") or {}).get("scope", {}).get("value")
    if scope != "subscription":
        problems.append(f"main.bicep targetScope is {scope!r}, must be 'subscription'")
    return problems


def _azd_generated(param: dict[str, Any]) -> bool:
    """A secure parameter azd generates once and keeps in the environment (metadata azd.type
    'generate'): it needs neither a default nor a mapping in main.parameters.json."""
    decorators = param.get("decorators") or []
    secure = any(d.get("type") == "secure" for d in decorators)
    generated = any(
        d.get("type") == "metadata"
        and ((d.get("argument") or {}).get("azd") or {}).get("type") == "generate"
        for d in decorators
    )
    return secure and generated


@_checked
def check_outputs(layout: Layout) -> list[str]:
    """main.bicep outputs what azd and the smoke test need, and each azd service of azure.yaml
    is one of the function apps (SERVICE_<NAME>_NAME output and azd-service-name tag), both
    deployed from the repository root."""
    infra = Infra.load(layout)
    outputs = infra.main.outputs
    problems = [
        f"main.bicep has no output {name}" for name in REQUIRED_OUTPUTS if name not in outputs
    ]
    services = azure_yaml_services(layout.azure_yaml)
    wanted = {app.service for app in APPS}
    if set(services) != wanted:
        return [*problems, f"azure.yaml must declare the services {sorted(wanted)}, found "
                f"{sorted(services)}"]  # fmt: skip
    for app in APPS:
        fields = services[app.service]
        for key, value in (("project", "."), ("language", "python"), ("host", "function")):
            if fields.get(key) != value:
                problems.append(f"azure.yaml services.{app.service}.{key} is {fields.get(key)!r}")
        output = f"SERVICE_{app.service.upper()}_NAME"
        if output not in outputs:
            problems.append(
                f"main.bicep has no output {output} for azure.yaml service {app.service}"
            )
        bound = infra.bind(app)
        bicep, _, resource = bound.one_resource("Microsoft.Web/sites")
        tag = _tag_value(bound, bicep, _body(resource).get("tags"), "azd-service-name")
        if tag != app.service:
            problems += app.say(
                [f"function app tag azd-service-name is {tag!r}, azure.yaml says {app.service!r}"]
            )
    return problems


def _tag_value(infra: Infra, bicep: BicepFile, expr: Any, tag: str) -> Any:
    """The static value of tag ``tag`` in a tags expression (objects, union(), variables and
    module parameters are followed), or None."""
    if isinstance(expr, str) and expr in bicep.variables:
        return _tag_value(infra, bicep, bicep.variables[expr]["value"], tag)
    if isinstance(expr, str) and expr in bicep.params:
        for caller, config in infra.callers(bicep):
            if expr in (config.get("params") or {}):
                return _tag_value(infra, caller, config["params"][expr], tag)
        return None
    if isinstance(expr, dict) and set(expr) == {"function"}:
        if expr["function"]["type"] != "union":
            return None
        for part in reversed(list(expr["function"]["parameters"].values())):
            value = _tag_value(infra, bicep, part, tag)
            if value is not None:
                return value
        return None
    if isinstance(expr, dict) and not ({"operator"} & set(expr)):
        tags = {_unquote(key): value for key, value in expr.items()}
        return infra.resolve(bicep, tags[tag]) if tag in tags else None
    return None


def azure_yaml_services(path: Path) -> dict[str, dict[str, str]]:
    """services.<name>.<key>: value of a simple azure.yaml (no YAML library needed)."""
    services: dict[str, dict[str, str]] = {}
    current: str | None = None
    inside = False
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line:
            continue
        if not line.startswith(" "):
            inside = line == "services:"
            continue
        if not inside:
            continue
        if re.fullmatch(r"  [A-Za-z0-9_-]+:", line):
            current = line.strip()[:-1]
            services[current] = {}
        elif current and (m := re.fullmatch(r"    ([A-Za-z]+):\s*(.+)", line)):
            services[current][m.group(1)] = m.group(2).strip().strip("'\"")
    return services


TELEMETRY_MODE = "OpenTelemetry"
WORKER_OPENTELEMETRY_SETTING = "PYTHON_ENABLE_OPENTELEMETRY"


@_checked
def check_telemetry(layout: Layout) -> list[str]:
    """The OpenTelemetry wiring adapters/telemetry.py relies on (docs/deploy.md, Telemetry): the
    host emits OpenTelemetry (host.json ``telemetryMode``), the Python worker makes the host's
    invocation span current (PYTHON_ENABLE_OPENTELEMETRY), both export to Application Insights
    with Entra ID as the app identity, and host.json holds no Application Insights SDK settings,
    which the host ignores in OpenTelemetry mode."""
    infra = Infra.load(layout)
    host = json.loads(layout.host_json.read_text())
    problems = []
    if host.get("telemetryMode") != TELEMETRY_MODE:
        problems.append(
            f"host.json telemetryMode is {host.get('telemetryMode')!r}, must be "
            f"{TELEMETRY_MODE!r}: the host's invocation spans are the app spans' parents"
        )
    if "applicationInsights" in (host.get("logging") or {}):
        problems.append(
            "host.json sets logging.applicationInsights, which the host ignores with "
            f"telemetryMode {TELEMETRY_MODE!r}: say only what the platform honours"
        )
    for app in APPS:
        problems += app.say(_app_telemetry_problems(infra.bind(app)))
    return problems


def _app_telemetry_problems(infra: Infra) -> list[str]:
    settings = function_app_settings(infra)
    problems = []
    if settings.get(WORKER_OPENTELEMETRY_SETTING) != "true":
        problems.append(
            f"{WORKER_OPENTELEMETRY_SETTING} is {settings.get(WORKER_OPENTELEMETRY_SETTING)!r}, "
            "must be 'true': without it the worker does not make the host's invocation span "
            "current, and the app's spans are not its children"
        )
    auth = settings.get("APPLICATIONINSIGHTS_AUTHENTICATION_STRING")
    parts = (
        dict(p.split("=", 1) for p in auth.split(";") if "=" in p) if isinstance(auth, str) else {}
    )
    client = parts.get("ClientId", "")
    if parts.get("Authorization") != "AAD" or not _INTERPOLATION.fullmatch(client):
        problems.append(
            f"APPLICATIONINSIGHTS_AUTHENTICATION_STRING is {_short(auth)}, must be "
            "'ClientId=<the identity's client id>;Authorization=AAD' (local auth is off; the "
            "host and the worker's exporter both read it)"
        )
    else:
        bicep, _, _ = infra.one_resource("Microsoft.Web/sites")
        origin = _origin_text(infra, bicep, _INTERPOLATION.fullmatch(client).group(1))
        if origin != f"{app_identity(infra)}.outputs.clientId":
            problems.append(
                f"APPLICATIONINSIGHTS_AUTHENTICATION_STRING names client id {origin}, not the "
                "app's identity (the one with Monitoring Metrics Publisher)"
            )
    return problems


@_checked
def check_alerts(layout: Layout) -> list[str]:
    """Azure Monitor metric alerts: ActiveMessages > 0 on the operator alerts queue and
    DeadletteredMessages > 0 on every queue, each to an action group that emails someone."""
    infra = Infra.load(layout)
    settings = function_app_settings(infra.bind(PATTERN))
    alerts_queue = settings.get("OPERATOR_ALERTS_QUEUE")
    email_groups = _email_action_groups(infra)
    if not email_groups:
        return ["no action group with an email receiver"]
    wanted = {
        ("ActiveMessages", alerts_queue): "operator alert waiting",
        ("DeadletteredMessages", "*"): "dead-lettered messages on any queue",
    }
    found = set()
    for bicep, _, resource in infra.resources("Microsoft.Insights/metricAlerts"):
        props = _body(resource).get("properties") or {}
        targets = {_accessed_symbol(a.get("actionGroupId")) for a in props.get("actions") or []}
        if not any(group in targets for path, group in email_groups if path == bicep.path):
            continue
        if props.get("enabled") is not True:
            continue
        for criterion in (props.get("criteria") or {}).get("allOf") or []:
            if criterion.get("metricNamespace") != "Microsoft.ServiceBus/namespaces":
                continue
            if criterion.get("operator") != "GreaterThan" or criterion.get("threshold") != 0:
                continue
            for dimension in criterion.get("dimensions") or []:
                if dimension.get("name") != "EntityName" or dimension.get("operator") != "Include":
                    continue
                for value in dimension.get("values") or []:
                    found.add((criterion.get("metricName"), infra.resolve(bicep, value)))
    return [
        f"no enabled metric alert ({what}: {metric} > 0 on EntityName {entity!r}) "
        "that emails through an action group"
        for (metric, entity), what in wanted.items()
        if (metric, entity) not in found
    ]


def _email_action_groups(infra: Infra) -> set[tuple[Path, str]]:
    """(file, symbol) of every action group with an email receiver."""
    groups = set()
    for bicep, symbol, resource in infra.resources("Microsoft.Insights/actionGroups"):
        if (_body(resource).get("properties") or {}).get("emailReceivers"):
            groups.add((bicep.path, symbol))
    return groups


_KQL_SOURCE = re.compile(r"\s*customMetrics\b")
_KQL_NAME_FILTER = re.compile(r"\|\s*where\s+name\s*==\s*(['\"])(?P<name>[^'\"]+)\1")


@dataclass
class LogAlert:
    """One criterion of a declared scheduled query rule (log search alert)."""

    bicep: BicepFile
    symbol: str
    body: dict[str, Any]
    criterion: dict[str, Any]
    query: str
    metrics: set[str]
    """customMetrics names the query filters on (empty if it does not read customMetrics)."""

    @property
    def props(self) -> dict[str, Any]:
        return self.body.get("properties") or {}

    def where(self, infra: Infra) -> str:
        return f"{infra.rel(self.bicep.path)}: {self.symbol}"


def log_alerts(infra: Infra) -> list[LogAlert]:
    found = []
    for bicep, symbol, resource in infra.resources("Microsoft.Insights/scheduledQueryRules"):
        body = _body(resource)
        for criterion in ((body.get("properties") or {}).get("criteria") or {}).get("allOf") or []:
            query = _static_string(infra, bicep, criterion.get("query"))
            names = set()
            if _KQL_SOURCE.match(query):
                names = {m["name"] for m in _KQL_NAME_FILTER.finditer(query)}
            found.append(LogAlert(bicep, symbol, body, criterion, query, names))
    return found


def _static_string(infra: Infra, bicep: BicepFile, expr: Any) -> str:
    """A string expression with its ``${name}`` interpolations of static values filled in."""
    value = infra.resolve(bicep, expr)
    if not isinstance(value, str):
        raise CheckError(f"{infra.rel(bicep.path)}: {_short(expr)} is not a static string")
    return _INTERPOLATION.sub(lambda m: str(infra.resolve(bicep, m.group(1))), value)


def parameter_origin(infra: Infra, bicep: BicepFile, expr: Any) -> tuple[BicepFile, Any]:
    """Where a module parameter's value comes from: followed through the single caller that
    passes it, up to an expression that is not such a parameter (a parameter of main.bicep, a
    literal, or anything else)."""
    while isinstance(expr, str) and expr in bicep.params:
        callers = list(infra.callers(bicep))
        if len(callers) != 1:
            break
        caller, config = callers[0]
        passed = config.get("params") or {}
        if expr not in passed:
            break
        bicep, expr = caller, passed[expr]
    return bicep, expr


def _iso_minutes(duration: Any) -> int | None:
    match = re.fullmatch(r"PT(\d+)M", duration) if isinstance(duration, str) else None
    if match:
        return int(match.group(1))
    match = re.fullmatch(r"PT(\d+)H", duration) if isinstance(duration, str) else None
    return int(match.group(1)) * 60 if match else None


def _log_alert_problems(
    infra: Infra, alert: LogAlert, what: str, email_groups: set[tuple[Path, str]]
) -> list[str]:
    """What every Supervisor alert needs: enabled, stateful, on the Application Insights
    component, evaluated every 5 minutes, to an action group that emails the operators."""
    where = f"{alert.where(infra)} ({what})"
    props = alert.props
    problems = []
    if alert.body.get("kind") not in (None, "LogAlert"):
        problems.append(f"{where}: kind is {alert.body.get('kind')!r}, must be 'LogAlert'")
    if props.get("enabled") is not True:
        problems.append(f"{where}: not enabled")
    if props.get("autoMitigate") is not True:
        problems.append(f"{where}: autoMitigate must be true (one email on start, one on clear)")
    components = {
        symbol
        for symbol, resource in alert.bicep.resources.items()
        if resource.get("type") == "Microsoft.Insights/components"
    }
    scopes = props.get("scopes") or []
    if (
        len(scopes) != 1
        or _accessed_symbol(scopes[0]) not in components
        or (_last_name(scopes[0]) != "id")
    ):
        problems.append(
            f"{where}: scopes must be the Application Insights component's id (customMetrics "
            f"lives there), not {_short(scopes)}"
        )
    frequency = props.get("evaluationFrequency")
    if frequency != LOG_ALERT_FREQUENCY:
        problems.append(
            f"{where}: evaluationFrequency is {frequency!r}, must be {LOG_ALERT_FREQUENCY!r}"
        )
    window = _iso_minutes(props.get("windowSize"))
    if window is None or window < (_iso_minutes(frequency) or 0):
        problems.append(
            f"{where}: windowSize {props.get('windowSize')!r} must cover the evaluation frequency"
        )
    targets = {
        _accessed_symbol(group) for group in (props.get("actions") or {}).get("actionGroups") or []
    }
    if not any(group in targets for path, group in email_groups if path == alert.bicep.path):
        problems.append(f"{where}: does not notify an action group that emails the operators")
    return problems


@_checked
def check_supervisor_alerts(layout: Layout, facts: Facts) -> list[str]:
    """The Supervisor's log search alerts: max(supervisor.lag) above the
    supervisorLagAlertSeconds parameter, and no supervisor.tick.duration for 15 minutes; each on
    the Application Insights component, every 5 minutes, to the email action group; and both
    metrics are what a Supervisor tick records."""
    from adapters.setting_values import SettingsError, schedule_period

    infra = Infra.load(layout)
    problems = []
    for metric, kind in SUPERVISOR_METRIC_KINDS.items():
        recorded = facts[PATTERN.name].metrics.get(metric)
        if recorded is None:
            problems.append(
                f"a Supervisor tick records no metric {metric!r} (service/sweep_report.py), "
                "but an alert queries it"
            )
        elif kind is not None and recorded != kind:
            problems.append(f"metric {metric!r} is a {recorded} in the code, must be a {kind}")
    email_groups = _email_action_groups(infra)
    alerts = log_alerts(infra)

    lag_alerts = [alert for alert in alerts if SUPERVISOR_LAG_METRIC in alert.metrics]
    if not lag_alerts:
        problems.append(
            f"no log search alert queries customMetrics for {SUPERVISOR_LAG_METRIC!r} "
            "(Supervisor lag)"
        )
    for alert in lag_alerts:
        where = f"{alert.where(infra)} (Supervisor lag)"
        problems += _log_alert_problems(infra, alert, "Supervisor lag", email_groups)
        criterion = alert.criterion
        for key, value in (
            ("timeAggregation", "Maximum"),
            ("metricMeasureColumn", "value"),
            ("operator", "GreaterThan"),
        ):
            if criterion.get(key) != value:
                problems.append(f"{where}: {key} is {criterion.get(key)!r}, must be {value!r}")
        origin, expr = parameter_origin(infra, alert.bicep, criterion.get("threshold"))
        if origin is not infra.main or expr != LAG_THRESHOLD_PARAMETER:
            problems.append(
                f"{where}: threshold is {_short(expr)} in {infra.rel(origin.path)}, must be "
                f"main.bicep's parameter {LAG_THRESHOLD_PARAMETER}"
            )
    param = infra.main.params.get(LAG_THRESHOLD_PARAMETER)
    if param is None:
        problems.append(f"main.bicep declares no parameter {LAG_THRESHOLD_PARAMETER}")
    else:
        default = param.get("default")
        schedule = infra.resolve(infra.main, "supervisorSchedule")
        try:
            period = schedule_period(schedule).total_seconds()
        except SettingsError as exc:
            raise CheckError(f"main.bicep: supervisorSchedule default: {exc}") from None
        if param.get("type") != "int" or not isinstance(default, int):
            problems.append(f"main.bicep: {LAG_THRESHOLD_PARAMETER} must be an int with a default")
        elif default <= 2 * period:
            problems.append(
                f"main.bicep: {LAG_THRESHOLD_PARAMETER} defaults to {default} s, not above two "
                f"Supervisor periods ({period:g} s each at {schedule!r}): a healthy Supervisor "
                "would alert"
            )
        file_params = json.loads(layout.parameters_json.read_text())["parameters"]
        if LAG_THRESHOLD_PARAMETER not in file_params:
            problems.append(f"main.parameters.json does not map {LAG_THRESHOLD_PARAMETER}")

    silence_alerts = [alert for alert in alerts if SUPERVISOR_TICK_METRIC in alert.metrics]
    if not silence_alerts:
        problems.append(
            f"no log search alert queries customMetrics for {SUPERVISOR_TICK_METRIC!r} "
            "(Supervisor not running)"
        )
    for alert in silence_alerts:
        where = f"{alert.where(infra)} (Supervisor not running)"
        problems += _log_alert_problems(infra, alert, "Supervisor not running", email_groups)
        criterion = alert.criterion
        for key, value in (
            ("timeAggregation", "Count"),
            ("operator", "LessThan"),
            ("threshold", 1),
        ):
            if criterion.get(key) != value:
                problems.append(f"{where}: {key} is {criterion.get(key)!r}, must be {value!r}")
        window = alert.props.get("windowSize")
        if window != SILENCE_WINDOW:
            problems.append(f"{where}: windowSize is {window!r}, must be {SILENCE_WINDOW!r}")
    return problems


def _last_name(expr: Any) -> str:
    """'clientId' for ``identity.outputs.clientId``; the name itself for a bare name."""
    while isinstance(expr, dict) and expr.get("operator", {}).get("type") == "property_accessor":
        expr = expr["operator"]["operands"]["operand_2"]
    return expr if isinstance(expr, str) else ""


def _accessed_symbol(expr: Any) -> str | None:
    """'actionGroup' for the expression ``actionGroup.id``."""
    if isinstance(expr, dict) and expr.get("operator", {}).get("type") == "property_accessor":
        base = expr["operator"]["operands"]["operand_1"]
        return base if isinstance(base, str) else None
    return None


@_checked
def check_archive(layout: Layout) -> list[str]:
    """The archive of purged orders (the operations app's: the retention purge runs there): the
    Blob Data Contributor role is granted only on the container ARCHIVE_CONTAINER names (the
    narrowest scope), and a lifecycle rule moves that container's block blobs to cool storage."""
    infra = Infra.load(layout)
    settings = function_app_settings(infra.bind(OPERATIONS))
    container = settings.get(ARCHIVE_CONTAINER_SETTING)
    problems = []
    scoped = 0
    for bicep, symbol, resource in infra.resources("Microsoft.Authorization/roleAssignments"):
        role = (_body(resource).get("properties") or {}).get("roleDefinitionId")
        if isinstance(role, dict) and role.get("function", {}).get("type") == (
            "subscription_resource_id"
        ):
            role = role["function"]["parameters"]["resource_name_1"]
        try:
            role_id = str(infra.resolve(bicep, role)).lower()
        except CheckError:
            continue
        if role_id != BLOB_DATA_CONTRIBUTOR:
            continue
        target = bicep.resources.get(str(_body(resource).get("scope")))
        if target is None or target.get("type") != (
            "Microsoft.Storage/storageAccounts/blobServices/containers"
        ):
            problems.append(
                f"{infra.rel(bicep.path)}: {symbol} grants Storage Blob Data Contributor beyond "
                "one container (scope it to the archive container)"
            )
            continue
        name = infra.resolve(bicep, _body(target).get("name"))
        if name != container:
            problems.append(
                f"{infra.rel(bicep.path)}: {symbol} grants Storage Blob Data Contributor on "
                f"container {name!r}, not the archive {container!r}"
            )
        scoped += 1
    if scoped == 0:
        problems.append(
            "no Storage Blob Data Contributor on the archive container: the purge could not archive"
        )
    rules = [
        (bicep, rule)
        for bicep, _, resource in infra.resources(
            "Microsoft.Storage/storageAccounts/managementPolicies"
        )
        for rule in (
            ((_body(resource).get("properties") or {}).get("policy") or {}).get("rules") or []
        )
    ]
    cooled = False
    for bicep, rule in rules:
        definition = rule.get("definition") or {}
        filters = definition.get("filters") or {}
        prefixes = [
            _INTERPOLATION.sub(lambda m, b=bicep: str(infra.resolve(b, m.group(1))), p)
            for p in filters.get("prefixMatch") or []
        ]
        to_cool = ((definition.get("actions") or {}).get("baseBlob") or {}).get("tierToCool")
        if (
            rule.get("enabled") is True
            and f"{container}/" in prefixes
            and "blockBlob" in (filters.get("blobTypes") or [])
            and isinstance(to_cool, dict)
            and "daysAfterModificationGreaterThan" in to_cool
        ):
            cooled = True
    if not cooled:
        problems.append(
            f"no enabled lifecycle rule moves block blobs under '{container}/' to cool storage "
            "(tierToCool.daysAfterModificationGreaterThan)"
        )
    return problems


# --------------------------------------------------------------------------- run all


# ------------------------------------------------------------------- authentication

AUTH_SETTINGS = "authsettingsV2"
KEYED_AUTH_LEVELS = frozenset({"function", "admin"})
UNAUTHENTICATED_ACTIONS = frozenset({"AllowAnonymous", "RedirectToLoginPage", "Return401"})


@_checked
def check_authentication(layout: Layout, facts: Facts) -> list[str]:
    """Nothing HTTP is open. The pattern app serves no HTTP at all: no HTTP function, and no
    App Service Authentication (no app registration reaches it). The operations app's HTTP
    function needs a function key (authLevel function or admin), and App Service
    Authentication with Entra ID is declared on it (``authsettingsV2``), deployed only when a
    main.bicep parameter names an app registration (empty by default, mapped in
    main.parameters.json), with that registration's client id and an issuer, HTTPS required and
    an allowed way of handling callers not signed in."""
    pattern = facts[PATTERN.name].http_auth_levels
    problems = PATTERN.say(
        f"function {name} is HTTP-triggered: the pattern app serves no HTTP (the operator "
        "surface is the operations app's)"
        for name in sorted(pattern)
    )
    levels = facts[OPERATIONS.name].http_auth_levels
    problems += OPERATIONS.say(
        f"HTTP function {name} has authLevel {level or 'unset'!r}: the Functions host would "
        "serve it without a function key; use func.AuthLevel.FUNCTION"
        for name, level in sorted(levels.items())
        if level not in KEYED_AUTH_LEVELS
    )
    if not levels:
        problems += OPERATIONS.say(
            ["no HTTP function was indexed: the operator API and dashboard are gone?"]
        )
    infra = Infra.load(layout)
    problems += PATTERN.say(_no_authentication_problems(infra.bind(PATTERN)))
    return problems + OPERATIONS.say(_authentication_problems(layout, infra.bind(OPERATIONS)))


def _no_authentication_problems(infra: Infra) -> list[str]:
    """The app's App Service Authentication takes no app registration: never deployed."""
    found = [
        (bicep, resource)
        for bicep, _, resource in infra.resources("Microsoft.Web/sites/config")
        if _body(resource).get("name") == AUTH_SETTINGS
    ]
    problems = []
    for bicep, resource in found:
        client = (_body(resource).get("properties") or {}).get("identityProviders") or {}
        client = ((client.get("azureActiveDirectory") or {}).get("registration") or {}).get(
            "clientId"
        )
        origin_file, origin = parameter_origin(infra, bicep, client)
        default = (
            origin_file.params.get(origin, {}).get("default") if isinstance(origin, str) else None
        )
        if origin_file is infra.main or default != "":
            problems.append(
                f"App Service Authentication takes an app registration ({_short(origin)}), but "
                "the app serves no HTTP: leave its client id empty"
            )
    return problems


def _authentication_problems(layout: Layout, infra: Infra) -> list[str]:
    problems: list[str] = []
    sites = list(infra.resources("Microsoft.Web/sites"))
    if len(sites) != 1:
        return [*problems, f"expected one function app (Microsoft.Web/sites), found {len(sites)}"]
    site_file, site_symbol, _ = sites[0]
    found = [
        (bicep, symbol, resource)
        for bicep, symbol, resource in infra.resources("Microsoft.Web/sites/config")
        if _body(resource).get("name") == AUTH_SETTINGS
    ]
    if len(found) != 1:
        return [
            *problems,
            f"expected one Microsoft.Web/sites/config '{AUTH_SETTINGS}' (App Service "
            f"Authentication) on the function app, found {len(found)}",
        ]
    bicep, symbol, resource = found[0]
    where = f"{infra.rel(bicep.path)} {symbol}"
    body = _body(resource)
    if bicep is not site_file or body.get("parent") != site_symbol:
        problems.append(f"{where}: its parent must be the function app {site_symbol}")
    props = body.get("properties") or {}

    def at(*path: str) -> Any:
        value: Any = props
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    for path, expected in (
        (("platform", "enabled"), True),
        (("identityProviders", "azureActiveDirectory", "enabled"), True),
        (("httpSettings", "requireHttps"), True),
    ):
        if at(*path) != expected:
            problems.append(f"{where}: {'.'.join(path)} is {at(*path)!r}, must be {expected!r}")
    client = at("identityProviders", "azureActiveDirectory", "registration", "clientId")
    origin_file, origin = parameter_origin(infra, bicep, client)
    if not (isinstance(origin, str) and origin_file is infra.main and origin in infra.main.params):
        problems.append(
            f"{where}: registration.clientId must come from a main.bicep parameter, "
            f"not {_short(client)}"
        )
        return problems
    param = infra.main.params[origin]
    if param.get("default") != "":
        problems.append(
            f"main.bicep parameter {origin} must default to '' (authentication off until an "
            f"app registration is given), not {param.get('default')!r}"
        )
    mapped = json.loads(layout.parameters_json.read_text())["parameters"]
    if origin not in mapped:
        problems.append(f"main.parameters.json does not map {origin}: azd cannot set it")
    condition = (resource.get("config") or {}).get("condition")
    if not _tests_not_empty(infra, bicep, condition, client):
        problems.append(
            f"{where}: must be deployed only when {origin} is given "
            f"(a condition like `if (!empty({client}))`), not {_short(condition)}"
        )
    if not at("identityProviders", "azureActiveDirectory", "registration", "openIdIssuer"):
        problems.append(f"{where}: registration.openIdIssuer is missing (the tenant's issuer)")
    audiences = at("identityProviders", "azureActiveDirectory", "validation", "allowedAudiences")
    if not isinstance(audiences, list) or client not in audiences:
        problems.append(f"{where}: validation.allowedAudiences must include {client}")
    action = at("globalValidation", "unauthenticatedClientAction")
    action_origin_file, action_origin = parameter_origin(infra, bicep, action)
    choices: set[Any]
    if isinstance(action_origin, str) and action_origin in action_origin_file.params:
        decl = action_origin_file.params[action_origin]
        allowed = next(
            (d.get("argument") for d in decl.get("decorators") or [] if d.get("type") == "allowed"),
            None,
        )
        choices = set(allowed or [decl.get("default")])
    else:
        choices = {action_origin}
    if not choices or not choices <= UNAUTHENTICATED_ACTIONS:
        shown = sorted(map(str, choices))
        problems.append(
            f"{where}: globalValidation.unauthenticatedClientAction may be {shown}, must be "
            f"one of {sorted(UNAUTHENTICATED_ACTIONS)}"
        )
    return problems


def _tests_not_empty(infra: Infra, bicep: BicepFile, condition: Any, name: Any) -> bool:
    """Whether ``condition`` is ``!empty(name)`` (directly or through a variable)."""
    if isinstance(condition, str) and condition in bicep.variables:
        return _tests_not_empty(infra, bicep, bicep.variables[condition]["value"], name)
    operator = condition.get("operator") if isinstance(condition, dict) else None
    if not isinstance(operator, dict) or operator.get("type") != "not":
        return False
    inner = (operator.get("operands") or {}).get("bool_value")
    function = inner.get("function") if isinstance(inner, dict) else None
    return (
        isinstance(function, dict)
        and function.get("type") == "empty"
        and (function.get("parameters") or {}).get("item_to_test") == name
    )


# --------------------------------------------------------------------- private network

STORAGE_ACCOUNT_TYPE = "Microsoft.Storage/storageAccounts"
KEY_VAULT_TYPE = "Microsoft.KeyVault/vaults"
NAMESPACE_TYPE = "Microsoft.ServiceBus/namespaces"
SITE_TYPE = "Microsoft.Web/sites"
VIRTUAL_NETWORK_TYPE = "Microsoft.Network/virtualNetworks"
PRIVATE_ENDPOINT_TYPE = "Microsoft.Network/privateEndpoints"
ZONE_TYPE = "Microsoft.Network/privateDnsZones"
ZONE_LINK_TYPE = "Microsoft.Network/privateDnsZones/virtualNetworkLinks"
ZONE_GROUP_TYPE = "Microsoft.Network/privateEndpoints/privateDnsZoneGroups"
FLEX_CONSUMPTION_DELEGATION = "Microsoft.App/environments"
PRIVATE_LINK_GROUPS: Mapping[str, str] = {
    # Private link group id -> the resource type whose endpoint it is.
    "blob": STORAGE_ACCOUNT_TYPE,
    "table": STORAGE_ACCOUNT_TYPE,
    "queue": STORAGE_ACCOUNT_TYPE,
    "vault": KEY_VAULT_TYPE,
    "namespace": NAMESPACE_TYPE,
}
GATED_RESOURCES: Mapping[str, str] = {
    # The resources the apps reach whose public network access the shape decides.
    STORAGE_ACCOUNT_TYPE: "storage account",
    KEY_VAULT_TYPE: "Key Vault",
    NAMESPACE_TYPE: "Service Bus namespace",
}
NETWORK_RULES: frozenset[str] = frozenset({STORAGE_ACCOUNT_TYPE, KEY_VAULT_TYPE})
"""Resources with network rules (``networkAcls``) besides public network access."""
_SERVICE_URI_SETTING = re.compile(r"__(?P<group>blob|table|queue)ServiceUri$")
_SUBNET_ID = re.compile(r"\$\{(?P<vnet>\w+)\.id\}/subnets/\$\{(?P<subnet>\w+)\}")
CLOUD_HOST_NAMES = (
    # Public-cloud host suffixes: the templates take each from the cloud they deploy to
    # (environment().suffixes, a resource's own endpoints), so they work in every cloud.
    "core.windows.net",
    "servicebus.windows.net",
    "vault.azure.net",
    "vaultcore.azure.net",
    "azurewebsites.net",
    "login.microsoftonline.com",
)


@dataclass(frozen=True)
class PrivateEndpoint:
    """One private endpoint main.bicep deploys, as the checks need it."""

    where: str
    groups: frozenset[str]
    service: str | None
    """Resource type of what it reaches (None: not a resource the checks can name)."""
    subnet: tuple[str, str] | None
    """(virtual network symbol, subnet name) it takes its address in."""
    zones: tuple[tuple[Any, tuple[str, str] | None], ...]
    """Each DNS zone of its zone group: (zone name expression, the network it is linked to)."""


@_checked
def check_network(layout: Layout) -> list[str]:
    """The private network option, in the shape read. Private (vnetEnabled): each app's
    outbound traffic goes through a subnet of its own, delegated to Microsoft.App/environments,
    of the one virtual network; each service the apps reach (a storage service an app or its host
    names by URI, Key Vault for a Key Vault reference, the Service Bus namespace) has a private
    endpoint of that group on that resource, in a subnet of the same network, with a private DNS
    zone linked to it; the storage account, Key Vault and Service Bus refuse public networks, and
    Service Bus is Premium (private endpoints need it). Public: none of that is deployed, the three
    take public networks (the apps have no other path to them), and Service Bus is Standard."""
    infra = Infra.load(layout)
    if infra.shape.get(SHAPE_PARAMETER):
        problems = _private_shape_problems(infra)
    else:
        problems = _public_shape_problems(infra)
    return problems


def _private_shape_problems(infra: Infra) -> list[str]:
    problems = []
    networks = list(infra.resources(VIRTUAL_NETWORK_TYPE))
    if len(networks) != 1:
        return [f"expected one virtual network in the private shape, found {len(networks)}"]
    network = networks[0][1]
    subnets: dict[tuple[str, str] | None, str] = {}
    for app in APPS:
        bound = infra.bind(app)
        bicep, symbol, site = bound.one_resource(SITE_TYPE)
        props = _body(site).get("properties") or {}
        subnet = _subnet_of(bound, bicep, props.get("virtualNetworkSubnetId"))
        where = f"{app.name} app ({infra.rel(bicep.path)}: {symbol})"
        if subnet is None or subnet[0] != network:
            problems.append(
                f"{where}: virtualNetworkSubnetId is not a subnet of the virtual network "
                f"{network}: its outbound traffic would not reach the private endpoints"
            )
            continue
        delegations = _subnet_delegations(infra, subnet)
        if FLEX_CONSUMPTION_DELEGATION not in delegations:
            problems.append(
                f"{where}: its subnet {subnet[1]} is not delegated to "
                f"{FLEX_CONSUMPTION_DELEGATION} (Flex Consumption needs it), but to "
                f"{sorted(delegations) or 'nothing'}"
            )
        if subnet in subnets:
            problems.append(
                f"{where}: shares subnet {subnet[1]} with the {subnets[subnet]} app; each app "
                "takes a subnet of its own"
            )
        subnets[subnet] = app.name
    endpoints = private_endpoints(infra)
    for group, why in sorted(private_link_groups(infra).items()):
        wanted = PRIVATE_LINK_GROUPS[group]
        found = [e for e in endpoints if group in e.groups and e.service == wanted]
        if not found:
            problems.append(
                f"no private endpoint of group {group!r} on the {GATED_RESOURCES[wanted]} "
                f"({why}): the apps could not reach it with public access off"
            )
        for endpoint in found:
            if endpoint.subnet is None or endpoint.subnet[0] != network:
                problems.append(f"{endpoint.where}: not in a subnet of the virtual network")
            elif _subnet_delegations(infra, endpoint.subnet):
                problems.append(f"{endpoint.where}: its subnet is delegated; use the endpoints'")
            zones = endpoint.zones
            if not zones or any(link is None or link[1] != network for _, link in zones):
                problems.append(
                    f"{endpoint.where}: needs a private DNS zone group whose zone is linked to "
                    f"the virtual network {network}, or the apps resolve the public address"
                )
            for zone, _ in endpoint.zones:
                if not (isinstance(zone, str) and zone.startswith("privatelink")):
                    problems.append(
                        f"{endpoint.where}: DNS zone {_short(zone)} is not privatelink.*"
                    )
    for bicep, symbol, resource in _gated_resources(infra):
        kind = GATED_RESOURCES[resource["type"]]
        access = _shape_property(infra, bicep, resource, "publicNetworkAccess")
        if access != "Disabled":
            problems.append(
                f"{kind} {symbol}: publicNetworkAccess is {access!r} in the private shape, must "
                "be 'Disabled'"
            )
        if resource["type"] in NETWORK_RULES:
            action = _shape_property(infra, bicep, resource, "networkAcls", "defaultAction")
            if action != "Deny":
                problems.append(
                    f"{kind} {symbol}: networkAcls.defaultAction is {action!r} in the private "
                    "shape, must be 'Deny'"
                )
        if resource["type"] == NAMESPACE_TYPE and _sku_name(infra, bicep, resource) != "Premium":
            problems.append(
                f"{kind} {symbol}: sku is {_sku_name(infra, bicep, resource)!r} in the private "
                "shape; private endpoints need Premium"
            )
    return problems


def _public_shape_problems(infra: Infra) -> list[str]:
    problems = [
        f"{infra.rel(bicep.path)}: {symbol} ({type_}) is deployed in the public shape, which "
        "has no private network"
        for type_ in (VIRTUAL_NETWORK_TYPE, PRIVATE_ENDPOINT_TYPE)
        for bicep, symbol, _ in infra.resources(type_)
    ]
    for app in APPS:
        bound = infra.bind(app)
        bicep, symbol, site = bound.one_resource(SITE_TYPE)
        subnet = (_body(site).get("properties") or {}).get("virtualNetworkSubnetId")
        if bound.value(bicep, subnet) not in (None, ""):
            problems.append(f"{app.name} app: has a virtualNetworkSubnetId in the public shape")
    for bicep, symbol, resource in _gated_resources(infra):
        kind = GATED_RESOURCES[resource["type"]]
        access = _shape_property(infra, bicep, resource, "publicNetworkAccess")
        if access != "Enabled":
            problems.append(
                f"{kind} {symbol}: publicNetworkAccess is {access!r} in the public shape, must be "
                "'Enabled': the apps have no private path to it"
            )
        if resource["type"] in NETWORK_RULES:
            action = _shape_property(infra, bicep, resource, "networkAcls", "defaultAction")
            if action != "Allow":
                problems.append(
                    f"{kind} {symbol}: networkAcls.defaultAction is {action!r} in the public "
                    "shape, must be 'Allow': the apps reach it from addresses that change"
                )
        if resource["type"] == NAMESPACE_TYPE and _sku_name(infra, bicep, resource) != "Standard":
            problems.append(
                f"{kind} {symbol}: sku is {_sku_name(infra, bicep, resource)!r} in the public "
                "shape; Premium pays for private endpoints it has not (docs/deploy.md, Cost)"
            )
    return problems


def _gated_resources(infra: Infra) -> list[tuple[BicepFile, str, dict[str, Any]]]:
    found = [found for type_ in GATED_RESOURCES for found in infra.resources(type_)]
    missing = set(GATED_RESOURCES) - {resource["type"] for _, _, resource in found}
    if missing:
        raise CheckError(f"no {', '.join(sorted(missing))} declared")
    return found


def _shape_property(infra: Infra, bicep: BicepFile, resource: dict[str, Any], *keys: str) -> Any:
    """``properties.<keys>`` of a resource, each level's value in this shape."""
    value: Any = _body(resource).get("properties") or {}
    for key in keys:
        value = infra.value(bicep, value.get(key)) if isinstance(value, dict) else UNKNOWN
    return value


def private_link_groups(infra: Infra) -> dict[str, str]:
    """Private link group -> why the apps need it: each storage service an app or its host names
    by URI (``*__blobServiceUri``...), ``vault`` for a Key Vault reference, ``namespace`` for
    the Service Bus connection."""
    needed: dict[str, str] = {}
    for app in APPS:
        bound = infra.bind(app)
        for name in sorted(function_app_settings(bound)):
            if match := _SERVICE_URI_SETTING.search(name):
                needed.setdefault(match["group"], f"{app.name} app setting {name}")
            elif name.endswith("__fullyQualifiedNamespace"):
                needed.setdefault("namespace", f"{app.name} app setting {name}")
        if key_vault_references(bound):
            needed.setdefault("vault", f"{app.name} app's Key Vault reference")
    return needed


def private_endpoints(infra: Infra) -> list[PrivateEndpoint]:
    """Every private endpoint this shape deploys, each read as the main.bicep module declaration
    that deploys its file (with that declaration's parameters)."""
    found = []
    for symbol, module in infra.main.modules.items():
        target = infra.module_file(infra.main, symbol)
        if target is None or not infra.may_deploy(infra.main, module):
            continue
        bound = infra.bind_module(symbol)
        for name, resource in target.resources.items():
            if resource.get("type") != PRIVATE_ENDPOINT_TYPE or resource.get("existing"):
                continue
            if bound.may_deploy(target, resource):
                found.append(_private_endpoint(bound, target, name, resource, symbol))
    return found


def _private_endpoint(
    infra: Infra, bicep: BicepFile, symbol: str, resource: dict[str, Any], module: str
) -> PrivateEndpoint:
    props = _body(resource).get("properties") or {}
    groups: set[str] = set()
    services = set()
    for connection in props.get("privateLinkServiceConnections") or []:
        conn = connection.get("properties") or {}
        for group in infra.resolve(bicep, conn.get("groupIds")) or []:
            groups.add(str(infra.resolve(bicep, group)))
        services.add(_resource_type_of_id(infra, bicep, conn.get("privateLinkServiceId")))
    zones = []
    for zone_group in bicep.resources.values():
        if zone_group.get("type") != ZONE_GROUP_TYPE or _body(zone_group).get("parent") != symbol:
            continue
        zone_configs = (_body(zone_group).get("properties") or {}).get("privateDnsZoneConfigs")
        for config in zone_configs or []:
            zone_id = (config.get("properties") or {}).get("privateDnsZoneId")
            zones.append(_zone(infra, bicep, zone_id))
    return PrivateEndpoint(
        where=f"main.bicep module {module} ({infra.rel(bicep.path)}: {symbol})",
        groups=frozenset(groups),
        service=services.pop() if len(services) == 1 else None,
        subnet=_subnet_of(infra, bicep, (props.get("subnet") or {}).get("id")),
        zones=tuple(zones),
    )


def _resource_type_of_id(infra: Infra, bicep: BicepFile, expr: Any) -> str | None:
    """The type of the resource ``expr`` is the id of (``<resource>.id``, followed)."""
    origin, settled = infra.settle(bicep, expr)
    symbol = _accessed_symbol(settled)
    resource = origin.resources.get(symbol) if symbol else None
    if resource is None or _last_name(settled) != "id":
        return None
    return resource.get("type")


def _zone(infra: Infra, bicep: BicepFile, zone_id: Any) -> tuple[Any, tuple[str, str] | None]:
    """(the zone's name expression, (network symbol, '') of the network it is linked to)."""
    origin, settled = infra.settle(bicep, zone_id)
    symbol = _accessed_symbol(settled)
    zone = origin.resources.get(symbol) if symbol else None
    if zone is None or zone.get("type") != ZONE_TYPE or _last_name(settled) != "id":
        return _short(zone_id), None
    _, name = infra.settle(origin, _body(zone).get("name"))
    link = None
    for link_symbol, resource in origin.resources.items():
        body = _body(resource)
        if resource.get("type") == ZONE_LINK_TYPE and body.get("parent") == symbol:
            network = ((body.get("properties") or {}).get("virtualNetwork") or {}).get("id")
            network_file, network_expr = infra.settle(origin, network)
            vnet = _accessed_symbol(network_expr)
            target = network_file.resources.get(vnet) if vnet else None
            if target is not None and target.get("type") == VIRTUAL_NETWORK_TYPE:
                link = (link_symbol, vnet)
    return name, link


def _subnet_of(infra: Infra, bicep: BicepFile, expr: Any) -> tuple[str, str] | None:
    """(virtual network symbol, subnet name) of a subnet id ``'${vnet.id}/subnets/${name}'``."""
    origin, settled = infra.settle(bicep, expr)
    match = _SUBNET_ID.fullmatch(settled) if isinstance(settled, str) else None
    if match is None:
        return None
    vnet = origin.resources.get(match["vnet"]) or {}
    if vnet.get("type") != VIRTUAL_NETWORK_TYPE:
        return None
    return match["vnet"], str(infra.resolve(origin, match["subnet"]))


def _subnet_delegations(infra: Infra, subnet: tuple[str, str]) -> set[str]:
    """The services a subnet of the (one) virtual network is delegated to."""
    bicep, symbol, vnet = infra.one_resource(VIRTUAL_NETWORK_TYPE)
    for entry in (_body(vnet).get("properties") or {}).get("subnets") or []:
        if symbol == subnet[0] and infra.resolve(bicep, entry.get("name")) == subnet[1]:
            delegations = infra.resolve(bicep, (entry.get("properties") or {}).get("delegations"))
            return {
                str(infra.resolve(bicep, (d.get("properties") or {}).get("serviceName")))
                for d in delegations or []
            }
    raise CheckError(f"{infra.rel(bicep.path)}: {symbol} declares no subnet {subnet[1]}")


def check_cloud_neutral(layout: Layout) -> list[str]:
    """No template names a public-cloud host (``core.windows.net``...): every host name comes
    from the cloud the deployment runs in (``environment()``, a resource's own endpoints), so the
    templates deploy to any Azure cloud. And no setting names host storage by account name, from
    which the host would build public-cloud host names (:data:`FORBIDDEN_SETTINGS`)."""
    problems = []
    for path in sorted(layout.infra.rglob("*")):
        if path.suffix not in (".bicep", ".json") or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for host in CLOUD_HOST_NAMES:
                if host in line.lower():
                    problems.append(
                        f"{_rel(layout, path)}:{number} names {host}: take it from the cloud "
                        "(environment().suffixes, the resource's endpoints) instead"
                    )
    return problems


# ------------------------------------------------------------------------- workbook

WORKBOOK_TYPE = "Microsoft.Insights/workbooks"
COMPONENT_TYPE = "Microsoft.Insights/components"
ROLE_ASSIGNMENT_TYPE = "Microsoft.Authorization/roleAssignments"
WORKBOOK_EXPECTED: Mapping[str, str] = {
    "kind": "shared",  # the only kind API 2023-06-01 takes: visible to all who may read it
    "category": "workbook",  # listed among the workbooks (not a troubleshooting guide or a gallery)
}
_CHANGING_FUNCTIONS: Mapping[str, str] = {"new_guid": "newGuid", "utc_now": "utcNow"}
"""Functions whose value changes on every deployment (pycep's name -> Bicep's)."""
_SERIALIZED_DATA_SHAPE = (
    "string(union(json(loadTextContent('<file>.json')), { fallbackResourceIds: "
    "[<component>.id] })): the JSON file is the workbook, and the fallback makes it query the "
    "component when it is opened with no resource in context (its own page, a link, a pin)"
)


@_checked
def check_workbook(layout: Layout, facts: Facts) -> list[str]:
    """The operators' workbook: one ``Microsoft.Insights/workbooks`` resource that main.bicep
    always deploys, shared, named by a deterministic guid(), on the Application Insights
    component the function app exports its telemetry to (``sourceId`` and any
    ``fallbackResourceIds``), its content a JSON file next to its module (``loadTextContent``)
    that holds up (:func:`tests.infra.workbook.problems`: its charts read Application Insights
    tables, name only metrics the code defines, and chart every one of them); no identity, and
    no role assignment on it or in its module (it needs none)."""
    infra = Infra.load(layout)
    found = list(infra.resources(WORKBOOK_TYPE))
    if not found:
        undeployed = [
            why
            for bicep in infra.files.values()
            if any(r.get("type") == WORKBOOK_TYPE for r in bicep.resources.values())
            and (why := _deployment_problem(infra, bicep)) is not None
        ]
        if undeployed:
            return undeployed
    if len(found) != 1:
        return [f"expected one {WORKBOOK_TYPE} (the operators' workbook), found {len(found)}"]
    bicep, symbol, resource = found[0]
    where = f"{infra.rel(bicep.path)}: {symbol}"
    problems = []
    if (why := _deployment_problem(infra, bicep)) is not None:
        problems.append(why)
    if {"condition", "loop_type"} & set(resource.get("config") or {}):
        problems.append(f"{where}: must be declared unconditionally, once")
    body = _body(resource)
    props = body.get("properties") or {}
    for key, expected in WORKBOOK_EXPECTED.items():
        actual = (body if key == "kind" else props).get(key)
        if actual != expected:
            problems.append(f"{where}: {key} is {actual!r}, must be {expected!r}")
    problems += _workbook_name_problems(infra, bicep, where, body.get("name"))
    if not body.get("location"):
        problems.append(f"{where}: no location (required by API {resource.get('api_version')})")
    if not props.get("displayName"):
        problems.append(f"{where}: no properties.displayName (the name the portal shows)")
    if body.get("identity") or props.get("storageUri"):
        problems.append(
            f"{where}: declares an identity or storageUri (bring-your-own storage); the "
            "workbook needs neither"
        )
    component = _component_of(infra, bicep, props.get("sourceId"))
    if component is None:
        problems.append(
            f"{where}: sourceId must be the id of the Application Insights component "
            f"(<component>.id of a {COMPONENT_TYPE} in {infra.rel(bicep.path)}), not "
            f"{_short(props.get('sourceId'))}"
        )
    else:
        problems += _same_component_problems(infra.bind(PATTERN), bicep, where, component)
    document_path, shape_problems = _serialized_data(infra, bicep, where, props, component)
    problems += shape_problems
    if document_path is not None:
        rel = infra.rel(document_path)
        try:
            document = json.loads(document_path.read_text(encoding="utf-8"))
        except OSError as exc:
            problems.append(f"{rel}, the workbook's content, cannot be read: {exc.strerror}")
        except ValueError as exc:
            problems.append(f"{rel} does not parse as JSON: {exc}")
        else:
            code = facts[PATTERN.name]
            problems += workbook.problems(document, code.metric_names, rel, code.metric_attributes)
            if isinstance(document, dict) and "fallbackResourceIds" in document:
                problems.append(
                    f"{rel}: holds fallbackResourceIds (a copy from the portal?); leave them "
                    f"out, {infra.rel(bicep.path)} sets them to the component it deploys with"
                )
    problems += _workbook_role_problems(infra, bicep)
    return problems


def _deployment_problem(infra: Infra, bicep: BicepFile) -> str | None:
    """None if every deployment of main.bicep deploys ``bicep`` (itself, or through
    unconditional module declarations), else what is wrong."""
    if bicep is infra.main:
        return None
    declarations = list(infra.declarations(bicep))
    if not declarations:
        return (
            f"{infra.rel(bicep.path)} is not deployed by infra/main.bicep: no module "
            "declaration names it"
        )
    for caller, _, module in declarations:
        if {"condition", "loop_type"} & set(module.get("config") or {}):
            continue
        if _deployment_problem(infra, caller) is None:
            return None
    return (
        f"{infra.rel(bicep.path)} is not always deployed by infra/main.bicep: only through a "
        "condition, a loop, or a file main.bicep does not deploy"
    )


def _workbook_name_problems(infra: Infra, bicep: BicepFile, where: str, name: Any) -> list[str]:
    function = name.get("function") if isinstance(name, dict) else None
    if not isinstance(function, dict) or function.get("type") != "guid":
        return [
            f"{where}: name must be guid(...) of stable values (a workbook's name is a GUID; "
            f"deriving it makes a redeployment update the same workbook), not {_short(name)}"
        ]
    called = _functions_called(infra, bicep, name)
    changing = sorted(bicep_name for f, bicep_name in _CHANGING_FUNCTIONS.items() if f in called)
    if changing:
        return [
            f"{where}: name depends on {'(), '.join(changing)}(): every deployment would add "
            "another workbook"
        ]
    return []


def _functions_called(infra: Infra, bicep: BicepFile, expr: Any, depth: int = 0) -> set[str]:
    """Function types an expression calls, through variables and parameter defaults."""
    if depth > 20:
        return set()
    found: set[str] = set()
    if isinstance(expr, str):
        if expr in bicep.variables:
            return _functions_called(infra, bicep, bicep.variables[expr]["value"], depth + 1)
        if expr in bicep.params:
            origin, passed = parameter_origin(infra, bicep, expr)
            if origin is not bicep or passed != expr:
                return _functions_called(infra, origin, passed, depth + 1)
            return _functions_called(infra, bicep, bicep.params[expr].get("default"), depth + 1)
        return found
    if isinstance(expr, dict):
        function = expr.get("function")
        if isinstance(function, dict) and isinstance(function.get("type"), str):
            found.add(function["type"])
        for value in expr.values():
            found |= _functions_called(infra, bicep, value, depth + 1)
    elif isinstance(expr, list):
        for value in expr:
            found |= _functions_called(infra, bicep, value, depth + 1)
    return found


def _component_of(infra: Infra, bicep: BicepFile, expr: Any) -> str | None:
    """The symbol of the Application Insights component ``expr`` is the id of (``X.id``)."""
    symbol = _accessed_symbol(expr)
    resource = bicep.resources.get(symbol) if symbol else None
    if resource is None or resource.get("type") != COMPONENT_TYPE or _last_name(expr) != "id":
        return None
    return symbol


def _component_origin(infra: Infra, bicep: BicepFile, symbol: str) -> str:
    """Where a component's name comes from (``monitoring.outputs.appInsightsName``)."""
    return _origin_text(infra, bicep, _body(bicep.resources[symbol]).get("name"))


def _same_component_problems(
    infra: Infra, bicep: BicepFile, where: str, component: str
) -> list[str]:
    site_file, site, _ = infra.one_resource("Microsoft.Web/sites")
    app_components = {
        _component_origin(infra, site_file, symbol)
        for symbol, resource in site_file.resources.items()
        if resource.get("type") == COMPONENT_TYPE
    }
    origin = _component_origin(infra, bicep, component)
    if origin in app_components:
        return []
    return [
        f"{where}: reads the component named by {origin}, but the function app {site} exports "
        f"its telemetry to {' or '.join(sorted(app_components)) or 'no component'}"
    ]


def _serialized_data(
    infra: Infra, bicep: BicepFile, where: str, props: dict[str, Any], component: str | None
) -> tuple[Path | None, list[str]]:
    """(the JSON file serializedData loads, problems with its expression)."""
    expr = props.get("serializedData")
    wrong = [f"{where}: serializedData must be {_SERIALIZED_DATA_SHAPE}; not {_short(expr)}"]

    def call(value: Any, type_: str) -> dict[str, Any]:
        function = value.get("function") if isinstance(value, dict) else None
        if isinstance(function, dict) and function.get("type") == type_:
            return function.get("parameters") or {}
        return {}

    parts = list(call(call(expr, "string").get("value_to_convert"), "union").values())
    if len(parts) != 2 or not isinstance(parts[1], dict):
        return None, wrong
    file = call(call(parts[0], "json").get("arg_1"), "load_text_content").get("file_path")
    extra = {_unquote(key): value for key, value in parts[1].items()}
    fallback = extra.get("fallbackResourceIds")
    if (
        not isinstance(file, str)
        or not file.endswith(".json")
        or set(extra) != {"fallbackResourceIds"}
    ):
        return None, wrong
    problems = []
    if not isinstance(fallback, list) or not fallback:
        problems.append(f"{where}: fallbackResourceIds must list the sourceId component's id")
    for value in fallback if isinstance(fallback, list) else []:
        if component is None or _component_of(infra, bicep, value) != component:
            problems.append(
                f"{where}: fallbackResourceIds must be the sourceId component's id, not "
                f"{_short(value)}"
            )
    return bicep.path.parent / file, problems


def _workbook_role_problems(infra: Infra, bicep: BicepFile) -> list[str]:
    problems = []
    for owner, symbol, resource in infra.resources(ROLE_ASSIGNMENT_TYPE):
        scope = _body(resource).get("scope")
        target = owner.resources.get(scope) if isinstance(scope, str) else None
        if owner is bicep:
            problems.append(
                f"{infra.rel(owner.path)}: {symbol} grants a role in the workbook module; the "
                "workbook needs none (operators are given read access: docs/deploy.md, Workbook)"
            )
        elif target is not None and target.get("type") == WORKBOOK_TYPE:
            problems.append(
                f"{infra.rel(owner.path)}: {symbol} grants a role on a workbook; grant operators "
                "their read access outside the templates (docs/deploy.md, Workbook)"
            )
    return problems


def all_checks(facts: Facts) -> dict[str, Callable[[Layout], list[str]]]:
    """Every check by name, each taking only a Layout (code facts bound in)."""
    return {
        "parses": check_bicep_parses,
        "api_versions": check_api_versions,
        "queues_match_broker": check_queues_match_broker,
        "app_settings": lambda layout: check_app_settings(layout, facts),
        "queue_settings": lambda layout: check_queue_settings(layout, facts),
        "receiver_queues": lambda layout: check_receiver_queues(layout, facts),
        "storage_names": lambda layout: check_storage_names(layout, facts),
        "archive": check_archive,
        "roles": check_roles,
        "required_roles": check_required_roles,
        "data_roles": lambda layout: check_data_roles(layout, facts),
        "surplus_roles": lambda layout: check_surplus_roles(layout, facts),
        "security": check_security,
        "alerts": check_alerts,
        "telemetry": check_telemetry,
        "supervisor_alerts": lambda layout: check_supervisor_alerts(layout, facts),
        "parameters": check_parameters,
        "outputs": check_outputs,
        "authentication": lambda layout: check_authentication(layout, facts),
        "workbook": lambda layout: check_workbook(layout, facts),
        "network": check_network,
        "cloud_neutral": check_cloud_neutral,
    }


def run_all(layout: Layout, facts: Facts) -> dict[str, list[str]]:
    """Problems by check name (only checks that found some), in every shape of the templates
    (:data:`SHAPES`): a problem of some shapes only says which."""
    results = {}
    for name, check in all_checks(facts).items():
        by_shape = {shape: check(dataclasses.replace(layout, shape=shape)) for shape in SHAPES}
        everywhere = [
            p
            for p in by_shape[next(iter(SHAPES))]
            if all(p in problems for problems in by_shape.values())
        ]
        results[name] = everywhere + [
            f"{shape} shape ({_shape_text(shape)}): {problem}"
            for shape, problems in by_shape.items()
            for problem in problems
            if problem not in everywhere
        ]
    return {name: problems for name, problems in results.items() if problems}


def _shape_text(shape: str) -> str:
    return ", ".join(f"{k}={str(v).lower()}" for k, v in SHAPES[shape].items())


def format_problems(results: Mapping[str, Iterable[str]]) -> str:
    return "\n".join(
        f"[{name}] {problem}" for name, problems in results.items() for problem in problems
    )
