"""orderctl refuses bad input with a message that says what is wrong, before touching anything.

Each command runs its own event loop (``asyncio.run`` at its edge): a test that awaits too (an
in-memory store to put in place or look at) runs the command on a thread of its own.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from devstack.orders import build_order, parse_item
from devstack.stack.local_stack import StackInfo
from orderctl.cli import app
from orderctl.output import validate

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


async def run_beside(*args: str):
    """:func:`run` from an async test: the command's event loop on a thread of its own."""
    return await asyncio.to_thread(run, *args)


def test_submit_without_a_stack_says_how_to_start_one(tmp_path):
    result = run("submit", "--workdir", str(tmp_path))
    assert result.exit_code == 2
    assert "no running stack" in result.output and "orderctl up" in result.output


def test_status_without_a_stack_says_how_to_start_one(tmp_path):
    result = run("status", "order-1", "--workdir", str(tmp_path))
    assert result.exit_code == 2
    assert "orderctl up" in result.output


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("SKU-1", "must be SKU:QUANTITY:UNIT_PRICE_CENTS"),
        ("SKU-1:two:100", "must be integers"),
        ("SKU-1:1:9.99", "must be integers"),
    ],
)
def test_malformed_items_are_explained(item, message):
    with pytest.raises(ValueError, match=message):
        parse_item(item)


def test_orders_are_validated_like_the_app_validates_them():
    with pytest.raises(ValueError, match="order_id"):
        build_order("x' or PartitionKey ne '", ["SKU-1:1:100"], "c-1", "EUR", "order", None)
    with pytest.raises(ValueError, match="unknown workflow"):
        build_order(None, ["SKU-1:1:100"], "c-1", "EUR", "teleport", None)
    order = build_order(None, ["SKU-1:2:150", "SKU-2:1:100"], "c-1", "EUR", "order", None)
    assert order.total_cents == 400


