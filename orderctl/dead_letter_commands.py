"""`orderctl dead-letters` and `dead-letter-log`: dead letters per queue, replaying or
purging them (confirmed, with a reason), and the log of what operators did."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from devstack.stack.local_stack import DEFAULT_WORKDIR
from orderctl import connection, views
from orderctl.app import MODE, app, at_edge, confirm, emit, fail, output
from orderctl.options import OPERATOR, DryRun, Json, Operator, Wide, Workdir, Yes
from orderctl.plain_text import text

if TYPE_CHECKING:
    from orderctl.backend import OperatorBackend


@app.command("dead-letters")
@at_edge
async def dead_letters(
    words: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[replay|purge] [QUEUE] [SEQ]...",
            help="a queue role (orders, responses, ...) to list its dead letters, all queues "
            "if omitted; `replay QUEUE` sends dead letters back to their queue, `purge QUEUE` "
            "removes them (name them by sequence number, or --all)",
            show_default=False,
        ),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="replay or purge every dead letter")] = False,
    dry_run: DryRun = False,
    yes: Yes = False,
    reason: Annotated[
        str,
        typer.Option(
            help="why (required to replay or purge): recorded in the timeline of the order "
            "each names and in the dead-letter log"
        ),
    ] = "",
    operator: Operator = OPERATOR,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Count dead letters per queue, show one queue's dead letters, or replay or purge them
    (recorded with --reason in the timeline of the order each names and in the dead-letter
    log; asks to confirm unless --yes)."""
    screen = output(json_out, wide)
    words = words or []
    action = words[0] if words and words[0] in ("replay", "purge") else None
    if action is None and (len(words) > 1 or all_ or dry_run):
        raise fail("to act on dead letters: dead-letters replay|purge QUEUE [SEQ]... [--all]", 2)
    async with connection.operations(workdir) as ops:
        if action is not None:
            await settle_dead_letters(
                ops, action, words[1:], all_, dry_run, yes, operator, reason, screen
            )
            return
        if not words:
            emit(await ops.dead_letter_summary(), show_dead_letter_counts, screen)
            return
        page = await ops.list_dead_letters(words[0])
    emit(page, show_dead_letters, screen)


async def settle_dead_letters(
    ops: OperatorBackend, action: str, words: list[str], everything: bool, dry_run: bool, yes: bool,
    operator: str, reason: str, screen: Console,
) -> None:  # fmt: skip
    """Say what a replay or purge would do; unless a dry run, confirm, then do it to those."""
    if not words:
        raise fail(f"say which queue: dead-letters {action} QUEUE [SEQ]... [--all]", 2)
    queue, numbers = words[0], words[1:]
    if not all(n.isascii() and n.isdigit() and len(n) < 19 for n in numbers):
        raise fail(f"dead letters are named by sequence number, not {numbers!r}", 2)
    act = ops.replay_dead_letters if action == "replay" else ops.purge_dead_letters
    chosen = [int(n) for n in numbers] or None
    preview = await act(
        queue, operator=operator, sequence_numbers=chosen, everything=everything, dry_run=True
    )
    ready = [i.sequence_number for i in preview.items if i.outcome.startswith("would_")]
    if dry_run or not ready:
        emit(preview, views.show_dead_letter_action, screen, MODE.wide)
        return
    if not MODE.json:
        views.show_dead_letter_action(preview, screen, MODE.wide)
    confirm(f"{action} these {len(ready)} dead letter(s)?", yes)
    done = await act(queue, operator=operator, sequence_numbers=ready, reason=reason)
    emit(done, views.show_dead_letter_action, screen, MODE.wide)


def show_dead_letter_counts(summary: Any, screen: Console) -> None:
    table = Table("queue", "entity", "dead letters", title="dead-letter queues")
    for q in summary.queues:
        table.add_row(text(q.queue), text(q.entity), f"{q.count}{'+' if q.more else ''}")
    screen.print(table)


def show_dead_letters(page: Any, screen: Console) -> None:
    table = Table(
        "#", "reason", "description", "body", title=text(f"dead letters of {page.entity}")
    )
    for item in page.items:
        body = item.body if item.body is not None else item.raw
        table.add_row(
            str(item.sequence_number),
            text(item.reason or ""),
            text(item.description or ""),
            text(body, width=80, wide=MODE.wide),
        )
    screen.print(table)


@app.command("dead-letter-log")
@at_edge
async def dead_letter_log(
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """List the dead-letter replays and purges operators ran (when, who, the queue, why, and
    what became of each message), newest first."""
    screen = output(json_out, wide)
    async with connection.operations(workdir) as ops:
        view = await ops.dead_letter_log(limit=limit)
    emit(view, views.show_dead_letter_log, screen, MODE.wide)
