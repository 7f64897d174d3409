"""Reading what happened on a local stack: orders in flight, alerts, the fakes' ledger, and
the operation counters every host writes to its stats file."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from azure.servicebus import ServiceBusClient

from core.settings import Settings
from core.state_models import ActiveRow
from core.state_store import OrderStateStore


def all_active(store: OrderStateStore) -> Iterator[ActiveRow]:
    """Every row of the active-order index, page by page."""
    continuation = None
    while True:
        page = store.list_active(1000, continuation=continuation)
        yield from page.rows
        continuation = page.continuation
        if continuation is None:
            return


def alerted_orders(settings: dict[str, str]) -> set[str]:
    """Order ids named by the alerts waiting on the operator alert queue (peeked, not taken)."""
    queue = Settings.from_env(settings).queue("alerts")
    found = (json.loads(body).get("order_id") for body in peek_all(settings, queue))
    return {order_id for order_id in found if order_id}


def peek_all(settings: dict[str, str], queue: str) -> Iterator[bytes]:
    """The body of every message waiting on ``queue``, peeked (nothing is taken)."""
    with (
        ServiceBusClient.from_connection_string(settings["ServiceBusConnection"]) as client,
        client.get_queue_receiver(queue) as receiver,
    ):
        sequence = 1
        while batch := receiver.peek_messages(max_message_count=250, sequence_number=sequence):
            for message in batch:
                yield b"".join(message.body)
            sequence = batch[-1].sequence_number + 1


@dataclass(frozen=True)
class Ledger:
    """What the fake services recorded, read in one request: effects and tombstones.

    ``entries``: one dict per effect (``service``, ``operation``, ``idempotency_key``,
    ``order_id``, ``undoes``: None for a forward effect, the forward key for an undo).
    ``tombstones``: forward keys undone before they took effect (``service``,
    ``idempotency_key``, ``undo_key``, ``order_id``).
    """

    entries: tuple[dict[str, Any], ...]
    tombstones: tuple[dict[str, Any], ...]

    def forward(self, order_ids: set[str] | None = None) -> list[dict[str, Any]]:
        return [e for e in self._of(order_ids) if e.get("undoes") is None]

    def undos(self, order_ids: set[str] | None = None) -> list[dict[str, Any]]:
        return [e for e in self._of(order_ids) if e.get("undoes") is not None]

    def _of(self, order_ids: set[str] | None) -> list[dict[str, Any]]:
        return [e for e in self.entries if order_ids is None or e.get("order_id") in order_ids]


LedgerSource = str | Ledger
"""The fakes' base URL (read now) or a Ledger read before (several checks, one snapshot)."""


def read_ledger(fakes_url: LedgerSource) -> Ledger:
    """The fakes' ledger and tombstones, read together from ``GET /_ledger``."""
    if isinstance(fakes_url, Ledger):
        return fakes_url
    answer = httpx.get(f"{fakes_url}/_ledger", timeout=30)
    answer.raise_for_status()
    body = answer.json()
    if isinstance(body, list):  # an old fakes server: entries only
        return Ledger(tuple(body), ())
    tombstones = body.get("tombstones")
    if tombstones is None:
        reply = httpx.get(f"{fakes_url}/_tombstones", timeout=30)
        tombstones = reply.json()["entries"] if reply.status_code == 200 else []
    return Ledger(tuple(body["entries"]), tuple(tombstones))


def step_of(entry: dict[str, Any]) -> str:
    """The workflow step an effect belongs to, from its key ``<order>:<step>:<do|undo>:<gen>``
    (the service name when the key is not of that form)."""
    parts = str(entry["idempotency_key"]).split(":")
    if len(parts) == 4 and parts[2] in ("do", "undo") and parts[1]:
        return parts[1]
    return str(entry["service"])


def duplicated_effects(fakes_url: LedgerSource, order_ids: set[str]) -> int:
    """Effects applied more than once: a forward key with more than one forward effect, or a
    forward key undone more than once (each must take effect at most once), per service."""
    ledger = read_ledger(fakes_url)
    forward = Counter((e["service"], e["idempotency_key"]) for e in ledger.forward(order_ids))
    undone = Counter((e["service"], e["undoes"]) for e in ledger.undos(order_ids))
    return sum(n - 1 for n in (*forward.values(), *undone.values()) if n > 1)


def forward_effects(fakes_url: LedgerSource, order_ids: set[str]) -> set[tuple[str, str, str]]:
    """``(order_id, step, key)`` of every forward effect that took effect for these orders,
    undone or not: whether a step the app saw fail did in fact happen at its service."""
    ledger = read_ledger(fakes_url)
    return {(e["order_id"], step_of(e), e["idempotency_key"]) for e in ledger.forward(order_ids)}


def undo_without_do(fakes_url: LedgerSource, order_ids: set[str]) -> list[tuple[str, str]]:
    """``(service, forward key)`` of every undo effect whose forward call never took effect at
    that service: an undo that reversed nothing (a refund of a charge that never happened)."""
    ledger = read_ledger(fakes_url)
    done = {(e["service"], e["idempotency_key"]) for e in ledger.forward()}
    return sorted(
        {(e["service"], e["undoes"]) for e in ledger.undos(order_ids)} - done,
    )


def effects_left_in_place(
    fakes_url: LedgerSource, error_order_ids: set[str]
) -> list[tuple[str, str, str]]:
    """``(service, order_id, forward key)`` of every forward effect of an order that ended in
    Error with no undo effect naming it: something the compensation left behind."""
    ledger = read_ledger(fakes_url)
    undone = {(e["service"], e["undoes"]) for e in ledger.undos()}
    return sorted(
        (e["service"], e["order_id"], e["idempotency_key"])
        for e in ledger.forward(error_order_ids)
        if (e["service"], e["idempotency_key"]) not in undone
    )


def effects_after_tombstone(
    fakes_url: LedgerSource, order_ids: set[str]
) -> list[tuple[str, str, str]]:
    """``(service, order_id, forward key)`` of every forward effect whose key is tombstoned:
    a call that took effect although it had been undone before (the service must refuse it)."""
    ledger = read_ledger(fakes_url)
    dead = {(t["service"], t["idempotency_key"]) for t in ledger.tombstones}
    return sorted(
        (e["service"], e["order_id"], e["idempotency_key"])
        for e in ledger.forward(order_ids)
        if (e["service"], e["idempotency_key"]) in dead
    )


def host_invocations(workdir: Path, function: str) -> int:
    """How often every host of the stack has run `function` so far."""
    total = 0
    for path in workdir.glob("host-*.stats.json"):
        try:
            stats = json.loads(path.read_text()).get("functions", {}).get(function, {})
        except (OSError, ValueError):
            continue
        total += int(stats.get("invocations", 0))
    return total


def host_operations(workdir: Path) -> dict[str, int]:
    """Storage and Service Bus operations counted by every host of the stack, added up."""
    total: Counter[str] = Counter()
    for path in workdir.glob("host-*.stats.json"):
        try:
            total.update(json.loads(path.read_text()).get("operations", {}))
        except (OSError, ValueError):
            continue
    return dict(total)


def process_cpu(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds each named process has used so far (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    used = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used[name] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return used
