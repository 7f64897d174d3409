"""infra/smoke.py without Azure: arguments, the order it sends, watching and the stuck report."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from adapters.servicebus import to_servicebus_message
from domain.messages import OrderSubmitted, message_id_for, parse_message
from domain.order import Order, StepRecord, StepState, TimelineEntry
from domain.states import ProcessState
from infra import smoke
from tests.infra.checks import REPO_ROOT

pytestmark = pytest.mark.anyio

NS = "sb-abc.servicebus.windows.net"
TABLES = "https://stabc.table.core.windows.net/"
T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


# ---------------------------------------------------------------------------- arguments


def test_arguments_from_the_command_line():
    args = smoke.parse_args(
        ["--namespace", NS, "--storage-table-endpoint", TABLES, "--timeout", "30"], env={}
    )
    assert args.namespace == NS
    assert args.storage_table_endpoint == TABLES
    assert args.timeout == 30.0
    assert args.orders_queue == smoke.DEFAULT_ORDERS_QUEUE
    assert args.orders_table == smoke.DEFAULT_ORDERS_TABLE
    assert args.order_id.startswith("smoke-")


def test_arguments_default_to_azd_environment_values():
    env = {
        "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE": NS,
        "AZURE_STORAGE_TABLE_ENDPOINT": TABLES,
        "ORDERS_QUEUE": "submissions",
        "ORDERS_TABLE": "orderstate",
    }
    args = smoke.parse_args([], env=env)
    assert (args.namespace, args.storage_table_endpoint) == (NS, TABLES)
    assert (args.orders_queue, args.orders_table) == ("submissions", "orderstate")
    assert args.timeout == smoke.DEFAULT_TIMEOUT_SECONDS


@pytest.mark.parametrize(
    "given",
    [
        "sb://sb-abc.servicebus.windows.net/",
        "https://sb-abc.servicebus.windows.net:443/",
        "SB-ABC.servicebus.windows.net",
    ],
)
def test_namespace_forms_are_normalized(given):
    args = smoke.parse_args(["--namespace", given, "--storage-table-endpoint", TABLES], env={})
    assert args.namespace == NS


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "--namespace is required"),
        (["--namespace", NS], {}, "--storage-table-endpoint is required"),
        (["--namespace", "sb-abc", "--storage-table-endpoint", TABLES], {}, "fully qualified"),
        (["--namespace", NS, "--storage-table-endpoint", "http://x/"], {}, "table endpoint"),
        (["--timeout", "0"], {"SERVICEBUS_FULLY_QUALIFIED_NAMESPACE": NS}, "must be positive"),
        ([], {"SERVICEBUS_FULLY_QUALIFIED_NAMESPACE": "nope"}, "fully qualified"),
    ],
)
def test_bad_arguments_exit_with_usage(argv, env, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        smoke.parse_args(argv, env=env)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_script_runs_from_any_directory(tmp_path):
    """`python infra/smoke.py` finds the app's modules without installing anything."""
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "infra" / "smoke.py"), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--storage-table-endpoint" in result.stdout


def test_a_bad_workflow_is_a_usage_error(capsys):
    argv = ["--namespace", NS, "--storage-table-endpoint", TABLES, "--workflow", "nope"]
    assert smoke.main(argv) == 2
    assert "unknown workflow 'nope'" in capsys.readouterr().err


# -------------------------------------------------------------------------------- order


def test_the_order_is_the_apps_own_message():
    order = smoke.build_order("smoke-1", "order", None)
    message = to_servicebus_message(order)
    body = b"".join(message.body)
    assert parse_message(body, OrderSubmitted) == order
    assert message.message_id == message_id_for(order)
    assert json.loads(body)["type"] == "OrderSubmitted"


def test_new_order_ids_are_valid_and_distinct():
    ids = {smoke.new_order_id(T0) for _ in range(50)}
    assert len(ids) == 50
    for order_id in ids:
        assert order_id.startswith("smoke-20250301-120000-")
        smoke.build_order(order_id, "single_step", "order-status")  # validates the id


# ------------------------------------------------------------------------------ watching


STEPS = tuple(
    StepRecord(name, index)
    for index, name in enumerate(("reserve_inventory", "charge_payment", "create_shipment"))
)