def test_a_bad_profile_file_is_refused_with_the_line_at_fault(tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text('{\n  "default": {\n    "transient_rate": 0.1,\n  }\n}\n')
    result = run("up", "--profile", str(profile), "--workdir", str(tmp_path / "stack"))
    assert result.exit_code == 2
    assert "line 4" in result.output


def test_an_unknown_profile_name_lists_the_known_ones(tmp_path):
    result = run("demo", "--profile", "apocalyptic", "--workdir", str(tmp_path))
    assert result.exit_code == 2
    assert "chaotic" in result.output and "flaky" in result.output


def test_status_shows_each_steps_state_generation_and_attempts(monkeypatch):
    from contextlib import asynccontextmanager
    from datetime import UTC, datetime

    from rich.console import Console

    from adapters.store.records import OrderRecord
    from domain.order import Order, StepRecord, StepState, TimelineEntry
    from domain.states import ProcessState
    from service.operations.models import OrderDetail

    now = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    submitted = build_order("order-7", ["SKU-1:1:100"], "c-1", "EUR", "order", None)
    order = Order(
        order_id="order-7",
        workflow="order",
        state=ProcessState.COMPENSATING,
        locked_by="operator:bob",
        complete_by=now,
        failure_count=0,
        attempt=4,
        generation=2,
        current_step="reserve_inventory",
        current_operation="undo",
        reply_to=None,
        payload={},
        steps=(
            StepRecord("reserve_inventory", 0, StepState.RUNNING, generation=2, attempt=3),
            StepRecord("charge_payment", 1),
            StepRecord("create_shipment", 2),
        ),
        created_at=now,
        updated_at=now,
        compensation_cause="cancelled",
        compensation_reason="cancelled by operator:bob: changed their mind",
        compensation_started_at=now,
    )
    entry = TimelineEntry(
        1, now, "operator:bob", "compensation_started", ProcessState.PROCESSING,
        ProcessState.COMPENSATING, "reserve_inventory", 4, "cancelled: [red]no[/red] stock",
    )  # fmt: skip
    detail = OrderDetail.of(OrderRecord(submitted, "h", order), [entry], False)

    class Ops:
        async def show_order(self, order_id):
            assert order_id == "order-7"
            return detail

    @asynccontextmanager
    async def operations(workdir):
        yield Ops()

    monkeypatch.setattr("orderctl.connection.operations", operations)
    monkeypatch.setattr("orderctl.app.console", Console(width=200))
    result = run("status", "order-7")
    assert result.exit_code == 0, result.output
    assert "Compensating" in result.output
    assert "compensation (cancelled) since 2025-03-01 12:00:00" in result.output
    row = [line for line in result.output.splitlines() if "reserve_inventory" in line][-1]
    assert "Running" in row and "│ 2 " in row and "│ 3 " in row
    assert "compensation_started" in result.output
    assert "cancelled: [red]no[/red] stock" in result.output, "stored text is never markup"


@pytest.mark.anyio
async def test_supervisor_shows_lag_holders_and_the_bound(monkeypatch):
    from contextlib import asynccontextmanager
    from datetime import UTC, datetime, timedelta

    from rich.console import Console

    from adapters.settings import Settings
    from adapters.store.supervision import BucketLease, Member
    from devstack.memory import MemoryBus, MemoryStore
    from orderctl.local import LocalOperations
    from service.runtime import Runtime
    from tests.support.app import EXAMPLE_SETTINGS

    now = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    store = MemoryStore(lambda: now)
    holder = "supervisor@host.1.abc"
    await store.supervision.claim(
        Member(holder, now + timedelta(seconds=20)),
        [BucketLease(b, holder, now + timedelta(seconds=20)) for b in range(3)],
        (),
    )
    settings = Settings.from_env(EXAMPLE_SETTINGS)
    rt = Runtime(
        settings=settings,
        store=store,  # type: ignore[arg-type]
        bus=MemoryBus(),  # type: ignore[arg-type]
        workflows=settings.workflows(),
        clock=lambda: now,
    )

    @asynccontextmanager
    async def operations(workdir):
        yield LocalOperations(rt)

    monkeypatch.setattr("orderctl.connection.operations", operations)
    monkeypatch.setattr("orderctl.app.console", Console(width=200))
    result = await run_beside("supervisor")
    assert result.exit_code == 0, result.output
    assert "deadline to recovery at most 42.2 s" in result.output  # 41.25 + 1 s of skew
    assert "buckets not swept within the bound" in result.output  # none swept yet
    assert result.output.count(holder) == 3
    assert result.output.count("never") == 1 + 16  # the summary line and each bucket


def _memory_operations(monkeypatch, clock):
    """`orderctl` on a real LocalOperations over the in-memory store and archive."""
    from contextlib import asynccontextmanager

    from rich.console import Console

    from adapters.settings import Settings
    from devstack.memory import MemoryArchive, MemoryBus, MemoryStore
    from orderctl.app import fail
    from orderctl.local import LocalOperations
    from service.operations.errors import OperatorError
    from service.runtime import Runtime
    from tests.support.app import EXAMPLE_SETTINGS

    store = MemoryStore(clock)
    settings = Settings.from_env(EXAMPLE_SETTINGS)
    rt = Runtime(
        settings=settings,
        store=store,  # type: ignore[arg-type]
        bus=MemoryBus(),  # type: ignore[arg-type]
        workflows=settings.workflows(),
        clock=clock,
    )
    ops = LocalOperations(rt)
    ops.use_archive(MemoryArchive())

    @asynccontextmanager
    async def operations(workdir):
        try:
            yield ops
        except OperatorError as error:
            raise fail(f"{error.message} ({error.code})", 2) from None

    monkeypatch.setattr("orderctl.connection.operations", operations)
    monkeypatch.setattr("orderctl.app.console", Console(width=200))
    return store


@pytest.mark.anyio
async def test_purge_then_list_runs_then_read_an_order_back(monkeypatch):
    from datetime import timedelta

    from tests.integration.test_state_store import T0, Clock, to_processed

    clock = Clock(T0)
    store = _memory_operations(monkeypatch, clock)
    done = await to_processed(store, clock, "o-1")
    done = await store.annotate(done, actor="operator:bob", event="note", detail="[red]x[/red] y")
    await store.index.discard(done.order_id, done.generation)
    clock.advance(timedelta(days=10))

    result = await run_beside("purge", "--older-than", "7", "--dry-run", "--operator", "ann")
    assert result.exit_code == 0, result.output
    assert "dry run: nothing changed" in result.output
    assert await store.find(done.order_id) is not None

    result = await run_beside(
        "purge", "--older-than", "7", "--state", "Processed", "--operator", "ann"
    )
    assert result.exit_code == 0, result.output
    row = [line for line in result.output.splitlines() if line.startswith("│")][-1]
    assert [cell.strip() for cell in row.strip("│").split("│")] == ["1", "1", "1", "1", "0"]
    assert "archived to 2025/06/11.jsonl" in result.output
    assert await store.find(done.order_id) is None

    result = await run_beside("purges")
    assert result.exit_code == 0, result.output
    assert "operator:ann" in result.output and "Processed" in result.output

    result = await run_beside("archived", done.order_id)
    assert result.exit_code == 0, result.output
    assert "[red]x[/red] y" in result.output, "stored text is shown as text, never markup"
    assert "Processed" in result.output and "reserve_inventory" in result.output


def test_purge_refusals_say_what_to_fix(monkeypatch):
    from tests.integration.test_state_store import T0, Clock

    _memory_operations(monkeypatch, Clock(T0))
    result = run("purge", "--state", "Pending", "--operator", "ann")
    assert result.exit_code == 2
    assert "cannot be purged; purge Processed, Error or all" in result.output
    result = run("purge", "--older-than", "0")
    assert result.exit_code == 2 and "--older-than" in result.output
    result = run("archived", "o-404")
    assert result.exit_code == 2 and "order o-404 is not in the archive" in result.output
    result = run("archived", "o-1", "--day", "yesterday")
    assert result.exit_code == 2 and "is not a date like 2025-06-01" in result.output


def test_workflow_diff_names_the_new_step_and_the_changed_undo():
    result = runner.invoke(app, ["workflow-diff", "order@1", "order@2", "--json"])
    assert result.exit_code == 0, result.output
    assert '"+ verify_address (shipping.verify), after charge_payment"' in result.stdout
    assert '"~ charge_payment: undo_operation refund -> void"' in result.stdout


def test_workflow_diff_of_a_version_not_carried_is_a_one_line_error():
    result = runner.invoke(app, ["workflow-diff", "order@1", "order@9"])
    assert result.exit_code == 2
    assert "no workflow 'order@9'" in result.stderr


# ------------------------------------------------------------------- trace, --telemetry


def span_line(span_id, parent=None, *, name, start_ms, ms, trace="a" * 32, kind="INTERNAL",
              order_id=None, queue=None, status="UNSET", role="host"):  # fmt: skip
    attributes = {}
    if order_id:
        attributes["order.id"] = order_id
    if queue:
        attributes["messaging.destination.name"] = queue
    start = 1_800_000_000_000_000_000 + start_ms * 1_000_000
    return json.dumps(
        {
            "trace_id": trace,
            "span_id": span_id,
            "parent_id": parent,
            "name": name,
            "kind": kind,
            "start_ns": start,
            "end_ns": start + int(ms * 1_000_000),
            "status": status,
            "attributes": attributes,
            "role": role,
        }
    )


def write_spans(directory, *lines):
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "spans-host-1.jsonl").open("a") as out:
        out.write("\n".join(lines) + "\n")


