"""Function indexing: what the Functions host learns from ``app.get_functions()``.

The host reads each function's binding JSON (``get_function_json()``), resolves ``%SETTING%``
placeholders from the app settings, and refuses what it cannot drive faithfully.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import azure.functions as func

from devstack.host.ncrontab import NcrontabSchedule
from devstack.host.settings import HostConfigError, resolve_placeholders

log = logging.getLogger("devstack.host")

SERVICEBUS_TRIGGER = "serviceBusTrigger"
TIMER_TRIGGER = "timerTrigger"
HTTP_TRIGGER = "httpTrigger"
DEFAULT_SERVICEBUS_CONNECTION = "AzureWebJobsServiceBus"


@dataclass(frozen=True)
class ServiceBusTrigger:
    queue_name: str
    connection: str  # name of the app setting (or setting prefix) holding the connection
    body_as: str  # "message" (func.ServiceBusMessage), "str" or "bytes", from the annotation

    def describe(self) -> str:
        return f"queue={self.queue_name}"


@dataclass(frozen=True)
class TimerTrigger:
    schedule: NcrontabSchedule
    run_on_startup: bool
    use_monitor: bool

    def describe(self) -> str:
        return f"schedule={self.schedule.expression!r}" + (
            " runOnStartup" if self.run_on_startup else ""
        )


@dataclass(frozen=True)
class HttpTrigger:
    route: str
    methods: tuple[str, ...]
    auth_level: str

    def describe(self) -> str:
        return f"route=/api/{self.route.lstrip('/')} methods={','.join(self.methods) or 'any'}"


Trigger = ServiceBusTrigger | TimerTrigger | HttpTrigger


@dataclass(frozen=True)
class IndexedFunction:
    name: str
    user_function: Callable[..., Any]
    trigger: Trigger
    trigger_param: str
    wants_context: bool
    directory: str

    @property
    def trigger_type(self) -> str:
        return {
            ServiceBusTrigger: SERVICEBUS_TRIGGER,
            TimerTrigger: TIMER_TRIGGER,
            HttpTrigger: HTTP_TRIGGER,
        }[type(self.trigger)]


def load_app(
    app_module: str | ModuleType | func.FunctionRegister, attribute: str = "app"
) -> tuple[Any, str]:
    """Import the app module and return (its FunctionApp, the module's directory); given a
    FunctionApp itself (one a test built on a composition root of its own), that and the
    working directory."""
    if isinstance(app_module, func.FunctionRegister):
        return app_module, str(Path.cwd())
    if isinstance(app_module, str):
        try:
            module = importlib.import_module(app_module)
        except ValueError as refused:  # the app's own check of its settings (and the like)
            raise HostConfigError(f"the app {app_module!r} did not load: {refused}") from None
    else:
        module = app_module
    app = getattr(module, attribute, None)
    if app is None or not callable(getattr(app, "get_functions", None)):
        raise HostConfigError(
            f"module {module.__name__!r} has no FunctionApp named {attribute!r} "
            "(expected `app = func.FunctionApp()` at module level)"
        )
    module_file = getattr(module, "__file__", None)
    directory = str(Path(module_file).resolve().parent) if module_file else str(Path.cwd())
    return app, directory


def index_app(
    app: Any,
    settings: Mapping[str, str],
    *,
    directory: str = ".",
    only: Collection[str] | None = None,
) -> list[IndexedFunction]:
    """Index the app's functions: ``app.get_functions()`` is called once, here.

    ``only`` selects functions by name (the others are neither validated nor run). Functions
    disabled with the app setting ``AzureWebJobs.<name>.Disabled`` are left out.
    """
    return index_apps([(app, directory)], settings, only=only)


def index_apps(
    apps: Sequence[tuple[Any, str]],
    settings: Mapping[str, str],
    *,
    only: Collection[str] | None = None,
) -> list[IndexedFunction]:
    """:func:`index_app` for several apps (each with its directory) served by one host: every
    name must be unique across them, and each name in ``only`` in one of them."""
    by_name: dict[str, tuple[Any, str]] = {}
    for app, directory in apps:
        for function in _functions_of(app):
            name = function.get_function_name()
            if name in by_name:
                raise HostConfigError(f"two apps of the host define a function named {name!r}")
            by_name[name] = (function, directory)
    if only is not None:
        unknown = sorted(set(only) - set(by_name))
        if unknown:
            raise HostConfigError(
                f"no function named {', '.join(map(repr, unknown))} in the app; "
                f"it defines: {', '.join(sorted(by_name)) or 'none'}"
            )
    indexed: list[IndexedFunction] = []
    for name, (function, directory) in by_name.items():
        if only is not None and name not in only:
            continue
        if settings.get(f"AzureWebJobs.{name}.Disabled", "").strip().lower() in ("true", "1"):
            log.info("function %s is disabled (AzureWebJobs.%s.Disabled)", name, name)
            continue
        indexed.append(_index_function(function, settings, directory))
    return indexed


def _functions_of(app: Any) -> list[Any]:
    root = logging.getLogger()
    root.addFilter(_drop_auth_level_notice)
    try:
        return list(app.get_functions())
    except ValueError as error:
        raise HostConfigError(
            f"app.get_functions() failed: {error} (it may be called only once per FunctionApp "
            "object; load the app module afresh for each host)"
        ) from error
    finally:
        root.removeFilter(_drop_auth_level_notice)


def _drop_auth_level_notice(record: logging.LogRecord) -> bool:
    """azure-functions warns on every get_functions() of an app without HTTP triggers."""
    return not str(record.msg).startswith("Auth level is not applied to non http function app")


def _index_function(function: Any, settings: Mapping[str, str], directory: str) -> IndexedFunction:
    name: str = function.get_function_name()
    user_function = function.get_user_function()
    bindings: list[dict[str, Any]] = json.loads(function.get_function_json())["bindings"]
    triggers = [b for b in bindings if str(b.get("type", "")).endswith("Trigger")]
    if len(triggers) != 1:
        raise HostConfigError(f"function {name!r} must have exactly one trigger, not {triggers}")
    binding = {
        key: (
            resolve_placeholders(value, settings, function=name, binding_property=key)
            if isinstance(value, str)
            else value
        )
        for key, value in triggers[0].items()
    }
    kind = binding["type"]
    for other in bindings:
        if other is triggers[0]:
            continue
        if kind == HTTP_TRIGGER and other.get("type") == "http":
            continue  # the HTTP response ($return) that goes with an HTTP trigger
        raise HostConfigError(
            f"function {name!r}: binding {other.get('name')!r} of type {other.get('type')!r} is "
            "not supported by the local host (it serves serviceBusTrigger, timerTrigger and "
            "httpTrigger only; send with the azure-servicebus SDK instead of output bindings)"
        )
    trigger: Trigger
    if kind == SERVICEBUS_TRIGGER:
        trigger = _servicebus_trigger(name, binding, user_function)
    elif kind == TIMER_TRIGGER:
        trigger = _timer_trigger(name, binding)
    elif kind == HTTP_TRIGGER:
        trigger = HttpTrigger(
            route=binding.get("route") or name,
            methods=tuple(str(m).upper() for m in binding.get("methods") or ()),
            auth_level=str(binding.get("authLevel", "FUNCTION")),
        )
    else:
        raise HostConfigError(
            f"function {name!r}: trigger binding type {kind!r} is not supported by the local "
            "host (it serves serviceBusTrigger, timerTrigger and httpTrigger)"
        )
    trigger_param = binding["name"]
    wants_context = _check_parameters(name, user_function, trigger_param)
    return IndexedFunction(name, user_function, trigger, trigger_param, wants_context, directory)


def _servicebus_trigger(
    name: str, binding: Mapping[str, Any], user_function: Callable[..., Any]
) -> ServiceBusTrigger:
    def refuse(why: str) -> typing.NoReturn:
        raise HostConfigError(f"function {name!r}: serviceBusTrigger {why}")

    if "queueName" not in binding:
        refuse("on a topic subscription is not supported by the local host (queues only)")
    if binding.get("isSessionsEnabled"):
        refuse("with isSessionsEnabled=true is not supported by the local host")
    if str(binding.get("cardinality", "one")).lower() != "one":
        refuse(f"with cardinality={binding['cardinality']!r} is not supported (only 'one')")
    if binding.get("autoCompleteMessages") is False:
        refuse("with autoCompleteMessages=false is not supported by the local host")
    body_as = "message"
    annotation = _annotations(user_function).get(binding["name"])
    if annotation is str:
        body_as = "str"
    elif annotation is bytes:
        body_as = "bytes"
    return ServiceBusTrigger(
        queue_name=binding["queueName"],
        connection=binding.get("connection") or DEFAULT_SERVICEBUS_CONNECTION,
        body_as=body_as,
    )


def _timer_trigger(name: str, binding: Mapping[str, Any]) -> TimerTrigger:
    try:
        schedule = NcrontabSchedule(str(binding.get("schedule", "")))
    except ValueError as error:
        raise HostConfigError(f"function {name!r}: timerTrigger schedule: {error}") from None
    return TimerTrigger(
        schedule=schedule,
        run_on_startup=bool(binding.get("runOnStartup", False)),
        use_monitor=bool(binding.get("useMonitor", True)),
    )


def _annotations(user_function: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(user_function)
    except Exception:  # unresolvable string annotations: fall back to the raw ones
        return dict(getattr(user_function, "__annotations__", {}))


def _check_parameters(name: str, user_function: Callable[..., Any], trigger_param: str) -> bool:
    """Check the signature binds; return whether the function asks for ``context``."""
    parameters = inspect.signature(user_function).parameters
    if trigger_param not in parameters:
        raise HostConfigError(
            f"function {name!r} has no parameter {trigger_param!r} for its trigger binding"
        )
    for parameter in parameters.values():
        if parameter.name in (trigger_param, "context"):
            continue
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.default is parameter.empty:
            raise HostConfigError(
                f"function {name!r}: parameter {parameter.name!r} has no binding "
                "(the local host passes only the trigger and `context`)"
            )
    return "context" in parameters