def steps(*states: StepState) -> tuple[StepRecord, ...]:
    """The three steps, the first ``len(states)`` of them in those states (generation 1)."""
    return (
        tuple(
            dataclasses.replace(step, state=state, generation=1, attempt=1)
            for step, state in zip(STEPS, states, strict=False)
        )
        + STEPS[len(states) :]
    )


def record(state: ProcessState, **changes) -> Order:
    base = Order(
        order_id="smoke-1",
        workflow="order",
        state=state,
        locked_by=None,
        complete_by=None,
        failure_count=0,
        attempt=0,
        generation=1,
        current_step="reserve_inventory",
        current_operation="do",
        reply_to=None,
        payload={},
        steps=STEPS,
        last_error=None,
        next_attempt_at=None,
        created_at=T0,
        updated_at=T0,
        timeline_seq=0,
        write_id="w",
        etag='W/"1"',
    )
    return dataclasses.replace(base, **changes)


def entry(seq: int, event: str, from_state, to_state, step=None, detail="") -> TimelineEntry:
    return TimelineEntry(
        seq=seq,
        at=T0 + timedelta(seconds=seq),
        actor="scheduler:app@host.1.abcd",
        event=event,
        from_state=from_state,
        to_state=to_state,
        step=step,
        attempt=1,
        detail=detail,
    )


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


async def run_watch(reads, timeline=(), timeout=10.0):
    clock, out = FakeClock(), io.StringIO()
    reads = iter(reads)
    last = [None]

    async def read_process():
        last[0] = next(reads, last[0])
        return last[0]

    async def read_timeline():
        return list(timeline)

    outcome = await smoke.watch(
        "smoke-1",
        read_process,
        read_timeline,
        timeout=timeout,
        poll_interval=2.0,
        out=out,
        monotonic=clock.monotonic,
        sleep=clock.sleep,
        now=lambda: T0 + timedelta(minutes=5),
    )
    return outcome, out.getvalue(), clock


async def test_watch_prints_each_change_once_and_stops_at_processed():
    processing = record(
        ProcessState.PROCESSING,
        current_step="reserve_inventory",
        attempt=1,
        locked_by="scheduler@h.1.ab",
    )
    outcome, printed, clock = await run_watch(
        [
            None,
            record(ProcessState.PENDING),
            processing,
            processing,  # unchanged: not printed again
            dataclasses.replace(processing, current_step="charge_payment"),
            record(ProcessState.PROCESSED, attempt=1),
        ]
    )
    assert outcome.status == smoke.EXIT_PROCESSED
    lines = printed.splitlines()
    assert "no process record yet" in lines[0]
    assert "Pending" in lines[1]
    assert "step=reserve_inventory/do attempt=1" in lines[2]
    assert "locked_by=scheduler@h.1.ab" in lines[2]
    assert "step=charge_payment/do" in lines[3]
    assert "Processed" in lines[4]
    assert lines[-1] == "order smoke-1 Processed in 10.0 s"
    assert len(lines) == 6
    assert clock.sleeps == [2.0] * 5


async def test_watch_reports_where_the_order_is_stuck_at_the_timeout():
    stuck = record(
        ProcessState.PROCESSING,
        current_step="charge_payment",
        attempt=2,
        failure_count=1,
        locked_by="scheduler@h.1.ab",
        complete_by=T0 + timedelta(minutes=4),
        last_error="payment: 503 Service Unavailable\nretrying",
        steps=steps(StepState.SUCCEEDED, StepState.RUNNING),
    )
    timeline = [
        entry(i, "claimed", ProcessState.PENDING, ProcessState.PROCESSING, "charge_payment")
        for i in range(10)
    ]
    outcome, printed, clock = await run_watch([stuck], timeline, timeout=5.0)
    assert outcome.status == smoke.EXIT_TIMEOUT
    assert clock.sleeps == [2.0, 2.0, 1.0], "never sleeps past the timeout"
    report = printed.split("\n", 1)[1]
    assert "order smoke-1 did not reach Processed within 5 s." in report
    assert "state:        Processing" in report
    assert "current step: charge_payment (do)" in report
    assert "attempt:      2 (failures so far: 1)" in report
    assert "LockedBy:     scheduler@h.1.ab" in report
    assert "CompleteBy:   2025-03-01T12:04:00Z (60 s ago)" in report
    assert "LastError:    payment: 503 Service Unavailable retrying" in report
    assert "reserve_inventory:Succeeded(gen 1, attempt 1)" in report
    assert "charge_payment:Running(gen 1, attempt 1)" in report
    assert "create_shipment:Pending(gen 0, attempt 0)" in report
    assert "last 8 of 10 timeline rows:" in report
    assert "#9 12:00:09 claimed" in report and "#1 " not in report
    assert "Pending -> Processing step=charge_payment attempt=1" in report
    assert "hint: A step is out with its agent" in report


