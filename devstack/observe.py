"""Reading what happened on a local stack: orders in flight, alerts, the fakes' ledger, and
the operation counters every host writes to its stats file."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

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
    found: set[str] = set()
    with (
        ServiceBusClient.from_connection_string(settings["ServiceBusConnection"]) as client,
        client.get_queue_receiver(queue) as receiver,
    ):
        sequence = 1
        while batch := receiver.peek_messages(max_message_count=250, sequence_number=sequence):
            for message in batch:
                order_id = json.loads(b"".join(message.body)).get("order_id")
                if order_id:
                    found.add(order_id)
            sequence = batch[-1].sequence_number + 1
    return found


def duplicated_effects(fakes_url: str, order_ids: set[str]) -> int:
    """Effects the fake services applied more than once for one idempotency key."""
    ledger = httpx.get(f"{fakes_url}/_ledger", timeout=30).json()
    entries = ledger["entries"] if isinstance(ledger, dict) else ledger
    keys = Counter(
        (e["service"], e["idempotency_key"]) for e in entries if e.get("order_id") in order_ids
    )
    return sum(n - 1 for n in keys.values() if n > 1)


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
