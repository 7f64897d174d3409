"""`orderctl workflows`, `workflow-diff` and `migrate`: the workflow versions and the
orders on each, what changed between two, moving orders in flight to another."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from devstack.stack.local_stack import DEFAULT_WORKDIR
from orderctl import connection
from orderctl.app import app, at_edge, emit, fail, output
from orderctl.options import OPERATOR, Json, Operator, Reason, Wide, Workdir
from orderctl.output import (
    MigrateView,
    WorkflowDiffView,
    WorkflowStepView,
    WorkflowsView,
    WorkflowVersionView,
)
from orderctl.plain_text import text


@app.command()
@at_edge
async def workflows(
    check: Annotated[
        bool, typer.Option("--check", help="exit 1 if this code drops a version orders need")
    ] = False,
    json_out: Json = False,
    wide: Wide = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Workflow versions: their steps, the orders on each, and whether this code may be
    deployed over the stored orders (the same check as the azd predeploy hook)."""
    from adapters.settings import Settings
    from devstack.orders import open_store
    from domain.workflows import WORKFLOWS
    from service.versions import check as verdict_of
    from service.versions import missing, versions_in_use

    screen = output(json_out, wide)
    info = connection.running_stack(workdir)
    settings = Settings.from_env(info.settings)
    async with open_store(info.settings) as store:
        in_use = await versions_in_use(store)
    ok, verdict = verdict_of(in_use, WORKFLOWS)
    view = WorkflowsView(
        versions=[
            WorkflowVersionView(
                ref=ref,
                current=settings.current_version(flow.name) == flow.version,
                steps=[
                    WorkflowStepView(
                        name=s.name,
                        agent=s.agent,
                        operation=s.operation,
                        undo_operation=s.undo_operation,
                    )
                    for s in flow.steps
                ],
                in_flight=in_use[ref].in_flight if ref in in_use else 0,
                in_error=in_use[ref].in_error if ref in in_use else 0,
            )
            for ref, flow in WORKFLOWS.items()
        ],
        needed_but_not_carried=[u.ref for u in missing(in_use, WORKFLOWS)],
        deployable=ok,
        verdict=verdict,
    )
    emit(view, show_workflows, screen)
    if check and not ok:
        raise typer.Exit(1)


def show_workflows(view: WorkflowsView, screen: Console) -> None:
    table = Table("version", "current", "steps (undo)", "in flight", "in Error", title="workflows")
    for v in view.versions:
        steps = " → ".join(f"{s.name} ({s.undo_operation or '-'})" for s in v.steps)
        table.add_row(
            text(v.ref), "yes" if v.current else "", text(steps), str(v.in_flight), str(v.in_error)
        )
    screen.print(table)
    screen.print(text(view.verdict, "" if view.deployable else "red"))


@app.command("workflow-diff")
def workflow_diff(
    old: Annotated[str, typer.Argument(help="a version, e.g. order@1")],
    new: Annotated[str, typer.Argument(help="another, e.g. order@2")],
    json_out: Json = False,
) -> None:
    """What changed between two workflow versions this code carries."""
    from domain.workflows import WORKFLOWS, UnknownWorkflow, resolve
    from service.versions import diff

    screen = output(json_out)
    try:
        a, b = resolve(WORKFLOWS, old), resolve(WORKFLOWS, new)
    except UnknownWorkflow as error:
        raise fail(str(error), 2) from None
    view = WorkflowDiffView(old=a.ref, new=b.ref, changes=diff(a, b))
    emit(view, show_diff, screen)


@app.command()
@at_edge
async def migrate(
    from_ref: Annotated[str, typer.Option("--from", help="the version orders are on: order@1")],
    to_ref: Annotated[str, typer.Option("--to", help="the version to move them to: order@2")],
    reason: Reason,
    apply_: Annotated[
        bool, typer.Option("--apply", help="move them (without it: a dry run, nothing changes)")
    ] = False,
    operator: Operator = OPERATOR,
    json_out: Json = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Move the orders in flight on one workflow version to another, where the new version
    keeps every step they have reached (recorded in each order's timeline)."""
    from adapters.settings import Settings
    from adapters.store.records import OrderRecords
    from service.migration import migrate as run_migration
    from service.runtime import Runtime

    screen = output(json_out)
    info = connection.running_stack(workdir)
    runtime = Runtime.from_settings(Settings.from_env(info.settings), OrderRecords)
    try:
        report = await run_migration(
            runtime,
            from_ref,
            to_ref,
            actor=f"operator:{operator}",
            reason=reason,
            dry_run=not apply_,
        )
    except ValueError as error:
        raise fail(str(error), 2) from None
    finally:
        await runtime.close()
    view = MigrateView(
        from_ref=report.from_ref,
        to_ref=report.to_ref,
        dry_run=report.dry_run,
        examined=report.examined,
        migrated=report.migrated,
        refused=dict(report.refused),
    )
    emit(view, show_migrate, screen)


def show_migrate(view: MigrateView, screen: Console) -> None:
    done = "would move" if view.dry_run else "moved"
    screen.print(
        text(f"{view.from_ref} → {view.to_ref}: {view.examined} orders in flight, {done} "
             f"{view.migrated}" + (" (dry run: add --apply to move them)" if view.dry_run else ""))
    )  # fmt: skip
    for why, count in sorted(view.refused.items()):
        screen.print(text(f"  {count} stay: {why}"))


def show_diff(view: WorkflowDiffView, screen: Console) -> None:
    screen.print(text(f"{view.old} → {view.new}", "bold"))
    for change in view.changes or ["no change"]:
        screen.print(text(change))
