"""Fixtures of the browser tests: both apps (the pattern app and the operations app, which serves
the dashboard and the operator API) in one local host serving HTTP, against Azurite,
a broker of its own and the fake remote services, with a scenario of orders in it, and
Chromium driven by Playwright.

Chromium is Debian's ``chromium`` package (scripts/bootstrap installs it when run as root), not
a browser Playwright downloads: without it the browser tests are skipped, saying why.
Screenshots go to ``test-artifacts/screenshots/`` (``BROWSER_ARTIFACTS``: another folder).

The scenario (:class:`Scenario`), made once per module (per pytest-xdist worker that runs a
test of it): each test that changes something changes its own order, and the others count
what is there when they run, so the tests pass in any order and on any worker.

- ``processed``: orders that went straight through;
- ``retried``: one order whose shipping call hung past its run budget: released, retried by the
  Scheduler after a delay, then Processed; submitted with a ``traceparent`` (:data:`SUBMITTER`),
  so it records a trace id;
- ``declined_first``: declined by inventory, nothing to undo: Error (a test resubmits it);
- ``compensated`` and ``to_acknowledge``: declined by payment after inventory succeeded: the
  reservation is undone, then Error (a test acknowledges the alert of the second);
- two dead letters on the orders queue: a submission and a body that is not JSON (carrying
  markup, which the page must show as text).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from opentelemetry import trace

from devstack.fakes.remote_services import FakeServices
from devstack.host import LocalHost
from devstack.stack.processes import REPO_ROOT
from domain.messages import encode
from domain.states import ProcessState
from service.runtime import Runtime
from tests.support import broker as broker_support
from tests.support.app import app_settings, make_runtime, operations_app, pattern_app
from tests.support.broker import ServiceBusNamespace
from tests.support.names import unique_name
from tests.support.pattern import new_order

OPERATOR = "ops@example.com"
ARTIFACTS = Path(os.environ.get("BROWSER_ARTIFACTS") or REPO_ROOT / "test-artifacts")
SCREENSHOTS = ARTIFACTS / "screenshots"
TERMINAL = (ProcessState.PROCESSED, ProcessState.ERROR)
SUBMITTER = trace.SpanContext(
    0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=True,
    trace_flags=trace.TraceFlags(1),
)  # fmt: skip
"""The trace context the ``retried`` order is submitted with (a submitter that traces)."""
HOSTILE_MARKUP = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
T = TypeVar("T")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "browser: drives Chromium through the dashboard (select with -m browser)"
    )


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """A Chromium browser (Playwright), or the tests are skipped with the reason.

    Per module, not per session: while Playwright's sync API runs, its event loop is the
    running loop of the main thread, and any later test in the same worker that calls
    ``asyncio.run`` (the async contract tests) would fail."""
    path = chromium_path()
    if path is None:
        pytest.skip(
            "Chromium is not installed: `apt-get install -y chromium` (scripts/bootstrap does it "
            "when run as root or with sudo)"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: run scripts/bootstrap (requirements-dev.txt)")
    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(executable_path=path)
    except Exception as error:
        playwright.stop()
        pytest.skip(f"Chromium at {path} does not start under Playwright: {error}")
    try:
        yield browser
    finally:
        browser.close()
        playwright.stop()


# ------------------------------------------------------------------------------- the stack


class LoopThread:
    """An event loop on a thread of its own, where the tests' Runtime lives and its reads run.

    The tests are sync: Playwright's sync API holds the main thread's running loop, and the
    app's functions run on the local host's loop. A Runtime's clients belong to the loop that
    opened them, so the tests' Runtime keeps to this one."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="browser-tests-loop", daemon=True
        )
        self._thread.start()

    def run(self, awaitable: Awaitable[T], timeout: float = 60.0) -> T:
        """Await ``awaitable`` on this loop (in the caller's context: its current span too)."""

        async def awaited() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(awaited(), self._loop).result(timeout)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@dataclass
