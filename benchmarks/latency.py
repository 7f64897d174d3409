"""Where a paced order's time goes, hop by hop, read from the spans the app records.

    python -m benchmarks.latency [--orders 300] [--rate 20] [--workflow order] [--hosts 2]
                                 [--rounds 3] [--json] [--save FILE]

Runs the local stack as ``benchmarks.peers`` does (Azurite in memory, the development broker,
the fakes answering every call after 1 ms, ``--hosts`` function hosts) with the hosts writing
their spans to files (TELEMETRY_DIR: the app's span per hop, and the Azure SDKs' own spans for
each Table request and Service Bus send, as the distro records them in Azure). After a warm-up,
``--orders`` orders are sent one by one at ``--rate`` per second (below saturation); once all
have finished the stack is stopped, its span files are read, and each order's time from its
``submitted_at`` to the end of its last handler is cut into the hops of the budget
(:data:`HOPS`), each summed over the order's steps. Printed: p50 and p99 of every hop over the
orders, and of the whole; with ``--rounds`` the medians of those over the rounds.

Tracing costs the hosts some CPU, so the whole here runs a little longer than the same paced
run of ``benchmarks.peers`` (which records no spans); the hops are what to compare.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Final

import typer
from rich.console import Console
from rich.table import Table

from adapters.trace_files import SpanRecord, iter_spans
from benchmarks.history import quantiles
from benchmarks.peers import OursSide, load_1m, tmpfs_dir

HOPS: Final = {
    "submit_to_intake": "submission → intake starts (the orders queue)",
    "intake": "intake's own work: validate, decide, serialise",
    "request_queue": "request's send starts → agent starts (send, broker, receive)",
    "agent": "agent's own work around the call",
    "remote_call": "the remote call (the fakes answer after 1 ms)",
    "reply_queue": "reply's send starts → reply handling starts (send, broker, receive)",
    "reply_handling": "reply handling's own work: decide, serialise",
    "table": "Table requests, all handlers",
    "send": "other Service Bus sends on the path (the last handler's)",
}
"""The budget's hops, in path order; they add up to the whole. The path runs through each
handler up to the start of its last send, then through that send, the broker and the next
handler's receive to the next handler's start (the queue hops: the broker has delivered the
message before the sender's span ends with its acknowledgement, so a queue measured from the
send's end could be negative). What a handler does after its last send starts runs beside the
next hop; the last handler's path ends with it. A handler's part of the path is cut into the
Table requests, sends and remote call it finished on the path, and the rest: its own work."""

HANDLER_KIND: Final = {"scheduler_intake": "intake", "scheduler_replies": "reply_handling"}
SEND_SPAN: Final = "ServiceBus.send"
FIRST_QUEUE: Final = "submit_to_intake"


@dataclass
class Span:
    span_id: str
    parent_id: str | None
    trace_id: str
    name: str
    kind: str
    start: float
    end: float
    attributes: Mapping[str, Any]
    children: list[Span] = field(default_factory=list)

    @classmethod
    def of(cls, record: SpanRecord) -> Span:
        return cls(
            span_id=record.span_id,
            parent_id=record.parent_id,
            trace_id=record.trace_id,
            name=record.name,
            kind=record.kind,
            start=record.start_ns / 1e9,
            end=record.end_ns / 1e9,
            attributes=record.attributes,
        )

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def handler(self) -> str | None:
        """The budget hop a handler span's own work counts under; None if not a handler's."""
        if self.kind != "INTERNAL" or "messaging.destination.name" not in self.attributes:
            return None
        return HANDLER_KIND.get(self.name, "agent")


def budgets(
    records: Iterable[SpanRecord], submitted_at: Mapping[str, datetime], remote_url: str
) -> dict[str, dict[str, float]]:
    """Each order's hops (:data:`HOPS`, seconds) plus ``total``, for the orders of
    ``submitted_at`` whose trace is complete: its intake, and a reply handled after every
    agent. ``remote_url``: where the remote calls go (their CLIENT spans; the others are the
    Table requests)."""
    spans = [Span.of(r) for r in records]
    by_id = {s.span_id: s for s in spans}
    for s in spans:
        if s.parent_id in by_id:
            by_id[s.parent_id].children.append(s)
    traces: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        traces[s.trace_id].append(s)
    result = {}
    for s in spans:
        order_id = s.attributes.get("order.id")
        if s.name == "scheduler_intake" and s.handler and order_id in submitted_at:
            handlers = sorted((h for h in traces[s.trace_id] if h.handler), key=lambda h: h.start)
            hops = order_budget(handlers, submitted_at[order_id].timestamp(), remote_url)
            if hops is not None:
                result[order_id] = hops
    return result


def order_budget(
    handlers: Sequence[Span], submitted: float, remote_url: str
) -> dict[str, float] | None:
    """One order's hops from its handler spans in start order; None unless they alternate
    intake, then agent and reply handling in turn, each started by the previous one's send."""
    kinds = [h.handler for h in handlers]
    steps = (len(kinds) - 1) // 2
    if kinds != ["intake"] + ["agent", "reply_handling"] * steps or steps == 0:
        return None
    hops = dict.fromkeys(HOPS, 0.0)
    hops[FIRST_QUEUE] = handlers[0].start - submitted
    path_ends = []
    for before, handler in itertools.pairwise(handlers):
        sends = [c.start for c in before.children if c.name == SEND_SPAN]
        if not sends:
            return None
        path_ends.append(max(sends))
        queue = "request_queue" if handler.handler == "agent" else "reply_queue"
        hops[queue] += handler.start - path_ends[-1]
    path_ends.append(handlers[-1].end)
    for handler, until in zip(handlers, path_ends, strict=True):
        own = until - handler.start
        for child in handler.children:
            hop = child_hop(child, remote_url)
            if hop is not None and child.end <= until:
                hops[hop] += child.seconds
                own -= child.seconds
        hops[str(handler.handler)] += own
    hops["total"] = handlers[-1].end - submitted
    return hops


def child_hop(child: Span, remote_url: str) -> str | None:
    if child.name == SEND_SPAN:
        return "send"
    url = str(child.attributes.get("url.full", ""))
    if child.kind != "CLIENT" or not url:
        return None
    return "remote_call" if url.startswith(remote_url) else "table"


def summary(per_order: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float | None]]:
    """p50 and p99 (milliseconds) of each hop, and of the whole, over the orders."""
    out = {}
    for hop in [*HOPS, "total"]:
        values = sorted(h[hop] * 1000 for h in per_order.values())
        q = quantiles(values) if values else {"p50": None, "p99": None}
        out[hop] = {"p50": _ms(q["p50"]), "p99": _ms(q["p99"])}
    return out


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def medians(rounds: Sequence[Mapping[str, Mapping[str, float | None]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for hop in [*HOPS, "total"]:
        out[hop] = {}
        for q in ("p50", "p99"):
            values = [r[hop][q] for r in rounds if r[hop][q] is not None]
            out[hop][q] = round(statistics.median(values), 1) if values else None
    return out


# ------------------------------------------------------------------------------ running


async def measure(
    workflow: str,
    orders: int,
    rate: float,
    hosts: int,
    warmup: int,
    workdir: Path,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """One round: a stack of its own with span files, a warm-up, the paced batch, the hops."""
    telemetry = workdir / "telemetry"
    side = OursSide(workdir, hosts=hosts, warmup=0, timeout=600, say=say, telemetry=telemetry)
    try:
        info = await side.ensure_started()
        if warmup:
            say(f"warm-up: {warmup} orders")
            await side.finals(info, await side.batch(info, workflow, warmup, rate, "lat-warm-"))
        run = f"lat-{time.time_ns() % 10**6:06d}-"
        say(f"{orders} {workflow} orders at {rate:g}/s")
        submitted = await side.batch(info, workflow, orders, rate, run)
        finals = await side.finals(info, submitted)
        remote_url = info.fakes_url
    finally:
        side.stop()  # the hosts write their last spans as they exit
    per_order = budgets(
        iter_spans(telemetry), {o.order_id: o.submitted_at for o in submitted}, remote_url
    )
    sent = {o.order_id: o.submitted_at.timestamp() for o in submitted}
    first = min(sent.values())
    return {
        "orders": orders,
        "finished": len(finals),
        "traced": len(per_order),
        "load_1m": load_1m(),
        "hops_ms": summary(per_order),
        "per_order_ms": {
            order_id: {
                "submitted_s": round(sent[order_id] - first, 3),
                **{hop: round(s * 1000, 2) for hop, s in hops.items()},
            }
            for order_id, hops in sorted(per_order.items())
        },
    }


def show(doc: Mapping[str, Any], console: Console) -> None:
    hops = doc["hops_ms"]
    table = Table(title=f"{doc['workflow']} at {doc['rate']:g}/s: ms per order (median of rounds)")
    for column in ("hop", "p50", "p99", "what"):
        table.add_column(column, justify="left" if column in ("hop", "what") else "right")
    for hop, what in [*HOPS.items(), ("total", "submission → last handler ends")]:
        table.add_row(hop, str(hops[hop]["p50"]), str(hops[hop]["p99"]), what)
    console.print(table)


app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def main(
    orders: Annotated[int, typer.Option(min=1, help="Orders per round, sent one by one.")] = 300,
    rate: Annotated[float, typer.Option(min=0.1, help="Submissions per second.")] = 20.0,
    workflow: Annotated[str, typer.Option(help="single_step or order.")] = "order",
    hosts: Annotated[int, typer.Option(min=1, help="Function hosts.")] = 2,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds, each on a new stack.")] = 1,
    warmup: Annotated[int, typer.Option(min=0, help="Unmeasured orders first.")] = 30,
    workdir: Annotated[Path | None, typer.Option(help="The stacks' files.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    save: Annotated[Path | None, typer.Option(help="Also write the JSON here.")] = None,
) -> None:
    err = Console(stderr=True)

    def say(line: str) -> None:
        err.print(f"[dim]…[/] {line}", highlight=False)

    base = workdir or tmpfs_dir("latency-")
    results = []
    for n in range(1, rounds + 1):
        say(f"round {n} of {rounds}")
        results.append(
            asyncio.run(measure(workflow, orders, rate, hosts, warmup, base / f"round-{n}", say))
        )
    doc = {
        "workflow": workflow,
        "rate": rate,
        "hosts": hosts,
        "rounds": results,
        "hops_ms": medians([r["hops_ms"] for r in results]),
    }
    if save is not None:
        save.write_text(json.dumps(doc, indent=2) + "\n")
    if json_out:
        print(json.dumps(doc, indent=2))
    else:
        show(doc, Console(width=None if sys.stdout.isatty() else 160))
    if any(r["traced"] < r["orders"] * 0.9 for r in results):
        say("fewer than 90 % of the orders had a complete trace; see the span files")
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