ONE_HOP = (
    span_line("s1", name="submit", start_ms=0, ms=3, kind="CLIENT", order_id="ORD-9",
              role="orderctl"),
    span_line("i1", "s1", name="scheduler_intake", start_ms=5, ms=9, kind="CONSUMER"),
    span_line("a1", "i1", name="scheduler_intake", start_ms=6, ms=7, order_id="ORD-9",
              queue="orders"),
    span_line("i2", "a1", name="reserve_agent", start_ms=20, ms=1500, kind="CONSUMER"),
    span_line("a2", "i2", name="reserve_agent", start_ms=21, ms=1400, order_id="ORD-9",
              queue="inventory-requests", status="ERROR"),
)  # fmt: skip


def test_trace_prints_one_tree_with_hops_folded_and_durations(tmp_path):
    telemetry = tmp_path / "telemetry"
    write_spans(telemetry, *ONE_HOP, span_line("x", name="other", start_ms=1, ms=1, order_id="B"))
    result = run("trace", "ORD-9", "--workdir", str(tmp_path), "--wide")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "order ORD-9: 5 spans" in out and "several traces" not in out
    lines = [line for line in out.splitlines() if "+0." in line or "+1." in line]
    assert [line.split("s ", 1)[1].split()[0] for line in lines] == [
        "submit",
        "scheduler_intake",
        "reserve_agent",
    ]
    assert "7.0 ms (invocation 9.0 ms)" in out and "queue orders" in out
    assert "1.40 s (invocation 1.50 s)" in out and "failed" in out
    assert "[orderctl]" in out
    assert "other" not in out


def test_trace_explains_why_hops_are_in_another_trace(tmp_path):
    later = (
        span_line("t", name="supervisor_tick", start_ms=9000, ms=30, trace="b" * 32),
        span_line("c", "t", name="scheduler_commands", start_ms=9010, ms=5, trace="b" * 32,
                  order_id="ORD-9"),
        span_line("t2", "t", name="sweep other", start_ms=9011, ms=5, trace="b" * 32,
                  order_id="ORD-OTHER"),
    )  # fmt: skip
    write_spans(tmp_path / "telemetry", *later, *ONE_HOP)
    result = run("trace", "ORD-9", "--workdir", str(tmp_path), "--wide")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "7 spans in 2 traces" in out
    assert out.index("trace " + "a" * 32) < out.index("trace " + "b" * 32)
    assert "why a trace of its own: the Supervisor's timer tick recovered the order" in out
    assert "ORD-OTHER" not in out and "sweep other" not in out


