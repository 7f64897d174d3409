"""`orderctl resubmit`, `cancel` and `restart`: an operator's actions on one order, or
(resubmit, cancel) on every order a filter selects, listed first and confirmed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from devstack.stack.local_stack import DEFAULT_WORKDIR
from orderctl import connection, views
from orderctl.app import MODE, app, at_edge, confirm, emit, fail, output
from orderctl.options import (
    OPERATOR,
    DryRun,
    Json,
    NewerThan,
    OlderThan,
    Operator,
    Reason,
    StepFilter,
    TextFilter,
    Wide,
    Workdir,
    Yes,
)
from orderctl.plain_text import text

if TYPE_CHECKING:
    from orderctl.backend import OperatorBackend


StateFilter = Annotated[str | None, typer.Option("--state", help="only orders in this state")]
BulkLimit = Annotated[int, typer.Option(min=1, max=100, help="orders acted on at most")]


@app.command()
@at_edge
async def resubmit(
    order_id: Annotated[
        str | None, typer.Argument(help="the order; omit it to act on a filter's orders")
    ] = None,
    reason: Reason = "",
    state: StateFilter = None,
    step: StepFilter = None,
    older_than: OlderThan = None,
    newer_than: NewerThan = None,
    text_: TextFilter = None,
    dry_run: DryRun = False,
    yes: Yes = False,
    limit: BulkLimit = 100,
    operator: Operator = OPERATOR,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Resubmit an Error order: it resumes at the failed step (or finishes its compensation).
    Without ORDER_ID, every Error order the filter selects (listed first; asks to confirm)."""
    screen = output(json_out, wide)
    chosen = {"state": state, "step": step, "older_than": older_than,
              "newer_than": newer_than, "text": text_}  # fmt: skip
    async with connection.operations(workdir) as ops:
        if order_id is None:
            await act_on_matching(
                ops, "resubmit", chosen, reason, operator, dry_run, yes, limit, screen
            )
            return
        one_order(chosen, dry_run)
        done = await ops.resubmit(order_id, operator=operator, reason=reason)
    emit(done, show_action, screen)


@app.command()
@at_edge
async def cancel(
    order_id: Annotated[
        str | None, typer.Argument(help="the order; omit it to act on a filter's orders")
    ] = None,
    reason: Reason = "",
    state: StateFilter = None,
    step: StepFilter = None,
    older_than: OlderThan = None,
    newer_than: NewerThan = None,
    text_: TextFilter = None,
    dry_run: DryRun = False,
    yes: Yes = False,
    limit: BulkLimit = 100,
    operator: Operator = OPERATOR,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Cancel a Pending or Processing order at once: every step that may have taken effect (the
    one in flight too) is undone, then Error. Without ORDER_ID, every such order the filter
    selects (listed first; asks to confirm)."""
    screen = output(json_out, wide)
    chosen = {"state": state, "step": step, "older_than": older_than,
              "newer_than": newer_than, "text": text_}  # fmt: skip
    async with connection.operations(workdir) as ops:
        if order_id is None:
            await act_on_matching(
                ops, "cancel", chosen, reason, operator, dry_run, yes, limit, screen
            )
            return
        one_order(chosen, dry_run)
        done = await ops.cancel(order_id, operator=operator, reason=reason)
    emit(done, show_action, screen)


def one_order(chosen: dict[str, str | None], dry_run: bool) -> None:
    given = [f"--{name.replace('_', '-')}" for name, value in chosen.items() if value]
    if given or dry_run:
        options = ", ".join(given + (["--dry-run"] if dry_run else []))
        raise fail(f"{options} select orders by filter: give either an order id or a filter", 2)


async def act_on_matching(
    ops: OperatorBackend, action: str, chosen: dict[str, str | None], reason: str, operator: str,
    dry_run: bool, yes: bool, limit: int, screen: Console,
) -> None:  # fmt: skip
    """List what the filter selects; unless a dry run, confirm, then act on exactly those."""
    preview = await ops.bulk(
        action, operator=operator, reason=reason, dry_run=True, limit=limit, **chosen
    )
    if dry_run or not preview.items:
        emit(preview, views.show_bulk, screen, MODE.wide)
        return
    if not MODE.json:
        views.show_bulk(preview, screen, MODE.wide)
    confirm(f"{action} these {len(preview.items)} order(s)?", yes)
    done = await ops.bulk(
        action, operator=operator, reason=reason, limit=limit,
        order_ids=[item.order_id for item in preview.items], **chosen,
    )  # fmt: skip
    emit(done, views.show_bulk, screen, MODE.wide)


@app.command()
@at_edge
async def restart(
    order_id: str,
    from_step: Annotated[
        str, typer.Option("--from", help="the step to redo from, e.g. charge_payment")
    ],
    reason: Reason,
    operator: Operator = OPERATOR,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Restart an Error order from a step: that step and every later one are done again (new
    idempotency keys), even a result that was kept; the steps before it resume as a resubmit
    does. Recorded in the order's timeline with your name."""
    screen = output(json_out, wide)
    async with connection.operations(workdir) as ops:
        done = await ops.restart(order_id, step=from_step, operator=operator, reason=reason)
    emit(done, show_action, screen)


def show_action(done: Any, screen: Console) -> None:
    screen.print(text(f"{done.order_id}: {done.outcome} ({done.state})"))
    if done.detail:
        screen.print(text(done.detail, "dim"))
