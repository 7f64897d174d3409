"""Reading what happened on a local stack: orders in flight, alerts, the fakes' ledger, the
retries and Supervisor entries of a run's timelines, and the operation counters every host writes
to its stats file.

Everything here reads in one pass, never once per order: a summary of 10,000 orders must not
cost 10,000 queries (each a table scan in Azurite)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from azure.servicebus.aio import ServiceBusClient

from adapters.settings import Settings
from adapters.store.records import OrderRecords
from adapters.store.rows import TIMELINE_END, TIMELINE_PREFIX, timeline_from_entity
from adapters.tables import Table
from domain.order import Order, TimelineEntry

RETRY_EVENTS = ("released", "deferred")
"""Timeline events that hand a step back for a later attempt: each is one retry."""
SUPERVISOR_ACTOR = "supervisor:"


@dataclass(frozen=True)
class TimelineTally:
    """What the summaries need from timelines, without reading them order by order."""

    retries: int
    """Timeline entries that released or deferred a step (:data:`RETRY_EVENTS`)."""
    recovered_by_supervisor: frozenset[str]
    """Orders with at least one Supervisor entry in their timeline."""


async def timeline_tally(
    orders_table: Table, id_prefix: str, order_ids: set[str] | None = None
) -> TimelineTally:
    """Retries and Supervisor entries of the orders whose ids start with ``id_prefix`` (and,
    if given, are in ``order_ids``): ONE query over the orders table, whose filter keeps only
    the timeline rows that count, so it answers with those rows alone."""
    rows = orders_table.query_entities(
        "PartitionKey ge @first and PartitionKey lt @past"
        " and RowKey gt @low and RowKey lt @high"
        # The SDK substitutes parameters in words split at spaces: no ")" right after one.
        " and (Event eq @released or Event eq @deferred"
        " or (Actor ge @supervisor and Actor lt @past_supervisor ) )",
        parameters={
            "first": id_prefix,
            "past": past_prefix(id_prefix),
            "low": TIMELINE_PREFIX,
            "high": TIMELINE_END,
            "released": RETRY_EVENTS[0],
            "deferred": RETRY_EVENTS[1],
            "supervisor": SUPERVISOR_ACTOR,
            "past_supervisor": past_prefix(SUPERVISOR_ACTOR),
        },
        select=["PartitionKey", "Event", "Actor"],
        results_per_page=1000,
    )
    return tally_timeline([row async for row in rows], order_ids)


def tally_timeline(
    rows: Iterable[Mapping[str, Any]], order_ids: set[str] | None = None
) -> TimelineTally:
    """Fold timeline rows (``PartitionKey``, ``Event``, ``Actor``) into a tally."""
    retries = 0
    recovered: set[str] = set()
    for row in rows:
        order_id = row["PartitionKey"]
        if order_ids is not None and order_id not in order_ids:
            continue
        retries += row.get("Event") in RETRY_EVENTS
        if str(row.get("Actor") or "").startswith(SUPERVISOR_ACTOR):
            recovered.add(order_id)
    return TimelineTally(retries, frozenset(recovered))


async def timelines(orders_table: Table, id_prefix: str) -> dict[str, list[TimelineEntry]]:
    """Every timeline of the orders whose ids start with ``id_prefix``, oldest entry first: ONE
    query over the orders table (paged by the service), instead of one per order."""
    rows = orders_table.query_entities(
        "PartitionKey ge @first and PartitionKey lt @past and RowKey gt @low and RowKey lt @high",
        parameters={
            "first": id_prefix,
            "past": past_prefix(id_prefix),
            "low": TIMELINE_PREFIX,
            "high": TIMELINE_END,
        },
        results_per_page=1000,
    )
    found: dict[str, list[TimelineEntry]] = defaultdict(list)
    async for row in rows:
        found[row["PartitionKey"]].append(timeline_from_entity(row))
    for entries in found.values():
        entries.sort(key=lambda e: e.seq)
    return dict(found)


def common_prefix(order_ids: Iterable[str]) -> str:
    """The longest string every id starts with (a run's ids share one: ``chaos-<run>-``)."""
    ordered = sorted(order_ids)
    if not ordered:
        raise ValueError("no order ids")
    first, last = ordered[0], ordered[-1]
    size = next(
        (i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b),
        min(len(first), len(last)),
    )
    return first[:size]


def past_prefix(prefix: str) -> str:
    """The least string above every string that starts with ``prefix`` (a range's end)."""
    if not prefix:
        raise ValueError("an empty prefix has no end")
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class FinishWatch:
    """Each order's final state, read once: when it has left the active-order index (a
    finished order leaves it only after its last sends), one point read confirms it.

    Orders are read in the order given (submission order), at most ``reads_per_poll`` per
    :meth:`poll`, so orders not submitted yet cost a read or two, not one each per poll.
    """

    def __init__(self, order_ids: Iterable[str], reads_per_poll: int = 60) -> None:
        self._unseen = dict.fromkeys(order_ids)  # ordered, and O(1) to remove from
        self._ours = set(self._unseen)
        self._reads_per_poll = reads_per_poll
        self.finals: dict[str, Order] = {}
        self.in_flight = 0
        """Orders of ours in the active-order index at the last poll."""

    @property
    def unfinished(self) -> int:
        return len(self._unseen)

    async def poll(self, store: OrderRecords) -> list[Order]:
        """One look: the index, then a point read of the next orders that have left it.
        Returns the orders found finished by this look."""
        active = {row.order_id async for row in store.all_active()} & self._ours
        self.in_flight = len(active)
        left_index = (o for o in self._unseen if o not in active)
        found = []
        for order_id in list(itertools.islice(left_index, self._reads_per_poll)):
            order = await store.find(order_id)
            if order is not None and order.state.terminal:
                self.finals[order_id] = order
                del self._unseen[order_id]
                found.append(order)
        return found


async def any_active(store: OrderRecords, order_ids: set[str]) -> bool:
    """Whether one of ``order_ids`` is in the active-order index (read until one is found)."""
    async for row in store.all_active():
        if row.order_id in order_ids:
            return True
    return False


async def alerted_orders(settings: dict[str, str]) -> set[str]:
    """Order ids named by the alerts waiting on the operator alert queue (peeked, not taken)."""
    queue = Settings.from_env(settings).queue("alerts")
    found = [json.loads(body).get("order_id") async for body in peek_all(settings, queue)]
    return {order_id for order_id in found if order_id}


async def peek_all(settings: dict[str, str], queue: str) -> AsyncIterator[bytes]:
    """The body of every message waiting on ``queue``, peeked (nothing is taken)."""
    async with (
        ServiceBusClient.from_connection_string(settings["ServiceBusConnection"]) as client,
        client.get_queue_receiver(queue) as receiver,
    ):
        sequence = 1
        while batch := await receiver.peek_messages(
            max_message_count=250, sequence_number=sequence
        ):
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


async def read_ledger(fakes_url: str) -> Ledger:
    """The fakes' ledger and tombstones, read together from ``GET /_ledger``: one snapshot,
    which the checks below read (each check of a run reads the same one)."""
    async with httpx.AsyncClient(base_url=fakes_url, timeout=30) as http:
        answer = await http.get("/_ledger")
        answer.raise_for_status()
        body = answer.json()
        if isinstance(body, list):  # an old fakes server: entries only
            return Ledger(tuple(body), ())
        tombstones = body.get("tombstones")
        if tombstones is None:
            reply = await http.get("/_tombstones")
            tombstones = reply.json()["entries"] if reply.status_code == 200 else []
    return Ledger(tuple(body["entries"]), tuple(tombstones))


def step_of(entry: dict[str, Any]) -> str:
    """The workflow step an effect belongs to, from its key ``<order>:<step>:<do|undo>:<gen>``
    (the service name when the key is not of that form)."""
    parts = str(entry["idempotency_key"]).split(":")
    if len(parts) == 4 and parts[2] in ("do", "undo") and parts[1]:
        return parts[1]
    return str(entry["service"])


def duplicated_effects(ledger: Ledger, order_ids: set[str]) -> int:
    """Effects applied more than once: a forward key with more than one forward effect, or a
    forward key undone more than once (each must take effect at most once), per service."""
    forward = Counter((e["service"], e["idempotency_key"]) for e in ledger.forward(order_ids))
    undone = Counter((e["service"], e["undoes"]) for e in ledger.undos(order_ids))
    return sum(n - 1 for n in (*forward.values(), *undone.values()) if n > 1)


def forward_effects(ledger: Ledger, order_ids: set[str]) -> set[tuple[str, str, str]]:
    """``(order_id, step, key)`` of every forward effect that took effect for these orders,
    undone or not: whether a step the app saw fail did in fact happen at its service."""
    return {(e["order_id"], step_of(e), e["idempotency_key"]) for e in ledger.forward(order_ids)}


def undo_without_do(ledger: Ledger, order_ids: set[str]) -> list[tuple[str, str]]:
    """``(service, forward key)`` of every undo effect whose forward call never took effect at
    that service: an undo that reversed nothing (a refund of a charge that never happened)."""
    done = {(e["service"], e["idempotency_key"]) for e in ledger.forward()}
    return sorted(
        {(e["service"], e["undoes"]) for e in ledger.undos(order_ids)} - done,
    )


def effects_left_in_place(ledger: Ledger, error_order_ids: set[str]) -> list[tuple[str, str, str]]:
    """``(service, order_id, forward key)`` of every forward effect of an order that ended in
    Error with no undo effect naming it: something the compensation left behind."""
    undone = {(e["service"], e["undoes"]) for e in ledger.undos()}
    return sorted(
        (e["service"], e["order_id"], e["idempotency_key"])
        for e in ledger.forward(error_order_ids)
        if (e["service"], e["idempotency_key"]) not in undone
    )


def effects_after_tombstone(ledger: Ledger, order_ids: set[str]) -> list[tuple[str, str, str]]:
    """``(service, order_id, forward key)`` of every forward effect whose key is tombstoned:
    a call that took effect although it had been undone before (the service must refuse it)."""
    dead = {(t["service"], t["idempotency_key"]) for t in ledger.tombstones}
    return sorted(
        (e["service"], e["order_id"], e["idempotency_key"])
        for e in ledger.forward(order_ids)
        if (e["service"], e["idempotency_key"]) in dead
    )


def host_invocations(workdir: Path, function: str, *, counted: str = "invocations") -> int:
    """How often every host of the stack has run `function` so far (``counted``: a field of
    the hosts' function stats, e.g. ``successes`` for the runs that returned)."""
    total = 0
    for path in workdir.glob("host-*.stats.json"):
        try:
            stats = json.loads(path.read_text()).get("functions", {}).get(function, {})
        except (OSError, ValueError):
            continue
        total += int(stats.get(counted, 0))
    return total


async def host_operations_after(
    workdir: Path, since: float, *, every_s: float = 1.0, wait_s: float = 3.0
) -> dict[str, int]:
    """:func:`host_operations`, once every host has rewritten its stats file after ``since``
    (a time.time(); each host rewrites it every ``every_s``), so the latest requests count.
    Gives up waiting after ``wait_s`` (a host that stopped writing)."""
    deadline = time.monotonic() + max(wait_s, every_s)
    while time.monotonic() < deadline:
        written = [p.stat().st_mtime for p in workdir.glob("host-*.stats.json")]
        if written and min(written) > since:
            break
        await asyncio.sleep(0.1)
    return host_operations(workdir)


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
