"""The demo's screen and its manners: a summary table of its own (no empty header row), a
progress bar with an ETA on long runs, and a running stack's faults never changed behind the
user's back (said, then set back)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from devstack.fakes.profiles import example_profile
from devstack.fakes.remote_services import FakeServices
from devstack.stack.local_stack import STATE_FILE, StackInfo
from orderctl import demo
from orderctl.demo import Demo, Progress, Summary
from tests.unit.cli_views import fake_running_stack

pytestmark = pytest.mark.anyio


def recording() -> Console:
    return Console(record=True, width=200, force_terminal=False)


def make_demo(workdir: Path, profile: str | None, console: Console) -> Demo:
    return Demo(
        orders=4, profile=profile, workflow="order", hosts=1, concurrency=None, timeout=5,
        quick=True, workdir=workdir, console=console,
    )  # fmt: skip


def test_the_summary_is_a_table_without_an_empty_header_row():
    console = recording()
    summary = Summary(orders=4, profile="chaotic", workflow="order", hosts=1, processed=3,
                      errors=1, errors_with_one_terminal_alert=1)  # fmt: skip
    summary.examples = {"undo_without_do": ["[bold]payment[/]: undo of k"]}
    make_demo(Path("."), None, console)._show(summary)
    shown = console.export_text()
    lines = shown.splitlines()
    assert lines[0].strip() == "summary"
    assert lines[1].startswith("┌") and "processed" in lines[2], "the first row is data"
    assert "[bold]payment[/]: undo of k" in shown, "never markup"


def test_long_runs_show_a_progress_bar_with_the_time_left():
    long = Progress(orders=200, bar=True)
    long.states[demo.ProcessState.PROCESSED] = 50
    long.elapsed = 10
    console = recording()
    console.print(long.render())
    shown = console.export_text()
    assert "finished" in shown and "50/200" in shown and "25%" in shown and "left" in shown
    short = recording()
    short.print(Progress(orders=10).render())
    plain = short.export_text()
    assert "finished" not in plain and "not started" in plain


def noting(seen: list[str], fakes: FakeServices):
    """A demo run that notes the fault profile in force while it runs."""

    async def run(self: Demo, info: StackInfo) -> Summary:
        seen.append(fakes.engine.source)
        return Summary(orders=4, profile=self.profile, workflow="order", hosts=1)

    return run


@pytest.fixture
def running_stack(tmp_path):
    fake_running_stack(tmp_path)
    with FakeServices.start(example_profile("flaky")) as fakes:
        fakes.engine.set_profile(fakes.engine.profile, "flaky")
        path = tmp_path / STATE_FILE
        document = json.loads(path.read_text())
        path.write_text(json.dumps(document | {"fakes_url": fakes.base_url}))
        yield tmp_path, fakes


async def test_on_a_running_stack_the_demo_keeps_its_profile_and_says_which(
    running_stack, monkeypatch
):
    workdir, fakes = running_stack
    seen: list[str] = []
    monkeypatch.setattr(Demo, "_run", noting(seen, fakes))
    console = recording()
    summary = await make_demo(workdir, None, console).run()
    assert seen == ["flaky"] and summary.profile == "flaky"
    assert fakes.engine.source == "flaky"
    assert "fault profile: flaky, the running stack's own (unchanged)" in console.export_text()


async def test_a_profile_asked_for_is_said_loudly_and_set_back_afterwards(
    running_stack, monkeypatch
):
    workdir, fakes = running_stack
    seen: list[str] = []
    monkeypatch.setattr(Demo, "_run", noting(seen, fakes))
    console = recording()
    await make_demo(workdir, "chaotic", console).run()
    assert seen == ["chaotic"], "the demo ran under the profile asked for"
    assert fakes.engine.source == "flaky", "and set the previous one back"
    shown = console.export_text()
    assert "setting the running stack's fault profile to chaotic for this demo" in shown
    assert "(it is flaky now; set back when the demo ends)" in shown
    assert "fault profile set back to flaky" in shown


async def test_the_operator_scene_says_it_sets_the_clean_profile_and_it_is_set_back(
    running_stack, monkeypatch
):
    workdir, fakes = running_stack
    during = []

    class Store:
        async def load(self, order_id):
            return SimpleNamespace(state=demo.ProcessState.PROCESSED)

        async def get_timeline(self, order_id):
            return [SimpleNamespace(event="resubmitted")]

    class Runtime:
        store = Store()

        @classmethod
        def from_settings(cls, settings, store_type):
            return cls()

        async def close(self):
            pass

    class LocalOperations:
        def __init__(self, runtime):
            pass

        async def resubmit(self, order_id, **_):
            during.append(fakes.engine.source)
            return SimpleNamespace(outcome="resubmitted")

        async def close(self):
            pass

    import orderctl.local
    import service.runtime

    monkeypatch.setattr(service.runtime, "Runtime", Runtime)
    monkeypatch.setattr(orderctl.local, "LocalOperations", LocalOperations)

    async def run(self, info):
        await self._operator_resubmits(info, "demo-1-00002")
        return Summary(orders=4, profile=self.profile, workflow="order", hosts=1)

    monkeypatch.setattr(Demo, "_run", run)
    console = recording()
    await make_demo(workdir, None, console).run()
    assert during == ["clean"] and fakes.engine.source == "flaky"
    shown = console.export_text()
    assert "fault profile set to clean until the demo ends" in shown
    assert "fault profile set back to flaky" in shown
    assert StackInfo.load(workdir) is not None
