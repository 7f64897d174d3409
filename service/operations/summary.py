"""The overview's numbers, at a cost that follows what is in flight, in Error or recently
finished, never the whole order history.

What each part reads, and how often (each part is cached for its own time, so any number of
browsers refreshing every few seconds cost one read per part per period and instance):

- **In flight** (every ``ACTIVE_TTL``): the active-order index, one request per 1,000 rows
  (:meth:`adapters.store.records.OrderRecords.list_active`). Its rows say which orders are in
  flight and when each is due (``overdue``: due now, the Supervisor acts on it next), not their
  state: the split into Pending, Processing and Compensating comes from point reads of at most
  ``STATE_READS`` orders per period. With more in flight the split is estimated from those
  read (a different slice each period) and says so.
- **Error** (every ``ERROR_TTL``): the Error index, one request per 1,000 rows, plus point reads
  of the orders that entered Error within the window (at most ``ERROR_READS``) for what
  caused each: declined (compensated, or nothing to undo), failure threshold, cancelled.
- **Finished** (every ``FINISHED_TTL``): Processed orders last changed within the window, from
  one query on the orders table's process rows (``RowKey eq 'process' and ProcessState eq
  'Processed' and UpdatedAt ge <window start>``), their summary columns only, at most
  ``FINISHED_REQUESTS`` pages of 1,000. There is no index of Processed orders (it would cost a
  write on every order's hot path), so the service answers this query by reading the process
  rows it holds: with retention on (RETENTION_DAYS) that is a bounded table; beyond the page
  budget the series says ``partial``. Throughput per interval, latency (created to Processed,
  first generation only: a resubmitted order's age includes its time in Error) p50 and p99,
  and the requests those orders needed beyond one per step (retries).
- **Supervisor** (every ``SUPERVISOR_TTL``): one read of its roster
  (:func:`service.operations.supervisor.supervisor`).
- **Alerts** (every ``ALERTS_TTL``): a peek of the alerts queue with each alert's resolution
  (:func:`service.operations.alerts.list_alerts`, a point read per order named).
- **Dead letters** (every ``DEAD_LETTERS_TTL``): one peek per queue
  (:func:`service.operations.dead_letters.dead_letter_summary`).
- **Circuits** (every ``CIRCUITS_TTL``): one query of the ``circuits`` partition of the
  supervision table, where each agent instance writes its breaker's state on each transition
  (:mod:`adapters.store.circuits`): per agent, the worst current state across instances, since
  when, and
  the rows that say nothing current (stale). Rows not written for a day are deleted, a few per
  read.

Alerts and dead letters are read in tasks of their own: a summary answers with their last copy
(``{"pending": true}`` before the first) and never waits for Service Bus.

Each part that fails (Service Bus unreachable, say) reports its error and leaves the others.
The process also keeps a short history of what it read (in flight, Error, Supervisor lag) for
the overview's charts: it starts when a dashboard first asks, and each instance of the app
keeps its own.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeVar

from adapters.store import circuit_overview as circuits
from adapters.store.active_index import ActiveRow
from adapters.store.circuit_overview import CircuitRows
from adapters.store.error_index import ErrorRow
from adapters.store.rows import PROCESS_ROW, etag_of, order_from_entity, utc
from domain.agents import AGENT_NAMES
from domain.order import Order, StepState
from domain.states import ProcessState
from service.listing import SUMMARY_COLUMNS
from service.operations import alerts as alert_views
from service.operations import dead_letters as dead_letter_views
from service.operations import supervisor as supervisor_view
from service.operations.alert_resolution import STILL_OPEN
from service.operations.context import OperatorContext
from service.runtime import Runtime

log = logging.getLogger("service.operations.summary")

T = TypeVar("T")
Part = dict[str, Any]
"""One part of the summary, JSON-ready."""
_Read = Callable[[], Awaitable[Part]]
"""Reads one part of the summary."""

ACTIVE_TTL: Final = 3.0
ERROR_TTL: Final = 10.0
FINISHED_TTL: Final = 10.0
SUPERVISOR_TTL: Final = 5.0
ALERTS_TTL: Final = 5.0
DEAD_LETTERS_TTL: Final = 15.0
CIRCUITS_TTL: Final = 5.0

INDEX_PAGE: Final = 1000
MAX_INDEX_PAGES: Final = 20
"""At most this many index pages per read (20,000 rows); beyond, counts say ``partial``."""
STATE_READS: Final = 100
ERROR_READS: Final = 50
FINISHED_PAGE: Final = 1000
FINISHED_REQUESTS: Final = 5
READ_CONCURRENCY: Final = 8
"""Point reads of orders in flight at once."""

MIN_WINDOW_S: Final = 300
MAX_WINDOW_S: Final = 3600
DEFAULT_WINDOW_S: Final = 900
BUCKETS: Final = 30
HISTORY_POINTS: Final = 720
HISTORY_EVERY_S: Final = 2.0

IN_FLIGHT_STATES: Final = (
    ProcessState.PENDING,
    ProcessState.PROCESSING,
    ProcessState.COMPENSATING,
)
CIRCUITS_NOTE: Final = (
    "Each agent instance keeps its own breaker and records it here when it changes state: the "
    "worst state of the instances that report one. Stale: open or half-open with no call since "
    f"its retry time plus {int(circuits.STALE_GRACE.total_seconds() // 60)} minutes (no "
    "traffic, or the instance is gone). A step put off by an open circuit shows as 'deferred' "
    "on its order's timeline."
)


@dataclass
class _Cached:
    value: Any = None
    at: float = -math.inf
    refreshing: bool = False


class Summary:
    """The overview of one app process: see the module docstring for what it reads.

    ``runtime`` gives the process's Runtime (the composition root's,
    :mod:`service.operations.composition`); the summary reads through an
    :class:`OperatorContext` of its own on it, opened on the first snapshot: Service Bus peeks
    take one at a time per context, and its background reads must not hold up the operator
    API's. ``monotonic`` and the Runtime's clock are the time. One event loop uses it (its
    clients and background reads belong to that loop).
    """

    def __init__(
        self,
        runtime: Callable[[], Runtime],
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._runtime = runtime
        self._monotonic = monotonic
        self._lock = asyncio.Lock()
        """One summary at a time: a second waits, then finds the parts the first read."""
        self._cache: dict[str, _Cached] = {}
        self._history: deque[Part] = deque(maxlen=HISTORY_POINTS)
        self._history_at = -math.inf
        self._since: datetime | None = None
        self._offset = 0
        self._background_reads: set[asyncio.Task[None]] = set()
        self._own: OperatorContext | None = None
        self._closed = False

    async def close(self, *, wait: bool = False) -> None:
        """Stop its background reads (``wait``: let those in progress finish first) and close
        its clients."""
        self._closed = True
        reads = list(self._background_reads)
        if not wait:
            for read in reads:
                read.cancel()
        await asyncio.gather(*reads, return_exceptions=True)
        if self._own is not None:
            await self._own.close()

    # ----------------------------------------------------------------------------- public

    async def snapshot(self, window_s: int = DEFAULT_WINDOW_S) -> Part:
        """The overview over the last ``window_s`` seconds (``MIN_WINDOW_S`` to
        ``MAX_WINDOW_S``), as JSON-ready data."""
        window_s = min(MAX_WINDOW_S, max(MIN_WINDOW_S, int(window_s)))
        async with self._lock:
            if self._own is None:
                self._own = OperatorContext(self._runtime())
            ctx = self._own
            now = utc(ctx.rt.clock())
            if self._since is None:
                self._since = now
            active = await self._part("active", ACTIVE_TTL, lambda: self._active(ctx, now))
            errors = await self._part(
                f"errors:{window_s}", ERROR_TTL, lambda: self._errors(ctx, now, window_s)
            )
            finished = await self._part(
                f"finished:{window_s}", FINISHED_TTL, lambda: self._finished(ctx, now, window_s)
            )
            supervisor = await self._part("supervisor", SUPERVISOR_TTL, lambda: _supervisor(ctx))
            alerts = self._background("alerts", ALERTS_TTL, lambda: _alerts(ctx))
            dead = self._background("dead_letters", DEAD_LETTERS_TTL, lambda: _dead_letters(ctx))
            circuit_view = await self._part(
                "circuits", CIRCUITS_TTL, lambda: self._circuits(ctx, now)
            )
            self._remember(now, active, errors, supervisor)
            return {
                "generated_at": _iso(now),
                "tracking_since": _iso(self._since or now),
                "window_s": window_s,
                "bucket_s": window_s // BUCKETS,
                "states": _states(active, errors),
                "in_flight": active,
                "errors": errors,
                "finished": finished,
                "supervisor": supervisor,
                "alerts": alerts,
                "dead_letters": dead,
                "circuits": circuit_view,
                "circuits_note": CIRCUITS_NOTE,
                "history": list(self._history),
            }

    # ---------------------------------------------------------------------------- parts

    async def _part(self, name: str, ttl: float, read: _Read) -> Part:
        """The part ``name``, read now if its copy is older than ``ttl`` seconds."""
        cached = self._cache.setdefault(name, _Cached())
        if self._monotonic() - cached.at >= ttl:
            cached.value, cached.at = await _timed(name, read), self._monotonic()
        return cached.value

    def _background(self, name: str, ttl: float, read: _Read) -> Part:
        """The part ``name`` as last read, reading it again in a task of its own when its copy
        is older than ``ttl`` seconds: the Service Bus peeks behind alerts and dead letters take
        a second or more each (a link per peek), and the overview must not wait for them."""
        cached = self._cache.setdefault(name, _Cached())
        if self._monotonic() - cached.at >= ttl and not cached.refreshing:
            cached.refreshing = True
            task = asyncio.get_running_loop().create_task(self._refresh(cached, name, read))
            self._background_reads.add(task)
            task.add_done_callback(self._background_reads.discard)
        return cached.value if cached.value is not None else {"pending": True}

    async def _refresh(self, cached: _Cached, name: str, read: _Read) -> None:
        value = await _timed(name, read, quiet=lambda: self._closed)
        cached.value, cached.at, cached.refreshing = value, self._monotonic(), False

    async def _active(self, ctx: OperatorContext, now: datetime) -> Part:
        rows, partial = await _all_pages(lambda token: _active_page(ctx, token))
        overdue = sum(1 for row in rows if row.due_at <= now)
        sample = self._rotating_sample(rows)
        found = await self._read_orders(ctx, [row.order_id for row in sample])
        counts: Counter[str] = Counter()
        finishing = 0
        for row in sample:
            order = found.get(row.order_id)
            if order is None or order.generation != row.generation or order.state.terminal:
                finishing += 1  # done or gone: its index row is removed after its last sends
            else:
                counts[order.state.value] += 1
        estimated = len(sample) < len(rows)
        scale = len(rows) / len(sample) if sample else 0.0
        by_state = {
            state.value: round(counts[state.value] * scale) if estimated else counts[state.value]
            for state in IN_FLIGHT_STATES
        }
        return {
            "total": len(rows),
            "overdue": overdue,
            "by_state": by_state,
            "finishing": round(finishing * scale) if estimated else finishing,
            "read": len(sample),
            "estimated": estimated,
            "partial": partial,
        }

    def _rotating_sample(self, rows: Sequence[ActiveRow]) -> list[ActiveRow]:
        if len(rows) <= STATE_READS:
            return list(rows)
        start = self._offset % len(rows)
        self._offset = start + STATE_READS
        return [rows[(start + i) % len(rows)] for i in range(STATE_READS)]

    async def _errors(self, ctx: OperatorContext, now: datetime, window_s: int) -> Part:
        rows, partial = await _all_pages(lambda after: _error_page(ctx, after))
        since = now - timedelta(seconds=window_s)
        recent = sorted((r for r in rows if r.written_at >= since), key=lambda r: r.written_at)
        examined = recent[-ERROR_READS:]
        found = await self._read_orders(ctx, [row.order_id for row in examined])
        causes: Counter[str] = Counter()
        for row in examined:
            order = found.get(row.order_id)
            if order is not None and order.generation == row.generation:
                causes[_cause(order)] += 1
        bucket_s = window_s // BUCKETS
        return {
            "total": len(rows),
            "partial": partial,
            "in_window": len(recent),
            "causes": dict(causes),
            "causes_read": len(examined),
            "per_bucket": _bucket_counts((r.written_at for r in recent), now, bucket_s),
        }

    async def _finished(self, ctx: OperatorContext, now: datetime, window_s: int) -> Part:
        since = now - timedelta(seconds=window_s)
        orders, partial, requests = await self._processed_since(ctx, since)
        bucket_s = window_s // BUCKETS
        first = now - timedelta(seconds=bucket_s * BUCKETS)
        buckets: list[list[Order]] = [[] for _ in range(BUCKETS)]
        for order in orders:
            index = int((utc(order.updated_at) - first).total_seconds() // bucket_s)
            if 0 <= index < BUCKETS:
                buckets[index].append(order)
        steps = {ref: len(flow.steps) for ref, flow in ctx.rt.workflows.items()}
        series = []
        for index, members in enumerate(buckets):
            latencies = _latencies(members)
            series.append(
                {
                    "start": _iso(first + timedelta(seconds=index * bucket_s)),
                    "processed": len(members),
                    "retries": sum(_retries(o, steps) for o in members),
                    "p50_s": _percentile(latencies, 50),
                    "p99_s": _percentile(latencies, 99),
                }
            )
        all_latencies = _latencies(orders)
        recent = [o for o in orders if utc(o.updated_at) >= now - timedelta(seconds=300)]
        return {
            "processed": len(orders),
            "retries": sum(_retries(o, steps) for o in orders),
            "recovered": sum(1 for o in orders if _retries(o, steps) > 0),
            "orders_per_s_5m": round(len(recent) / 300, 3),
            "p50_s": _percentile(all_latencies, 50),
            "p99_s": _percentile(all_latencies, 99),
            "buckets": series,
            "partial": partial,
            "requests": requests,
        }

    async def _processed_since(
        self, ctx: OperatorContext, since: datetime
    ) -> tuple[list[Order], bool, int]:
        pages = (
            ctx.orders_table()  # Processed orders have no index
            .query_entities(
                "RowKey eq @row and ProcessState eq @state and UpdatedAt ge @since",
                parameters={
                    "row": PROCESS_ROW,
                    "state": ProcessState.PROCESSED.value,
                    "since": since,
                },
                select=SUMMARY_COLUMNS,
                results_per_page=FINISHED_PAGE,
            )
            .by_page()
        )
        orders: list[Order] = []
        requests = 0
        async for page in pages:
            requests += 1
            orders.extend(order_from_entity(entity, etag_of(entity)) for entity in page)
            if pages.continuation_token is None:
                return orders, False, requests
            if requests >= FINISHED_REQUESTS:
                return orders, True, requests
        return orders, False, requests

    async def _circuits(self, ctx: OperatorContext, now: datetime) -> Part:
        store = CircuitRows(ctx.rt.store.circuits.table)
        read = await store.read()
        if read.unreadable:
            log.warning("dashboard summary: %d circuit rows are unreadable", read.unreadable)
        reaped = 0
        gone = [row for row in read.rows if circuits.expired(row, now)]
        if gone:
            try:
                reaped = await store.reap(gone[: circuits.REAP_PER_READ])
            except Exception:  # housekeeping: the overview does not depend on it
                log.warning(
                    "dashboard summary: deleting expired circuit rows failed", exc_info=True
                )
        return {
            "agents": [agent.as_dict() for agent in circuits.overview(read.rows, now, AGENT_NAMES)],
            "rows": len(read.rows),
            "unreadable": read.unreadable,
            "partial": read.partial,
            "reaped": reaped,
        }

    async def _read_orders(
        self, ctx: OperatorContext, order_ids: Sequence[str]
    ) -> dict[str, Order]:
        """Point reads of ``order_ids``, ``READ_CONCURRENCY`` at a time; missing orders are
        left out."""
        reads = asyncio.Semaphore(READ_CONCURRENCY)

        async def find(order_id: str) -> Order | None:
            async with reads:
                return await ctx.rt.store.find(order_id)

        found = await asyncio.gather(*(find(order_id) for order_id in order_ids))
        return {order.order_id: order for order in found if order is not None}

    def _remember(self, now: datetime, active: Part, errors: Part, supervisor: Part) -> None:
        if self._monotonic() - self._history_at < HISTORY_EVERY_S:
            return
        self._history_at = self._monotonic()
        self._history.append(
            {
                "at": _iso(now),
                "in_flight": active.get("total"),
                "overdue": active.get("overdue"),
                "errors": errors.get("total"),
                "lag_s": supervisor.get("lag_s"),
            }
        )


# ----------------------------------------------------------------------------- readers


async def _timed(name: str, read: _Read, *, quiet: Callable[[], bool] = lambda: False) -> Part:
    """``read()`` with how long it took; a failure is reported in the part, not raised (and
    logged unless ``quiet()``: a summary being closed)."""
    started = time.perf_counter()
    try:
        value = await read()
    except Exception as error:  # one part failing must not blank the others
        if not quiet():
            log.warning("dashboard summary: %s failed", name, exc_info=True)
        first = (str(error).strip().splitlines() or [""])[0][:200]
        value = {"error": f"{type(error).__name__}: {first}"}
    value["read_ms"] = round((time.perf_counter() - started) * 1000, 1)
    value["read_at"] = _iso(datetime.now(UTC))
    return value


async def _all_pages(
    read: Callable[[str | None], Awaitable[tuple[Sequence[T], str | None]]],
) -> tuple[list[T], bool]:
    """Every row of an index, one request per page, at most ``MAX_INDEX_PAGES`` pages, and
    whether rows were left unread. ``read(token)`` gives a page and where to go on (None:
    that was the last page)."""
    rows: list[T] = []
    token = None
    for _ in range(MAX_INDEX_PAGES):
        page, token = await read(token)
        rows.extend(page)
        if token is None:
            return rows, False
    return rows, True


async def _active_page(
    ctx: OperatorContext, token: str | None
) -> tuple[Sequence[ActiveRow], str | None]:
    page = await ctx.rt.store.list_active(INDEX_PAGE, continuation=token)
    return page.rows, page.continuation


async def _error_page(
    ctx: OperatorContext, after: str | None
) -> tuple[Sequence[ErrorRow], str | None]:
    page = await ctx.rt.store.errors.page(INDEX_PAGE, after=after)
    return page.rows, page.last_key


async def _supervisor(ctx: OperatorContext) -> Part:
    view = await supervisor_view.supervisor(ctx)
    return {
        "lag_s": view.lag_s,
        "oldest_sweep_s": view.oldest_sweep_s,
        "unswept_buckets": len(view.unswept_buckets),
        "buckets": len(view.buckets),
        "holders": len(view.holders),
        "detection_s": view.bound.get("detection_s"),
        "period_s": view.bound.get("period"),
    }


async def _alerts(ctx: OperatorContext) -> Part:
    page = await alert_views.list_alerts(ctx, limit=100)
    resolutions: Counter[str] = Counter(view.resolution for view in page.items)
    severities: Counter[str] = Counter(
        str((view.alert or {}).get("severity") or "unreadable")
        for view in page.items
        if view.resolution in STILL_OPEN
    )
    return {
        "open": resolutions["open"],
        "retrying": resolutions["retrying"],
        "listed": len(page.items),
        "resolutions": dict(resolutions),
        "by_severity": dict(severities),
        "more": page.continuation is not None,
    }


async def _dead_letters(ctx: OperatorContext) -> Part:
    summary = await dead_letter_views.dead_letter_summary(ctx, limit=100)
    return {
        "total": sum(q.count for q in summary.queues),
        "more": any(q.more for q in summary.queues),
        "queues": [q.model_dump() for q in summary.queues],
    }


# ---------------------------------------------------------------------------- arithmetic


def _states(active: Part, errors: Part) -> dict[str, int | None]:
    by_state = active.get("by_state") or {}
    states: dict[str, int | None] = {s.value: by_state.get(s.value) for s in IN_FLIGHT_STATES}
    states[ProcessState.ERROR.value] = errors.get("total")
    return states


def _cause(order: Order) -> str:
    """Why an order in Error is there, in the overview's words."""
    cause = order.compensation_cause or "failed"
    undone = any(step.state is StepState.COMPENSATED for step in order.steps)
    if cause == "step_declined":
        return "declined, compensated" if undone else "declined, nothing to undo"
    return cause


