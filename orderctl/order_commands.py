"""`orderctl submit`, `status` and `orders`: send an order (and follow it until it is done),
show one order or follow it live, list the orders in a state."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from devstack.stack.local_stack import DEFAULT_WORKDIR, TELEMETRY_SETTING, StackInfo
from orderctl import connection, views
from orderctl.app import MODE, app, at_edge, emit, fail, output, validation_problems
from orderctl.options import Json, NewerThan, OlderThan, StepFilter, TextFilter, Wide, Workdir
from orderctl.output import SubmitView, write_json, write_json_line
from orderctl.plain_text import printable, text

if TYPE_CHECKING:
    from orderctl.backend import OperatorBackend


@app.command()
@at_edge
async def submit(
    order_id: Annotated[str | None, typer.Option(help="default: a new unique id")] = None,
    item: Annotated[
        list[str] | None,
        typer.Option(help="SKU:QUANTITY:UNIT_PRICE_CENTS, repeatable [default: SKU-1:1:1999]"),
    ] = None,
    customer: str = "customer-1",
    currency: str = "EUR",
    workflow: str = "order",
    reply_to: Annotated[str | None, typer.Option(help="queue for status updates")] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait", help="return once the order is done: exit 0 Processed, 3 Error, 4 timeout"
        ),
    ] = False,
    timeout: Annotated[
        float, typer.Option(min=1, help="with --wait: seconds to wait at most")
    ] = 120.0,
    json_out: Json = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Submit one order to the running stack (--wait: and follow it until it is done)."""
    from devstack.orders import build_order, send_orders

    screen = output(json_out)
    info = connection.running_stack(workdir)
    try:
        order = build_order(
            order_id, item or ["SKU-1:1:1999"], customer, currency, workflow, reply_to
        )
    except ValidationError as error:
        raise fail(f"the order is not valid: {validation_problems(error)}", 2) from None
    except ValueError as error:
        raise fail(f"the order is not valid: {error}", 2) from None
    with client_span(info, order.order_id):
        await send_orders(info.settings, [order])
    view = SubmitView(
        order_id=order.order_id,
        workflow=order.workflow,
        total_cents=order.total_cents,
        currency=order.currency,
    )
    if not wait:
        emit(view, show_submitted, screen)
        return
    if not MODE.json:
        show_submitted(view, screen)
    async with connection.operations(workdir) as ops:
        followed = await follow_order(ops, order.order_id, timeout, screen, created=False)
    last = followed.last
    view = view.model_copy(
        update={
            "state": last.detail.order.state if last else None,
            "waited_s": round(followed.waited_s, 2),
            "order": last.detail.model_dump(mode="json") if last else None,
        }
    )
    if MODE.json:
        write_json(view)
    raise typer.Exit(finished(followed, screen))


async def follow_order(ops: OperatorBackend, order_id: str, timeout: float | None,
                       screen: Console, *, created: bool) -> Any:  # fmt: skip
    """Follow an order until it is done, printing each change (with --json in `status`: one
    WatchView per line). ``created``: it exists already (status), else it is on its way."""
    from orderctl.follow import follow

    first = [True]

    def show(view: Any) -> None:
        if MODE.json:
            if created:
                write_json_line(view)
            return
        if first[0] and created:
            views.show_order(view.detail, screen, MODE.wide)
            screen.print(Text("following it (Ctrl-C stops)…", style="dim"))
        else:
            for entry in view.detail.timeline:
                screen.print(views.timeline_line(entry, MODE.wide))
        first[0] = False

    return await follow(
        lambda after, wait_s: ops.watch_order(order_id, after_seq=after, wait_s=wait_s),
        show,
        timeout=timeout,
        wait_for_creation=not created,
    )


def finished(followed: Any, screen: Console) -> int:
    """Say how a followed order ended (people only); its exit code."""
    from orderctl.follow import exit_code

    code = exit_code(followed)
    if not MODE.json:
        last = followed.last
        if followed.timed_out:
            state = last.detail.order.state if last else "not created yet"
            screen.print(text(f"still {state} after {followed.waited_s:.0f} s: gave up waiting"))
        else:
            assert last is not None
            order = last.detail.order
            style = "green" if code == 0 else "red"
            screen.print(Text.assemble(printable(order.order_id), ": ", (order.state, style)))
            screen.print(views.step_table(last.detail.steps, MODE.wide))
    return code


