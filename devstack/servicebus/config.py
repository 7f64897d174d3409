"""Queue declarations in the official Service Bus emulator's Config.json format.

The same file drives the official emulator (Docker) and this broker, so the two cannot drift.
Only queues are supported; topics are refused with a clear message rather than ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Final

MAX_MESSAGE_BYTES = 256 * 1024  # Service Bus Standard tier
DEAD_LETTER_SUFFIX = "/$deadletterqueue"

_DURATION = re.compile(
    r"^P(?:(?P<days>\d+)D)?"
    r"(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$"
)
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,259}$")


class ConfigError(ValueError):
    """The entity configuration file is not usable; the message says where and why."""


@dataclass(frozen=True, slots=True)
class QueueSettings:
    name: str
    lock_duration: timedelta = timedelta(minutes=1)
    max_delivery_count: int = 10
    default_ttl: timedelta = timedelta(days=14)
    dead_letter_on_expiration: bool = False
    requires_duplicate_detection: bool = False
    duplicate_detection_window: timedelta = timedelta(minutes=10)
    max_message_bytes: int = MAX_MESSAGE_BYTES

    @property
    def key(self) -> str:
        return self.name.lower()


def parse_duration(text: str, where: str) -> timedelta:
    """ISO 8601 duration as used by the emulator config (PT1M, P14D, PT20S, P1DT2H)."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if not match or text in ("P", "PT"):
        raise ConfigError(f"{where}: {text!r} is not an ISO 8601 duration such as 'PT1M' or 'P14D'")
    parts = {k: float(v) for k, v in match.groupdict().items() if v}
    return timedelta(**parts)


def load_queues(paths: Iterable[Path | str]) -> dict[str, QueueSettings]:
    """Queues from one or more config files, keyed by lower-cased name."""
    queues: dict[str, QueueSettings] = {}
    for path in paths:
        for queue in _queues_in(Path(path)):
            if queue.key in queues:
                raise ConfigError(f"{path}: queue {queue.name!r} is declared more than once")
            queues[queue.key] = queue
    return queues


def _queues_in(path: Path) -> list[QueueSettings]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read entity config {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    namespaces = _get(document, path, "UserConfig", dict).get("Namespaces")
    if not isinstance(namespaces, list) or not namespaces:
        raise ConfigError(f"{path}: UserConfig.Namespaces must be a non-empty list")
    queues = []
    for n, namespace in enumerate(namespaces):
        where = f"{path}: UserConfig.Namespaces[{n}]"
        if not isinstance(namespace, dict):
            raise ConfigError(f"{where} must be an object")
        if namespace.get("Topics"):
            raise ConfigError(f"{where}.Topics: topics are not supported by the development broker")
        declared = namespace.get("Queues") or []
        if not isinstance(declared, list):
            raise ConfigError(f"{where}.Queues must be a list")
        for q, entry in enumerate(declared):
            queues.append(_queue(entry, f"{where}.Queues[{q}]"))
    return queues


def _queue(entry: object, where: str) -> QueueSettings:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be an object")
    name = entry.get("Name")
    if not isinstance(name, str) or not _QUEUE_NAME.match(name):
        raise ConfigError(
            f"{where}.Name: {name!r} is not a valid queue name "
            "(letters, digits, '.', '-', '_'; starts with a letter or digit; up to 260 chars)"
        )
    props = entry.get("Properties") or {}
    if not isinstance(props, dict):
        raise ConfigError(f"{where}.Properties must be an object")
    if props.get("RequiresSession"):
        raise ConfigError(f"{where}: sessions are not supported by the development broker")
    for forward in ("ForwardTo", "ForwardDeadLetteredMessagesTo"):
        if props.get(forward):
            raise ConfigError(f"{where}.Properties.{forward}: forwarding is not supported")
    defaults = QueueSettings(name=name)

    def duration(key: str, default: timedelta) -> timedelta:
        value = props.get(key)
        return default if value is None else parse_duration(value, f"{where}.Properties.{key}")

    max_delivery = props.get("MaxDeliveryCount", defaults.max_delivery_count)
    if not isinstance(max_delivery, int) or isinstance(max_delivery, bool) or max_delivery < 1:
        raise ConfigError(f"{where}.Properties.MaxDeliveryCount must be a positive integer")
    settings = QueueSettings(
        name=name,
        lock_duration=duration("LockDuration", defaults.lock_duration),
        max_delivery_count=max_delivery,
        default_ttl=duration("DefaultMessageTimeToLive", defaults.default_ttl),
        dead_letter_on_expiration=_flag(props, "DeadLetteringOnMessageExpiration", where),
        requires_duplicate_detection=_flag(props, "RequiresDuplicateDetection", where),
        duplicate_detection_window=duration(
            "DuplicateDetectionHistoryTimeWindow", defaults.duplicate_detection_window
        ),
    )
    if not timedelta(seconds=1) <= settings.lock_duration <= timedelta(minutes=5):
        raise ConfigError(f"{where}.Properties.LockDuration must be between PT1S and PT5M")
    return settings


def _flag(props: dict, key: str, where: str) -> bool:
    value = props.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.Properties.{key} must be true or false")
    return value


def _get(document: object, path: Path, key: str, kind: type) -> dict:
    value = document.get(key) if isinstance(document, dict) else None
    if not isinstance(value, kind):
        raise ConfigError(f"{path}: top-level {key!r} must be an object (emulator Config.json)")
    return value


QUEUE_DEFAULTS: Final = {
    "DeadLetteringOnMessageExpiration": False,
    "DefaultMessageTimeToLive": "P14D",
    "DuplicateDetectionHistoryTimeWindow": "PT10M",
    "ForwardDeadLetteredMessagesTo": "",
    "ForwardTo": "",
    "LockDuration": "PT1M",
    "MaxDeliveryCount": 10,
    "RequiresDuplicateDetection": False,
    "RequiresSession": False,
}
"""Service Bus's own defaults for a new queue, in the emulator's Config.json spelling."""


def write_config(path: Path, queues: Iterable[str], **properties: object) -> None:
    """Write an emulator Config.json declaring ``queues``, each with :data:`QUEUE_DEFAULTS`
    overridden by ``properties`` (e.g. ``LockDuration="PT5S"``)."""
    props = {**QUEUE_DEFAULTS, **properties}
    namespace = {
        "Name": "sbemulatorns",
        "Queues": [{"Name": name, "Properties": props} for name in queues],
        "Topics": [],
    }
    document = {"UserConfig": {"Namespaces": [namespace], "Logging": {"Type": "File"}}}
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
