"""How `orderctl` shows the operator views to people: an order (status, archived), steps with
what they went through, an order's changes as it is followed, bulk actions, dead-letter actions
and their log, faults and health.

Stored data (reasons, details, ids, operator names, message ids) goes through
:func:`orderctl.plain_text.text`: printed as text, never as markup, control characters escaped.
``wide``: nothing is cut.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from orderctl.output import FaultView
from orderctl.plain_text import printable, text

STEP_STYLES = {
    "Succeeded": "green",
    "Running": "yellow",
    "Failed": "red",
    "Compensated": "cyan",
    "Voided": "cyan",
}
OUTCOME_STYLES = {
    "replayed": "green",
    "purged": "green",
    "refused": "red",
    "failed": "red",
    "not_found": "yellow",
    "skipped": "yellow",
}


def took(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest} s"


def step_table(steps: Any, wide: bool) -> Table:
    """Each step: what is known of its effect, its key's generation, requests sent, failed
    attempts, how long its latest run took, its error; ``wide`` adds when it started, its
    deferrals, and when it completed and was undone."""
    table = Table(title="steps")
    columns = ["step", "state", "gen", "req", "fail", "took"]
    columns += ["deferred", "started", "done", "undone"] if wide else []
    for name in columns:
        table.add_column(name, no_wrap=True)
    table.add_column("error", ratio=1)
    for step in steps:
        error = f"{step.error_code}: {step.error_message}" if step.error_code else ""
        row = [
            text(step.name),
            text(step.state, STEP_STYLES.get(step.state, "")),
            str(step.generation),
            str(step.attempt),
            str(step.failures),
            took(step.duration_s),
        ]
        if wide:
            row += [
                str(step.deferrals),
                f"{step.started_at:%H:%M:%S}" if step.started_at else "",
                f"{step.completed_at:%H:%M:%S}" if step.completed_at else "",
                f"{step.compensated_at:%H:%M:%S}" if step.compensated_at else "",
            ]
        table.add_row(*row, text(error, width=60, wide=wide))
    return table


def show_reasons(steps: Any, screen: Console, wide: bool) -> None:
    """Why each step's attempts failed, were deferred or answered late, from the timeline."""
    for step in steps:
        for reason in step.reasons:
            screen.print(Text.assemble("  ", text(step.name, "bold"), ": ", text(reason)))


def show_order(order: Any, screen: Console, wide: bool) -> None:
    """An order's state, steps and timeline (an OrderDetail)."""
    p = order.order
    screen.print(
        Text.assemble(
            (printable(p.order_id), "bold"),
            printable(
                f"  {p.state}  step {p.current_step} ({p.current_operation}), "
                f"generation {p.generation}, attempt {p.attempt}, failures {p.failure_count}, "
                f"locked by {p.locked_by or '-'}"
            ),
        )
    )
    if p.next_attempt_at:
        screen.print(Text(f"next attempt due {p.next_attempt_at:%H:%M:%S}"))
    if p.settling:
        screen.print(text(f"settling: an answer may still change {', '.join(p.settling)}"))
    if p.compensation_cause:
        since = f" since {p.compensating_since:%Y-%m-%d %H:%M:%S}" if p.compensating_since else ""
        why = p.compensation_reason or "-"
        screen.print(text(f"compensation ({p.compensation_cause}){since}: {why}"))
    if p.last_error:
        screen.print(text(f"last error: {p.last_error}"))
    screen.print(step_table(order.steps, wide))
    show_reasons(order.steps, screen, wide)
    events = Table("#", "at", "actor", "event", "from → to", "detail", title="timeline")
    for entry in order.timeline:
        events.add_row(
            str(entry.seq),
            entry.at.strftime("%H:%M:%S.%f")[:-3],
            text(entry.actor),
            text(entry.event),
            text(f"{entry.from_state or ''} → {entry.to_state}"),
            text(entry.detail),
        )
    screen.print(events)


def timeline_line(entry: Any, wide: bool = True) -> Text:
    """One timeline entry on one line: when, what, the state change, the step, who, why."""
    change = f"{entry.from_state or '-'} → {entry.to_state}"
    return Text.assemble(
        (entry.at.strftime("%H:%M:%S.%f")[:-3], "dim"),
        "  ",
        text(entry.event, "bold"),
        "  ",
        text(change),
        "  ",
        text(entry.step or "-"),
        "  ",
        text(entry.actor, "dim"),
        "  ",
        text(entry.detail, width=120, wide=wide),
    )


