"""The broker's stats file: per-queue lock and redelivery counters, for benchmarks and tests.

``python -m devstack.servicebus.broker --stats-file PATH`` (by default ``broker.stats.json``
beside ``--port-file``) keeps one JSON document there, replaced atomically about once a second
while something changed, and at shutdown::

    {"pid", "started_utc", "updated_utc",
     "totals": {<counter>: n, "redelivered_after": {<cause>: n}},
     "queues": {<queue name>: {<counter>: n, "redelivered_after": {<cause>: n}}}}

The counters are :class:`devstack.servicebus.queues.LockStats`. They count from the broker's
start (a restarted broker starts again from 0; ``pid`` and ``started_utc`` tell). A broker
restarted through :meth:`devstack.stack.broker.BrokerProcess.restart` keeps the stopped
process's last document beside it (:func:`keep`), so :func:`read_all` sees every process's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

STATS_SUFFIX = ".stats.json"


def default_stats_path(port_file: Path | None) -> Path | None:
    """``broker.port`` -> ``broker.stats.json``; None without a port file."""
    return port_file.with_suffix(STATS_SUFFIX) if port_file is not None else None


def totals(queues: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The counters of several queues added up (``redelivered_after`` cause by cause)."""
    summed: dict[str, Any] = {"redelivered_after": {}}
    for counters in queues:
        for key, value in counters.items():
            if isinstance(value, Mapping):
                bucket = summed.setdefault(key, {})
                for cause, n in value.items():
                    bucket[cause] = bucket.get(cause, 0) + n
            else:
                summed[key] = summed.get(key, 0) + value
    summed["redelivered_after"] = dict(sorted(summed["redelivered_after"].items()))
    return summed


def write(path: Path, document: Mapping[str, Any]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(temporary, path)


def read(path: Path) -> dict[str, Any] | None:
    """The document, or None when there is none (yet) or it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def keep(path: Path) -> None:
    """Move a stopped broker's last document aside (``broker.<pid>.stats.json``) before a new
    broker writes its own at ``path``."""
    document = read(path)
    if document is not None:
        stem = path.name.removesuffix(STATS_SUFFIX)
        os.replace(path, path.with_name(f"{stem}.{document['pid']}{STATS_SUFFIX}"))


def read_all(path: Path) -> list[dict[str, Any]]:
    """The document at ``path`` and those :func:`keep` moved aside, one per broker process."""
    kept = path.parent.glob(f"{path.name.removesuffix(STATS_SUFFIX)}.*{STATS_SUFFIX}")
    return [d for p in [*kept, path] if (d := read(p)) is not None]
