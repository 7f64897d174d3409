"""`orderctl`'s operator workflows: bulk actions with a dry run and a confirmation, restart,
following an order, dead-letter replay and purge, faults, health; refusals are one line.

Each command runs its own event loop (``asyncio.run`` at its edge): a test that awaits too (an
in-memory store to put in place or look at) runs the command on a thread of its own."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from devstack.fakes.remote_services import FakeServices
from devstack.stack.local_stack import STATE_FILE
from orderctl import cli
from orderctl.app import fail
from orderctl.options import OPERATOR
from orderctl.output import validate
from orderctl.plain_text import join_url
from service.operations.errors import OperatorError
from service.operations.models import HealthView
from tests.unit.cli_views import Ops, fake_running_stack, use_ops

runner = CliRunner()


def invoke(*args: str, input: str | None = None):
    return runner.invoke(cli.app, list(args), input=input, catch_exceptions=False)


async def invoke_beside(*args: str, input: str | None = None):
    """:func:`invoke` from an async test: the command's event loop on a thread of its own."""
    return await asyncio.to_thread(invoke, *args, input=input)


class Recording(Ops):
    """The views of cli_views.Ops, and the calls made."""

    def __init__(self, s: str = "text") -> None:
        super().__init__(s)
        self.calls: list[tuple[str, dict]] = []

    async def bulk(self, action, **options):
        self.calls.append((action, options))
        return await super().bulk(action, **options)

    async def replay_dead_letters(self, queue, **options):
        self.calls.append(("replay", options))
        return await super().replay_dead_letters(queue, **options)

    async def purge_dead_letters(self, queue, **options):
        self.calls.append(("purge", options))
        return await super().purge_dead_letters(queue, **options)

    async def list_alerts(self, *, limit, open_only=False):
        self.calls.append(("alerts", {"open_only": open_only}))
        return await super().list_alerts(limit=limit, open_only=open_only)


def answering(view):
    """An operation that answers ``view``, whatever it is asked."""

    async def operation(*args, **options):
        return view

    return operation


@pytest.fixture
def recording(monkeypatch) -> Recording:
    ops = Recording()

    @asynccontextmanager
    async def operations(workdir):
        try:
            yield ops
        except OperatorError as error:
            raise fail(f"{error.message} ({error.code})", 2) from None

    monkeypatch.setattr("orderctl.connection.operations", operations)
    monkeypatch.setattr("orderctl.app.console", Console(width=200))
    return ops


# -------------------------------------------------------------------------------- bulk


def test_a_bulk_action_lists_first_and_acts_only_once_confirmed(recording):
    args = ["resubmit", "--state", "Error", "--text", "declined", "--reason", "restocked"]
    refused = invoke(*args, input="n\n")
    assert refused.exit_code == 1
    assert "would_resubmit" in refused.stdout and "resubmit these 1 order(s)?" in refused.stderr
    assert refused.stderr.strip().endswith(
        "error: not confirmed: nothing was done (--yes acts without asking)"
    )
    assert [options["dry_run"] for _, options in recording.calls] == [True]

    recording.calls.clear()
    agreed = invoke(*args, input="y\n")
    assert agreed.exit_code == 0, agreed.output
    (_, preview), (_, done) = recording.calls
    assert preview["dry_run"] and preview["text"] == "declined"
    assert done.get("dry_run", False) is False
    assert done["order_ids"] == ["order-7"], "exactly the orders listed"