def _retries(order: Order, steps: dict[str, int]) -> int:
    """Requests a Processed order needed beyond one per step: its retries (after a failed,
    timed-out or deferred attempt). Only for its first generation, of a workflow this code
    carries: a resubmitted order's requests include those of its earlier runs."""
    planned = steps.get(order.workflow)
    if planned is None or order.generation != 1:
        return 0
    return max(0, order.attempt - planned)


def _latencies(orders: Iterable[Order]) -> list[float]:
    return sorted(
        (utc(o.updated_at) - utc(o.created_at)).total_seconds() for o in orders if o.generation == 1
    )


def _percentile(ordered: Sequence[float], percent: int) -> float | None:
    """Nearest-rank percentile of sorted values (None: no values)."""
    if not ordered:
        return None
    rank = max(1, math.ceil(percent / 100 * len(ordered)))
    return round(ordered[rank - 1], 3)


def _bucket_counts(times: Iterable[datetime], now: datetime, bucket_s: int) -> list[int]:
    first = now - timedelta(seconds=bucket_s * BUCKETS)
    counts = [0] * BUCKETS
    for at in times:
        index = int((utc(at) - first).total_seconds() // bucket_s)
        if 0 <= index < BUCKETS:
            counts[index] += 1
    return counts


def _iso(value: datetime) -> str:
    return utc(value).isoformat().replace("+00:00", "Z")