async def test_a_step_moving_on_is_printed_and_a_waiting_order_says_when_its_retry_is_due():
    running = record(
        ProcessState.PROCESSING,
        attempt=1,
        locked_by="scheduler@h.1.ab",
        steps=steps(StepState.RUNNING),
    )
    released = record(
        ProcessState.PENDING,
        attempt=1,
        failure_count=1,
        next_attempt_at=T0 + timedelta(minutes=6),
        last_error="inventory: 503",
        steps=steps(StepState.RUNNING),
    )
    late = dataclasses.replace(released, steps=steps(StepState.SUCCEEDED))
    outcome, printed, _ = await run_watch([running, released, late], timeout=5.0)
    assert outcome.status == smoke.EXIT_TIMEOUT
    lines = printed.splitlines()
    assert "steps=reserve_inventory:Running,charge_payment:Pending" in lines[0]
    assert "retry_due=12:06:00" in lines[1]
    assert "steps=reserve_inventory:Succeeded" in lines[2], "a step's state alone is a change"
    assert "retry due:    2025-03-01T12:06:00Z (60 s from now)" in printed
    assert "hint: A step failed for now" in printed


async def test_watch_reports_an_order_that_never_arrived():
    outcome, printed, _ = await run_watch([None], timeout=3.0)
    assert outcome.status == smoke.EXIT_TIMEOUT
    assert "no process record in the orders table" in printed
    assert "hint: The order never reached the state store" in printed


async def test_watch_stops_at_error_with_the_report():
    failed = record(ProcessState.ERROR, failure_count=3, last_error="declined")
    timeline = [entry(0, "failed", ProcessState.COMPENSATING, ProcessState.ERROR)]
    outcome, printed, clock = await run_watch([record(ProcessState.PENDING), failed], timeline)
    assert outcome.status == smoke.EXIT_ERROR
    assert "order smoke-1 ended in Error after 2 s." in printed
    assert "LastError:    declined" in printed
    assert "Compensating -> Error" in printed
    assert "OperatorAlert" in printed
    assert clock.t == 2.0


def test_stuck_report_truncates_long_errors():
    snapshot = smoke.Snapshot.of(record(ProcessState.PENDING, last_error="x" * 2000))
    report = smoke.format_stuck_report("o", snapshot, [], waited=1, now=T0)
    (line,) = [line for line in report.splitlines() if "LastError" in line]
    assert len(line) < 600 and line.endswith("...")
    assert "no timeline rows" in report


class _Denied(Exception):
    pass


async def test_a_refusal_while_roles_propagate_is_retried_until_they_apply():
    calls, clock, out = [], [0.0], io.StringIO()

    async def action() -> str:
        calls.append(clock[0])
        if len(calls) < 3:
            raise _Denied("403")
        return "sent"

    async def sleep(seconds: float) -> None:
        clock[0] += seconds

    result = await smoke.until_roles_apply(
        action,
        lambda exc: isinstance(exc, _Denied),
        timeout=600,
        out=out,
        monotonic=lambda: clock[0],
        sleep=sleep,
    )
    assert result == "sent" and calls == [0.0, 15.0, 30.0]
    assert out.getvalue().count("role assignments not in effect yet?") == 2


async def test_a_refusal_past_the_roles_timeout_or_another_error_is_raised():
    clock = [0.0]

    async def denied_forever() -> None:
        raise _Denied("403")

    async def sleep(seconds: float) -> None:
        clock[0] += seconds

    async def bad() -> None:
        raise ValueError("bad")

    with pytest.raises(_Denied):
        await smoke.until_roles_apply(
            denied_forever,
            lambda exc: isinstance(exc, _Denied),
            timeout=40,
            out=io.StringIO(),
            monotonic=lambda: clock[0],
            sleep=sleep,
        )
    assert clock[0] == 40  # 15 + 15 + the 10 s left, then no more
    with pytest.raises(ValueError):
        await smoke.until_roles_apply(
            bad,
            lambda exc: isinstance(exc, _Denied),
            timeout=600,
            out=io.StringIO(),
        )