class Scenario:
    processed: list[str] = field(default_factory=list)
    retried: str = ""
    declined_first: str = ""
    compensated: str = ""
    to_acknowledge: str = ""
    dead_letters: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        return [self.declined_first, self.compensated, self.to_acknowledge]

    @property
    def orders(self) -> list[str]:
        return [*self.processed, self.retried, *self.errors]


@dataclass
class Stack:
    rt: Runtime
    """The tests' own Runtime (on ``loop``; the host's functions have theirs)."""
    loop: LoopThread
    host: LocalHost
    fakes: FakeServices
    namespace: ServiceBusNamespace
    scenario: Scenario

    def run(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` (a call of ``rt``) on the tests' loop."""
        return self.loop.run(awaitable)

    @property
    def url(self) -> str:
        assert self.host.http is not None
        return self.host.http.base_url  # http://127.0.0.1:<port>/api/

    @property
    def dashboard(self) -> str:
        return self.url + "dashboard"

    def state(self, order_id: str) -> ProcessState | None:
        order = self.run(self.rt.store.find(order_id))
        return None if order is None else order.state

    def count(self, state: ProcessState) -> int:
        """Orders of the scenario now in ``state`` (tests in one process may have moved some)."""
        return sum(1 for o in self.scenario.orders if self.state(o) is state)


@pytest.fixture(scope="module")
def stack(azurite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Both apps in one local host (every function, HTTP served) with the scenario in it: one
    host, so that both run on one event loop, where their composition roots' Runtimes live."""
    workdir = tmp_path_factory.mktemp("browser-broker")
    namespace = broker_support.start_local_namespace([broker_support.DEFAULT_CONFIG], workdir)
    fakes = FakeServices.start()
    env = app_settings(namespace, azurite.connection_string, fakes.url, unique_name("b"))
    env["DEVHOST_PRINCIPAL_NAME"] = OPERATOR
    # A request may wait 60 s for its agent (receivers starting with the host), then has 15 s to
    # run: the hung call of the retried order outruns that, no other call does, even on a loaded
    # machine (an unplanned retry would change what the tests count).
    env["STEP_QUEUE_SECONDS"] = "60"
    env["STEP_TIMEOUT_SECONDS"] = "15"
    loop = LoopThread()
    rt = loop.run(make_runtime(env, "browser"))
    scenario = Scenario()
    _dead_letters(namespace, scenario)
    pattern, pattern_root = pattern_app(rt)
    operations, operations_root = operations_app(rt)
    host = LocalHost([pattern, operations], settings=env, host_json="host.json", http_port=0)
    host.at_stop(operations_root.close)
    host.at_stop(pattern_root.close)
    host.start()
    stack = Stack(rt, loop, host, fakes, namespace, scenario)
    try:
        # The overview reads alerts and dead letters in the background (a Service Bus peek per
        # queue, a second each on the development broker): start that while the scenario runs.
        api(stack, "dashboard/summary")
        _run_scenario(stack)
        yield stack
    finally:
        host.stop(timeout=30)
        loop.run(rt.close())
        loop.close()
        fakes.stop()
        assert namespace.broker is not None
        namespace.broker.stop()


def _dead_letters(namespace: ServiceBusNamespace, scenario: Scenario) -> None:
    """Two dead letters on the orders queue, made before any function reads it."""
    queue = namespace.queue("orders")
    submission = new_order()
    scenario.dead_letters = [submission.order_id, "not-json"]
    with ServiceBusClient.from_connection_string(namespace.connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(
                [
                    ServiceBusMessage(encode(submission), message_id=submission.order_id),
                    ServiceBusMessage(
                        b"{not json " + HOSTILE_MARKUP.encode(),
                        message_id=f"bad-{uuid.uuid4().hex[:8]}",
                        subject=HOSTILE_MARKUP,
                    ),
                ]
            )
        with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
            taken = 0
            while taken < 2:
                for message in receiver.receive_messages(max_message_count=2, max_wait_time=5):
                    receiver.dead_letter_message(
                        message,
                        reason="MaxDeliveryCountExceeded",
                        error_description="delivered 10 times: the handler kept failing",
                    )
                    taken += 1


def _run_scenario(stack: Stack) -> None:
    rt, fakes, scenario = stack.rt, stack.fakes, stack.scenario
    declined_first, compensated, to_acknowledge = new_order(), new_order(), new_order()
    scenario.declined_first = declined_first.order_id
    scenario.compensated = compensated.order_id
    scenario.to_acknowledge = to_acknowledge.order_id
    fakes.set_profile(
        {
            "services": {
                "inventory": {"decline_order_ids": [declined_first.order_id]},
                "payment": {"decline_order_ids": [compensated.order_id, to_acknowledge.order_id]},
            }
        }
    )
    orders = [new_order() for _ in range(8)]
    scenario.processed = [o.order_id for o in orders]
    queue = rt.settings.queue("orders")
    for order in [*orders, declined_first, compensated, to_acknowledge]:
        stack.run(rt.bus.send(queue, order))
    _wait(stack, [*scenario.processed, *scenario.errors], 180)
    # The shipping call of one order hangs past its run budget: the agent reports it timed out,
    # the step is released and the Scheduler retries it after a delay, and the retry succeeds.
    fakes.set_profile({"services": {"shipping": {"hang_rate": 1.0, "hang_seconds": 45}}})
    retried = new_order()
    scenario.retried = retried.order_id
    with trace.use_span(trace.NonRecordingSpan(SUBMITTER)):
        stack.run(rt.bus.send(queue, retried))  # with a submitter's traceparent: a trace id
    _wait_for_event(stack, retried.order_id, "released", 90)
    fakes.set_profile(None)  # from now on every service is clean: a resubmit goes through
    _wait(stack, [retried.order_id], 90)
    expected = {o: ProcessState.PROCESSED for o in [*scenario.processed, retried.order_id]}
    expected |= dict.fromkeys(scenario.errors, ProcessState.ERROR)
    states = {o: stack.state(o) for o in expected}
    assert states == expected, f"the scenario did not end as planned: {states}"


def _wait_for_event(stack: Stack, order_id: str, event: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e.event == event for e in stack.run(stack.rt.store.get_timeline(order_id))):
            return
        time.sleep(0.2)
    raise AssertionError(f"{order_id}: no {event} within {timeout} s")


def _wait(stack: Stack, order_ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    left = set(order_ids)
    while left and time.monotonic() < deadline:
        left = {o for o in left if stack.state(o) not in TERMINAL}
        if left:
            time.sleep(0.2)
    assert not left, f"not finished after {timeout} s: {sorted(left)}"


# ------------------------------------------------------------------------------- the page


@dataclass
class PageProblems:
    console: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


@pytest.fixture
def page(chromium, stack) -> Iterator[Any]:
    """A fresh page (1440 x 900); fails the test on a script error, a console error (a blocked
    script or style included: the page's CSP) or a failed request."""
    context = chromium.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    problems = PageProblems()
    page.on(
        "console",
        lambda m: problems.console.append(m.text) if m.type == "error" else None,
    )
    page.on("pageerror", lambda e: problems.page_errors.append(str(e)))
    page.on(
        "requestfailed",
        lambda r: (
            problems.failed.append(f"{r.method} {r.url}: {r.failure}")
            if "net::ERR_ABORTED" not in (r.failure or "")
            else None
        ),
    )
    page.set_default_timeout(30_000)
    page.problems = problems  # type: ignore[attr-defined]
    try:
        yield page
    finally:
        context.close()
    assert not problems.page_errors, problems.page_errors
    assert not problems.console, problems.console
    assert not problems.failed, problems.failed


@pytest.fixture(scope="session")
def shoot() -> Callable[..., Path]:
    """``shoot(page, "overview")`` writes test-artifacts/screenshots/overview.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(page: Any, name: str, *, full_page: bool = True) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        return path

    return take


def api(stack: Stack, path: str) -> Any:
    """GET /api/<path> as JSON (what the page reads, for the tests' own checks)."""
    import httpx

    response = httpx.get(stack.url + path, timeout=60)  # a bound: a loaded machine is slow
    response.raise_for_status()
    return json.loads(response.content)