def test_trace_json_is_its_documented_shape(tmp_path):
    write_spans(tmp_path / "t", *ONE_HOP)
    result = run("trace", "ORD-9", "--dir", str(tmp_path / "t"), "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    view = validate("trace", document)
    assert view.model_dump(mode="json") == document
    (only,) = view.traces
    (root,) = only.spans
    assert (root.name, root.kind, root.duration_ms) == ("submit", "CLIENT", 3.0)
    assert root.children[0].children[0].attributes == {
        "order.id": "ORD-9",
        "messaging.destination.name": "orders",
    }


def test_trace_prints_stored_text_as_text_not_markup(tmp_path):
    hostile = span_line("h", name="[bold red]x[/]\x1b[2J", start_ms=0, ms=1, order_id="ORD-9",
                        queue="[link=http://evil]q[/link]")  # fmt: skip
    write_spans(tmp_path / "telemetry", hostile)
    result = run("trace", "ORD-9", "--workdir", str(tmp_path), "--wide")
    assert result.exit_code == 0, result.output
    assert "[bold red]x[/]" in result.stdout and "\x1b[2J" not in result.stdout
    assert "[link=http://evil]q[/link]" in result.stdout


def test_trace_refuses_a_bad_order_id(tmp_path):
    result = run("trace", "ORD 9; rm", "--workdir", str(tmp_path))
    assert result.exit_code == 2
    assert result.stderr.startswith("error: not an order id")


def test_trace_without_telemetry_files_says_how_to_turn_them_on(tmp_path):
    result = run("trace", "ORD-9", "--workdir", str(tmp_path))
    assert result.exit_code == 2
    assert "no telemetry directory" in result.stderr and "orderctl up --telemetry" in result.stderr
    (tmp_path / "telemetry").mkdir()
    result = run("trace", "ORD-9", "--workdir", str(tmp_path))
    assert result.exit_code == 2
    assert "no spans for order ORD-9" in result.stderr
    assert "orderctl up --telemetry" in result.stderr


def test_trace_reads_the_directory_the_stack_recorded(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    write_spans(elsewhere, *ONE_HOP)
    StackInfo(settings={"TELEMETRY_DIR": str(elsewhere)}, fakes_url="").save(
        tmp_path / "stack.json"
    )
    result = run("trace", "ORD-9", "--workdir", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["directory"] == str(elsewhere)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], None),
        (["--telemetry"], "WORKDIR/telemetry"),
        (["--telemetry-dir", "somewhere"], "somewhere"),
        (["--telemetry", "--telemetry-dir", "somewhere"], "somewhere"),
    ],
)
def test_up_passes_the_telemetry_directory_to_the_stack(tmp_path, monkeypatch, args, expected):
    made: list[dict] = []

    class Stack:
        def __init__(self, workdir, **kwargs):
            made.append(kwargs)

    monkeypatch.setattr("orderctl.connection.check_installed", lambda: None)
    monkeypatch.setattr("orderctl.stack_commands.LocalStack", Stack)

    async def run_supervised(*args, **kwargs) -> None:
        pass

    monkeypatch.setattr("orderctl.stack_commands.run_supervised", run_supervised)
    monkeypatch.chdir(tmp_path)
    result = run("up", *args, "--workdir", str(tmp_path / "wd"))
    assert result.exit_code == 0, result.output
    (kwargs,) = made
    if expected is None:
        assert kwargs["telemetry"] is None
    elif expected.startswith("WORKDIR"):
        assert kwargs["telemetry"] == tmp_path / "wd" / "telemetry"
    else:
        assert kwargs["telemetry"] == tmp_path / expected


def test_the_stack_hands_its_hosts_the_telemetry_setting(tmp_path):
    from adapters.telemetry import TELEMETRY_DIR_SETTING
    from devstack.stack.local_stack import TELEMETRY_SETTING, LocalStack, telemetry_dir

    assert TELEMETRY_SETTING == TELEMETRY_DIR_SETTING
    stack = LocalStack(tmp_path, telemetry=tmp_path / "t")
    assert stack.telemetry == (tmp_path / "t").resolve()
    assert LocalStack(tmp_path).telemetry is None
    assert telemetry_dir(tmp_path) == tmp_path / "telemetry"
    info = StackInfo(settings={"TELEMETRY_DIR": "/x"}, fakes_url="")
    assert telemetry_dir(tmp_path, info) == Path("/x")