def test_yes_acts_without_asking_and_json_prints_one_document(recording):
    result = invoke("cancel", "--older-than", "1h", "--reason", "stuck", "--yes", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    validate("cancel", document)
    assert document["action"] == "cancel" and not document["dry_run"]
    assert [options.get("dry_run", False) for _, options in recording.calls] == [True, False]


def test_a_dry_run_only_lists(recording):
    result = invoke("resubmit", "--step", "charge_payment", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["dry_run"] is True
    assert len(recording.calls) == 1


def test_an_order_id_and_a_filter_together_are_refused(recording):
    result = invoke("resubmit", "order-7", "--state", "Error", "--reason", "r")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --state select orders by filter: give either an order id or a filter"
    )
    assert recording.calls == []


def test_an_empty_filter_is_refused_before_anything_is_read(monkeypatch):
    store = _memory(monkeypatch)
    result = invoke("resubmit", "--reason", "r")
    assert result.exit_code == 2
    assert "say which orders: a state, step, age or text filter" in result.stderr
    assert store.orders() == []


@pytest.mark.anyio
async def test_a_filter_matching_nothing_says_so_and_asks_nothing(recording, monkeypatch):
    empty = await Ops.bulk(recording, "resubmit", dry_run=True, operator="x", reason="", limit=1)
    nothing = empty.model_copy(update={"items": [], "more": False})
    monkeypatch.setattr(recording, "bulk", answering(nothing))
    result = await invoke_beside("resubmit", "--step", "charge_payment", "--reason", "r", input="")
    assert result.exit_code == 0, result.output
    assert "no Error order matches: nothing to resubmit" in result.stdout
    assert "?" not in result.stderr, "nothing to confirm"


# ------------------------------------------------------------------------------ restart


def _memory(monkeypatch):
    from adapters.settings import Settings
    from devstack.memory import MemoryBus, MemoryStore
    from orderctl.local import LocalOperations
    from service.runtime import Runtime
    from tests.integration.test_state_store import T0, Clock
    from tests.support.app import EXAMPLE_SETTINGS

    clock = Clock(T0)
    store = MemoryStore(clock)
    settings = Settings.from_env(EXAMPLE_SETTINGS)
    rt = Runtime(
        settings=settings,
        store=store,  # type: ignore[arg-type]
        bus=MemoryBus(),  # type: ignore[arg-type]
        workflows=settings.workflows(),
        clock=clock,
        _status_bus=MemoryBus(),  # type: ignore[arg-type]
    )

    @asynccontextmanager
    async def operations(workdir):
        try:
            yield LocalOperations(rt)
        except OperatorError as error:
            raise fail(f"{error.message} ({error.code})", 2) from None

    monkeypatch.setattr("orderctl.connection.operations", operations)
    monkeypatch.setattr("orderctl.app.console", Console(width=200))
    store.clock = clock  # type: ignore[attr-defined]
    return store


@pytest.mark.anyio
async def test_restart_from_a_step_is_recorded_with_the_operator(monkeypatch):
    from tests.integration.test_state_store import to_error, to_processed

    store = _memory(monkeypatch)
    await to_error(store, store.clock, "o-1")  # type: ignore[attr-defined]
    args = ["restart", "o-1", "--from", "charge_payment", "--reason", "card updated"]
    result = await invoke_beside(*args, "--operator", "ann")
    assert result.exit_code == 0, result.output
    assert "o-1: restarted (Processing)" in result.stdout
    assert "restart from charge_payment" in result.stdout
    last = (await store.get_timeline("o-1"))[-1]
    assert (last.event, last.actor) == ("restarted", "operator:ann")

    unknown = await invoke_beside("restart", "o-1", "--from", "teleport", "--reason", "r")
    assert unknown.exit_code == 2
    assert "has no step 'teleport'" in unknown.stderr and "(unknown_step)" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1

    await to_processed(store, store.clock, "o-2")  # type: ignore[attr-defined]
    done = await invoke_beside("restart", "o-2", "--from", "reserve_inventory", "--reason", "r")
    assert done.exit_code == 2
    assert "only Error orders can be restarted (wrong_state)" in done.stderr

    missing = await invoke_beside("restart", "o-3", "--from", "reserve_inventory", "--reason", "r")
    assert missing.exit_code == 2 and "order o-3 does not exist" in missing.stderr


def test_status_shows_step_durations_failures_and_reasons(monkeypatch):
    use_ops(monkeypatch, "why it failed", width=250)
    result = invoke("status", "order-7")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.startswith("│ charge_payment"))
    cells = [cell.strip() for cell in row.strip("│").split("│")]
    assert cells[:6] == ["charge_payment", "Failed", "2", "3", "2", "1.50 s"]
    assert "  charge_payment: why it failed" in result.stdout
    wide = invoke("status", "order-7", "--wide")
    row = next(line for line in wide.stdout.splitlines() if line.startswith("│ charge_payment"))
    cells = [cell.strip() for cell in row.strip("│").split("│")]
    assert cells[6:10] == ["1", "12:00:00", "12:00:00", ""], "deferred, started, done, undone"


def test_status_says_which_steps_an_ended_order_still_settles(monkeypatch):
    use_ops(monkeypatch, "charge_payment", width=200)
    result = invoke("status", "order-7")
    assert result.exit_code == 0, result.output
    assert "settling: an answer may still change charge_payment" in result.stdout


# ---------------------------------------------------------------------------- following


def test_status_watch_prints_one_document_per_change_and_exits_by_the_end_state(monkeypatch):
    use_ops(monkeypatch, "x")
    result = invoke("status", "order-7", "--watch", "--json")
    assert result.exit_code == 3, "the order ended in Error"
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    document = json.loads(lines[0])
    validate("status", document)
    assert document["terminal"] is True and document["detail"]["order"]["state"] == "Error"


