"""App settings (local.settings.json + environment) and the host.json options the host reads."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


class HostConfigError(Exception):
    """The app, its settings or host.json ask for something the local host cannot do."""


def load_settings(
    path: str | os.PathLike[str] | None = "local.settings.json",
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """App settings as the Functions host sees them locally.

    ``Values`` of ``local.settings.json`` (when the file exists), overlaid by the environment:
    a variable that is set wins over the file, as with ``func start``.
    """
    settings: dict[str, str] = {}
    if path is not None and Path(path).is_file():
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise HostConfigError(f"{path} is not valid JSON: {error}") from None
        values = document.get("Values", {}) if isinstance(document, dict) else None
        if not isinstance(values, dict):
            raise HostConfigError(f'{path}: "Values" must be an object of setting names to strings')
        settings.update({str(k): "" if v is None else str(v) for k, v in values.items()})
    settings.update(os.environ if environ is None else environ)
    return settings


_PLACEHOLDER = re.compile(r"%([^%\s]+)%")


def resolve_placeholders(
    value: str, settings: Mapping[str, str], *, function: str, binding_property: str
) -> str:
    """Replace each ``%NAME%`` in a binding property with the app setting ``NAME``."""

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in settings:
            raise HostConfigError(
                f"function {function!r}: binding property {binding_property!r} = {value!r} "
                f"refers to app setting {name!r}, which is not set (neither in "
                "local.settings.json Values nor in the environment)"
            )
        return settings[name]

    return _PLACEHOLDER.sub(substitute, value)


def parse_timespan(text: str, *, what: str) -> float:
    """Seconds in a .NET TimeSpan string: ``hh:mm:ss``, ``d.hh:mm:ss``, ``hh:mm:ss.fff``."""
    match = re.fullmatch(r"(?:(\d+)\.)?(\d{1,2}):(\d{1,2}):(\d{1,2}(?:\.\d+)?)", text.strip())
    if match is None:
        raise HostConfigError(f"{what}: {text!r} is not a TimeSpan like 00:05:00")
    days, hours, minutes, seconds = match.groups()
    return ((int(days or 0) * 24 + int(hours)) * 60 + int(minutes)) * 60 + float(seconds)


@dataclass(frozen=True)
class ServiceBusOptions:
    """``extensions.serviceBus`` of host.json, with the Functions host's defaults."""

    max_concurrent_calls: int = 16
    prefetch_count: int = 0
    auto_complete_messages: bool = True
    max_auto_lock_renewal_duration: float = 300.0


def load_servicebus_options(host_json: str | os.PathLike[str] | None) -> ServiceBusOptions:
    """Read ``extensions.serviceBus`` from host.json; a missing file or key means the default."""
    if host_json is None or not Path(host_json).is_file():
        return ServiceBusOptions()
    try:
        document = json.loads(Path(host_json).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise HostConfigError(f"{host_json} is not valid JSON: {error}") from None
    section = document.get("extensions", {}).get("serviceBus", {})
    defaults = ServiceBusOptions()
    where = f"{host_json}: extensions.serviceBus"

    def integer(key: str, default: int, minimum: int) -> int:
        value = section.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise HostConfigError(f"{where}.{key} must be an integer >= {minimum}, not {value!r}")
        return value

    auto_complete = section.get("autoCompleteMessages", True)
    if not isinstance(auto_complete, bool):
        raise HostConfigError(f"{where}.autoCompleteMessages must be true or false")
    renewal = section.get("maxAutoLockRenewalDuration")
    return ServiceBusOptions(
        max_concurrent_calls=integer("maxConcurrentCalls", defaults.max_concurrent_calls, 1),
        prefetch_count=integer("prefetchCount", defaults.prefetch_count, 0),
        auto_complete_messages=auto_complete,
        max_auto_lock_renewal_duration=(
            defaults.max_auto_lock_renewal_duration
            if renewal is None
            else parse_timespan(str(renewal), what=f"{where}.maxAutoLockRenewalDuration")
        ),
    )