def show_bulk(view: Any, screen: Console, wide: bool) -> None:
    done = "would be acted on (dry run: nothing changed)" if view.dry_run else "acted on"
    count = len(view.items) if view.dry_run else view.acted
    if not view.items:
        screen.print(text(f"no {' or '.join(view.states)} order matches: nothing to {view.action}"))
        return
    shown = ", ".join(f"{k} {v}" for k, v in view.filters.items())
    title = f"{view.action} — {', '.join(view.states)} orders" + (f" ({shown})" if shown else "")
    table = Table(title=text(title))
    columns = ["order", "state", "outcome"] + (["step", "created"] if wide else [])
    for name in columns:
        table.add_column(name, no_wrap=True)
    table.add_column("detail", ratio=1)
    for item in view.items:
        order = item.order
        row = [
            text(item.order_id, width=40, wide=wide),
            text(item.state or (order.state if order else "-")),
            text(item.outcome, OUTCOME_STYLES.get(item.outcome, "")),
        ]
        if wide:
            row += [
                text(order.current_step if order else ""),
                f"{order.created_at:%Y-%m-%d %H:%M:%S}" if order else "",
            ]
        detail = item.detail or (order.last_error if order else "") or ""
        table.add_row(*row, text(detail, width=60, wide=wide))
    screen.print(table)
    screen.print(text(f"{count} order(s) {done}"))
    if view.more:
        screen.print(text("more orders match: run it again"))


def show_dead_letter_action(view: Any, screen: Console, wide: bool) -> None:
    verb = {"replay": "replay", "purge": "purge"}[view.action]
    title = f"{verb} dead letters of {view.entity}" + (" (dry run)" if view.dry_run else "")
    table = Table(title=text(title))
    for name in ("#", "message id", "order", "outcome"):
        table.add_column(name, no_wrap=True)
    table.add_column("detail", ratio=1)
    table.add_column("timeline", no_wrap=True)
    for item in view.items:
        table.add_row(
            str(item.sequence_number),
            text(item.message_id or "", width=40, wide=wide),
            text(item.order_id or "-"),
            text(item.outcome, OUTCOME_STYLES.get(item.outcome, "")),
            text(item.detail, width=80, wide=wide),
            "recorded" if item.recorded_in_timeline else "",
        )
    if not view.items:
        screen.print(text(f"no dead letters in {view.entity}: nothing to {verb}"))
        return
    screen.print(table)
    if view.more:
        screen.print(text("more dead letters are left: run it again"))


def outcome_counts(counts: dict[str, int]) -> str:
    """``{"purged": 2, "refused": 1}`` as ``2 purged, 1 refused``."""
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "none"


def show_dead_letter_log(view: Any, screen: Console, wide: bool) -> None:
    if not view.actions:
        screen.print(text("no dead-letter replay or purge is recorded"))
        return
    table = Table(title="dead-letter log")
    for name in ("at", "by", "action", "queue", "messages", "outcomes"):
        table.add_column(name, no_wrap=True)
    table.add_column("reason", ratio=1)
    for entry in view.actions:
        listed = f"{entry.messages}+" if entry.truncated else str(entry.messages)
        table.add_row(
            f"{entry.at:%Y-%m-%d %H:%M:%S}",
            text(entry.actor, width=30, wide=wide),
            text(entry.action),
            text(entry.queue),
            listed,
            text(outcome_counts(entry.counts), width=40, wide=wide),
            text(entry.reason, width=80, wide=wide),
        )
    screen.print(table)
    if any(entry.truncated for entry in view.actions):
        screen.print(text("+: more messages than the log could store; their outcomes are cut"))


def show_fault(view: FaultView, screen: Console) -> None:
    verb = "now" if view.changed else "in force"
    screen.print(
        Text.assemble(
            f"fault profile {verb}: ", (printable(view.source), "bold"),
            " — ", printable(view.description or "(no description)"),
        )
    )  # fmt: skip
    for service, count in view.declines_pending.items():
        screen.print(text(f"{service}: the next {count} forward call(s) will be declined"))
    screen.print(text(f"fake services at {view.fakes_url}", "dim"))


def show_health(view: Any, screen: Console) -> None:
    table = Table("check", "ok", "detail", "ms", title=text(f"health: {view.status}"))
    for check in view.checks:
        ok = Text("yes", style="green") if check.ok else Text("NO", style="bold red")
        table.add_row(text(check.name), ok, text(check.detail), f"{check.duration_ms:g}")
    screen.print(table)