def test_status_watch_for_people_shows_the_order_then_how_it_ended(monkeypatch):
    use_ops(monkeypatch, "x", width=200)
    result = invoke("status", "order-7", "--watch")
    assert result.exit_code == 3
    assert "following it (Ctrl-C stops)" in result.stdout
    assert result.stdout.rstrip().splitlines()[-1].startswith("└")  # the steps table last
    assert "order-7: Error" in result.stdout


def test_submit_wait_returns_when_the_order_is_done(monkeypatch, tmp_path):
    from devstack import orders

    fake_running_stack(tmp_path)
    use_ops(monkeypatch, "x")

    async def send_orders(settings, batch):
        return len(batch)

    monkeypatch.setattr(orders, "send_orders", send_orders)
    result = invoke("submit", "--order-id", "order-7", "--wait", "--timeout", "5", "--json",
                    "--workdir", str(tmp_path))  # fmt: skip
    assert result.exit_code == 3
    document = json.loads(result.stdout)
    validate("submit", document)
    assert document["state"] == "Error" and document["order"]["order"]["order_id"] == "order-7"
    assert document["waited_s"] is not None


# ------------------------------------------------------------------------- dead letters


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["replay"], "say which queue: dead-letters replay QUEUE"),
        (["purge", "orders", "one"], "dead letters are named by sequence number"),
        (["orders", "extra"], "to act on dead letters: dead-letters replay|purge QUEUE"),
        (["orders", "--all"], "to act on dead letters"),
    ],
)
def test_dead_letter_commands_say_how_to_write_them(recording, args, message):
    result = invoke("dead-letters", *args)
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert recording.calls == []


def test_a_replay_says_what_it_would_do_then_asks(recording):
    refused = invoke("dead-letters", "replay", "orders", "--all", input="n\n")
    assert refused.exit_code == 1 and "not confirmed" in refused.stderr
    assert [(kind, o["dry_run"]) for kind, o in recording.calls] == [("replay", True)]
    assert "would_replay" in refused.stdout

    recording.calls.clear()
    done = invoke("dead-letters", "purge", "orders", "1", "--yes", "--json", "--reason", "not JSON")
    assert done.exit_code == 0, done.output
    validate("dead-letters", json.loads(done.stdout))
    (_, preview), (_, acted) = recording.calls
    assert preview["sequence_numbers"] == [1] and preview["dry_run"] is True
    assert acted == {"operator": OPERATOR, "sequence_numbers": [1], "reason": "not JSON"}


# -------------------------------------------------------------------- alerts and health


def test_alerts_open_lists_only_unresolved_ones(recording):
    result = invoke("alerts", "--open")
    assert result.exit_code == 0, result.output
    assert recording.calls == [("alerts", {"open_only": True})]
    assert "open alerts" in result.stdout and "retrying" in result.stdout


def test_health_exits_1_when_a_check_fails(monkeypatch):
    class Failing(Ops):
        async def health(self) -> HealthView:
            return HealthView.model_validate(
                {"status": "failing", "checks": [
                    {"name": "servicebus", "ok": False, "detail": "down", "duration_ms": 3}]}
            )  # fmt: skip

    @asynccontextmanager
    async def operations(workdir):
        yield Failing("x")

    monkeypatch.setattr("orderctl.connection.operations", operations)
    result = invoke("health")
    assert result.exit_code == 1 and "NO" in result.stdout and "failing" in result.stdout


# ------------------------------------------------------------------------------- faults


@pytest.fixture
def stack_with_fakes(tmp_path):
    fake_running_stack(tmp_path)
    with FakeServices.start() as fakes:
        path = Path(tmp_path) / STATE_FILE
        document = json.loads(path.read_text())
        path.write_text(json.dumps(document | {"fakes_url": fakes.base_url + "/"}))
        yield tmp_path, fakes


def test_fault_shows_and_chooses_the_profile_and_declines_the_next_payments(stack_with_fakes):
    workdir, fakes = stack_with_fakes
    where = ["--workdir", str(workdir)]
    shown = invoke("fault", *where)
    assert shown.exit_code == 0, shown.output
    assert "fault profile in force: clean" in shown.stdout
    assert "//_fault" not in shown.stdout

    chosen = invoke("fault", "flaky", "--json", *where)
    assert chosen.exit_code == 0, chosen.output
    document = json.loads(chosen.stdout)
    validate("fault", document)
    assert (document["source"], document["changed"]) == ("flaky", True)
    assert fakes.engine.profile.description.startswith("Flaky")

    declined = invoke("fault", "--decline-next", "2", *where)
    assert declined.exit_code == 0, declined.output
    assert "payment: the next 2 forward call(s) will be declined" in declined.stdout
    assert fakes.engine.declines_pending() == {"payment": 2}
    assert fakes.engine.source == "flaky", "declining leaves the profile alone"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["apocalyptic"], "no example profile 'apocalyptic'"),
        (["--decline-next", "1", "--service", "bank"], "--service 'bank'"),
    ],
)
def test_a_bad_fault_is_refused_in_one_line(stack_with_fakes, args, message):
    workdir, fakes = stack_with_fakes
    result = invoke("fault", *args, "--workdir", str(workdir))
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert fakes.engine.source == "clean"