def show_submitted(view: SubmitView, screen: Console) -> None:
    screen.print(
        Text.assemble(
            "submitted ", (printable(view.order_id), "bold"), f" ({view.total_cents} ",
            printable(view.currency), ")",
        )
    )  # fmt: skip


@contextmanager
def client_span(info: StackInfo, order_id: str) -> Iterator[None]:
    """With the stack's telemetry on, send inside a CLIENT span written to its files: the
    order's trace then starts here, at the submission (the message carries its context)."""
    directory = info.settings.get(TELEMETRY_SETTING, "").strip()
    if not directory:
        yield
        return
    from opentelemetry.trace import SpanKind

    from adapters.trace_files import file_providers

    tracer_provider, meter_provider = file_providers(Path(directory), "orderctl")
    attributes = {"order.id": order_id, "messaging.destination.name": "orders"}
    try:
        tracer = tracer_provider.get_tracer("orderctl")
        with tracer.start_as_current_span("submit", kind=SpanKind.CLIENT, attributes=attributes):
            yield
    finally:
        tracer_provider.shutdown()  # written now: `orderctl trace` may run next
        meter_provider.shutdown()


@app.command()
@at_edge
async def status(
    order_id: str,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            "-w",
            help="follow it live until it is done (--json: one document per change, JSON "
            "lines); exit 0 Processed, 3 Error, 4 timeout",
        ),
    ] = False,
    timeout: Annotated[
        float | None, typer.Option(min=1, help="with --watch: seconds to follow at most")
    ] = None,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Show an order's state, steps (with how long each took, its attempts and why they
    failed) and timeline; --watch follows it until it is done."""
    screen = output(json_out, wide)
    async with connection.operations(workdir) as ops:
        if watch:
            followed = await follow_order(ops, order_id, timeout, screen, created=True)
        else:
            order = await ops.show_order(order_id)
    if not watch:
        emit(order, views.show_order, screen, MODE.wide)
        return
    raise typer.Exit(finished(followed, screen))


@app.command()
@at_edge
async def orders(
    state: Annotated[
        str, typer.Argument(help="Pending, Processing, Compensating, Error or Processed")
    ],
    step: StepFilter = None,
    older_than: OlderThan = None,
    newer_than: NewerThan = None,
    text_: TextFilter = None,
    sort: Annotated[
        str,
        typer.Option(
            help="index (cheapest), id, created, updated; -created, -updated: newest first"
        ),
    ] = "index",
    limit: Annotated[int, typer.Option(min=1, max=100)] = 50,
    continuation: Annotated[str | None, typer.Option(help="from the previous page")] = None,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """List orders in a state, filtered by step, age and text, sorted, a page at a time (in
    flight: the active-order index; Error: the Error index; Processed: a bounded query of the
    orders table — docs/orderctl.md says what each costs)."""
    screen = output(json_out, wide)
    async with connection.operations(workdir) as ops:
        page = await ops.list_orders(
            state,
            step=step,
            older_than=older_than,
            newer_than=newer_than,
            text=text_,
            sort=sort,
            limit=limit,
            continuation=continuation,
        )
    emit(page, show_orders, screen)


def show_orders(page: Any, screen: Console) -> None:
    shown = ", ".join(f"{k} {v}" for k, v in page.filters.items())
    title = f"{page.state} orders" + (f" ({shown})" if shown else "")
    if page.sort != "index":
        title += f", by {page.sort}"
    table = Table(title=text(title))
    columns = ["order", "step", "created", "fail"]
    columns += ["updated", "attempt", "next attempt"] if MODE.wide else []
    for name in columns:
        table.add_column(name, no_wrap=True)
    table.add_column("last error", ratio=1)
    for o in page.items:
        row = [
            text(o.order_id),
            text(o.current_step or ""),
            f"{o.created_at:%m-%d %H:%M:%S}",
            str(o.failure_count),
        ]
        if MODE.wide:
            row += [
                f"{o.updated_at:%m-%d %H:%M:%S}",
                str(o.attempt),
                f"{o.next_attempt_at:%H:%M:%S}" if o.next_attempt_at else "",
            ]
        table.add_row(*row, text(o.last_error or "", width=60, wide=MODE.wide))
    screen.print(table)
    if page.partial:
        screen.print(
            text(f"sorted among the first {page.scanned} candidates only: narrow the filter")
        )
    if page.continuation:
        screen.print(text(f"more: --continuation {page.continuation}"))
