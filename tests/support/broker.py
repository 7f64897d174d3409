"""The development Service Bus broker (``devstack.servicebus.broker``) as a test process.

Command-line contract of the broker, which this module codes against::

    python -m devstack.servicebus.broker --host 127.0.0.1 --port 0 \\
        --config PATH [--config PATH ...] --port-file PATH [--data-dir DIR] \\
        [--key-name NAME] [--key KEY] [--log-level info]

It writes the port it listens on (decimal, then a newline) to ``--port-file`` only once it is
listening, and exits on SIGTERM within about 2 s.

Entity configs use the official Service Bus emulator's ``Config.json`` format.
:func:`write_suffixed_config` writes a copy in which every queue and topic name carries a
per-run suffix, so runs against a shared or persistent broker never see each other's messages.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from devstack.stack import processes
from devstack.stack.broker import (
    DEFAULT_CONFIG,
    BrokerProcess,
)

EXTERNAL_ENV_VAR = "SERVICEBUS_CONNECTION_STRING_TESTS"


# -- entity configs ------------------------------------------------------------------------


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def entity_names(config: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(queue names, topic names) declared in an emulator-format config."""
    queues: list[str] = []
    topics: list[str] = []
    for ns in config.get("UserConfig", {}).get("Namespaces", []):
        queues += [q["Name"] for q in ns.get("Queues", [])]
        topics += [t["Name"] for t in ns.get("Topics", [])]
    return queues, topics


def suffixed(name: str, suffix: str) -> str:
    return f"{name}-{suffix}" if suffix else name


def write_suffixed_config(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], suffix: str
) -> dict[str, str]:
    """Copy ``src`` to ``dst`` with ``-suffix`` on every queue and topic name.

    ``ForwardTo`` and ``ForwardDeadLetteredMessagesTo`` that name an entity of the same file
    are renamed too. Returns {logical name: actual name} for the queues and topics.
    """
    config = load_config(src)
    queues, topics = entity_names(config)
    mapping = {name: suffixed(name, suffix) for name in [*queues, *topics]}

    def rename_forwards(props: dict[str, Any] | None) -> None:
        if not props:
            return
        for key in ("ForwardTo", "ForwardDeadLetteredMessagesTo"):
            target = props.get(key)
            if target and target in mapping:
                props[key] = mapping[target]

    for ns in config.get("UserConfig", {}).get("Namespaces", []):
        for queue in ns.get("Queues", []):
            queue["Name"] = mapping[queue["Name"]]
            rename_forwards(queue.get("Properties"))
        for topic in ns.get("Topics", []):
            topic["Name"] = mapping[topic["Name"]]
            for sub in topic.get("Subscriptions", []):
                rename_forwards(sub.get("Properties"))
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return mapping


# -- the namespace the tests see -----------------------------------------------------------


@dataclass(frozen=True)
class ServiceBusNamespace:
    """A Service Bus endpoint for tests, with the actual names of the declared entities.

    Locally every queue and topic carries a per-run suffix: always go through :meth:`queue` /
    :meth:`topic`. Against an external endpoint the names are used as declared.
    ``broker`` is the local process (None for an external endpoint).
    """

    connection_string: str
    queues: Mapping[str, str]
    topics: Mapping[str, str]
    config_paths: tuple[Path, ...]
    broker: BrokerProcess | None = field(default=None, compare=False, repr=False)

    def queue(self, logical_name: str) -> str:
        return self._lookup(self.queues, "queue", logical_name)

    def topic(self, logical_name: str) -> str:
        return self._lookup(self.topics, "topic", logical_name)

    def _lookup(self, names: Mapping[str, str], kind: str, logical_name: str) -> str:
        try:
            return names[logical_name]
        except KeyError:
            raise KeyError(
                f"{kind} {logical_name!r} is not declared in any broker config "
                f"({', '.join(str(p) for p in self.config_paths) or 'none loaded'}); "
                f"declared: {sorted(names)}"
            ) from None


def external_namespace(config_paths: Iterable[Path]) -> ServiceBusNamespace | None:
    """The endpoint named by SERVICEBUS_CONNECTION_STRING_TESTS, or None when it is unset."""
    conn = os.environ.get(EXTERNAL_ENV_VAR, "").strip()
    if not conn:
        return None
    queues: dict[str, str] = {}
    topics: dict[str, str] = {}
    existing = tuple(p for p in config_paths if p.is_file())
    for path in existing:
        q, t = entity_names(load_config(path))
        queues.update((n, n) for n in q)
        topics.update((n, n) for n in t)
    return ServiceBusNamespace(
        connection_string=conn,
        queues=MappingProxyType(queues),
        topics=MappingProxyType(topics),
        config_paths=existing,
    )


def start_local_namespace(
    config_paths: Iterable[Path],
    workdir: Path,
    run_suffix: str | None = None,
    data_dir: Path | None = None,
) -> ServiceBusNamespace:
    """Write suffixed copies of the configs into ``workdir`` and start a broker on them.

    The caller owns ``namespace.broker`` and must stop it.
    """
    suffix = run_suffix if run_suffix is not None else secrets.token_hex(3)
    queues: dict[str, str] = {}
    topics: dict[str, str] = {}
    derived: list[Path] = []
    for i, src in enumerate(config_paths):
        if not src.is_file():
            raise processes.ServiceStartError(f"broker config not found: {src}")
        dst = workdir / "configs" / f"{i:02d}-{src.parent.name}-{src.name}"
        mapping = write_suffixed_config(src, dst, suffix)
        q, t = entity_names(load_config(src))
        queues.update((n, mapping[n]) for n in q)
        topics.update((n, mapping[n]) for n in t)
        derived.append(dst)
    if not derived:
        raise processes.ServiceStartError(
            f"no broker config to start from: {DEFAULT_CONFIG} does not exist yet and no test "
            "asked for another one (pytest.mark.servicebus_config)"
        )
    broker = BrokerProcess(derived, data_dir=data_dir, log_path=workdir / "broker.log")
    broker.start()
    return ServiceBusNamespace(
        connection_string=broker.connection_string,
        queues=MappingProxyType(queues),
        topics=MappingProxyType(topics),
        config_paths=tuple(derived),
        broker=broker,
    )