def test_fault_without_a_stack_says_how_to_start_one(tmp_path):
    result = invoke("fault", "--workdir", str(tmp_path))
    assert result.exit_code == 2 and "orderctl up --detach" in result.stderr


# -------------------------------------------------------------------------------- urls


@pytest.mark.parametrize(
    ("base", "parts", "joined"),
    [
        ("http://h:1/api/", ("openapi.json",), "http://h:1/api/openapi.json"),
        ("http://h:1/api", ("/openapi.json",), "http://h:1/api/openapi.json"),
        ("http://h:1/", ("/_fault",), "http://h:1/_fault"),
        ("http://h:1", ("payment/", "/charge"), "http://h:1/payment/charge"),
        ("http://h:1/api/", ("orders/",), "http://h:1/api/orders/"),
    ],
)
def test_urls_are_joined_with_one_slash(base, parts, joined):
    assert join_url(base, *parts) == joined


def test_ps_prints_no_double_slash_in_urls(tmp_path):
    fake_running_stack(tmp_path)
    result = invoke("ps", "--wide", "--workdir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "http://127.0.0.1:7071/api/openapi.json" in result.stdout
    assert "//" not in result.stdout.replace("http://", "")


def test_fault_prints_a_hostile_profile_description_as_text(stack_with_fakes, monkeypatch):
    from devstack.fakes.profiles import Profile
    from orderctl.plain_text import printable
    from tests.unit.test_cli_hostile_text import HOSTILE

    workdir, fakes = stack_with_fakes
    fakes.engine.set_profile(Profile(description=HOSTILE), source="[red]x[/red] :smile:")
    monkeypatch.setattr("orderctl.app.console", Console(width=1_000_000))
    result = invoke("fault", "--workdir", str(workdir))
    assert result.exit_code == 0, result.output[:500]
    assert printable(HOSTILE) in result.stdout and "[red]x[/red] :smile:" in result.stdout
    assert "\x1b" not in result.stdout and "😄" not in result.stdout
    document = json.loads(invoke("fault", "--json", "--workdir", str(workdir)).stdout)
    assert document["description"] == HOSTILE


@pytest.mark.anyio
async def test_an_empty_dead_letter_queue_has_nothing_to_replay_and_asks_nothing(
    recording, monkeypatch
):
    empty = await Ops.replay_dead_letters(recording, "orders", dry_run=True)
    nothing = empty.model_copy(update={"items": []})
    monkeypatch.setattr(recording, "replay_dead_letters", answering(nothing))
    result = await invoke_beside("dead-letters", "replay", "orders", "--all", input="")
    assert result.exit_code == 0, result.output
    assert "no dead letters in text: nothing to replay" in result.stdout
    assert "?" not in result.stderr


# --------------------------------------------------------------------- dead-letter log


def test_the_dead_letter_log_shows_stored_text_as_text(monkeypatch):
    stored = "[bold red]drop[/] :smile: esc\x1b[31m"
    use_ops(monkeypatch, stored, width=400)
    result = invoke("dead-letter-log", "--wide")
    assert result.exit_code == 0, result.output
    assert "[bold red]drop[/] :smile: esc\\x1b[31m" in result.stdout  # the reason, as written
    assert "\x1b" not in result.stdout
    assert "1 purged, 1 refused" in result.stdout and "2+" in result.stdout
    assert "outcomes are cut" in result.stdout


def test_the_dead_letter_log_asks_for_the_limit_and_says_when_it_is_empty(monkeypatch):
    asked: list[int] = []

    class Empty(Ops):
        async def dead_letter_log(self, *, limit):
            asked.append(limit)
            logged = await super().dead_letter_log(limit=limit)
            return logged.model_copy(update={"actions": []})

    @asynccontextmanager
    async def operations(workdir):
        yield Empty("x")

    monkeypatch.setattr("orderctl.connection.operations", operations)
    result = invoke("dead-letter-log", "--limit", "7")
    assert result.exit_code == 0, result.output
    assert asked == [7] and "no dead-letter replay or purge is recorded" in result.stdout
    refused = invoke("dead-letter-log", "--limit", "101")
    assert refused.exit_code == 2 and asked == [7]
