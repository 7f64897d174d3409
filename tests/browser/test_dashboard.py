"""The dashboard in Chromium against the local stack: every view loads, orders filter, an
order's timeline shows its attempts, an Error order is resubmitted and finishes, an alert is
acknowledged, dead letters are replayed and purged (each action asking for a reason, recorded
on the order's timeline or in the dead-letter log), stored markup stays text, and an agent's
circuit opened through the fake services' fault control shows in the overview.

The tests share one stack and scenario per process (conftest.py). Each test that changes
something changes its own order; the others count what is there when they run, so they pass in
any order, and on any pytest-xdist worker.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import httpx
import pytest
from playwright.sync_api import Page, expect

from domain.messages import utc_now
from domain.states import ProcessState
from orderctl.local import LocalOperations
from service.agent import remote_client
from service.circuit import BreakerState
from tests.browser.conftest import HOSTILE_MARKUP, OPERATOR, SUBMITTER, Stack, api

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.timeout(400)]
expect.set_options(timeout=30_000)  # a loaded machine: a bound, not a target
SLOW = 60_000
"""For what waits on Service Bus peeks (a second per queue on the development broker) or on a
summary part's refresh period."""


def open_view(page: Page, stack: Stack, hash_: str) -> None:
    page.goto(f"{stack.dashboard}#/{hash_}")
    expect(page.get_by_test_id("principal")).to_have_text(OPERATOR)


def card(page: Page, name: str):
    return page.get_by_test_id(f"card-{name}").locator(".value")


def test_overview_shows_states_throughput_and_health(page: Page, stack: Stack, shoot):
    open_view(page, stack, "overview")
    expect(card(page, "Error")).to_have_text(str(stack.count(ProcessState.ERROR)), timeout=SLOW)
    processed = str(stack.count(ProcessState.PROCESSED))
    expect(card(page, "Processed")).to_have_text(processed, timeout=SLOW)
    expect(card(page, "in-flight")).to_have_text("0")
    open_alerts = len(api(stack, "alerts?open=true")["items"])
    expect(card(page, "alerts")).to_have_text(str(open_alerts), timeout=SLOW)
    dead = str(len(stack.scenario.dead_letters))
    expect(card(page, "dead-letters")).to_have_text(dead, timeout=SLOW)
    expect(card(page, "retries")).not_to_have_text("0")  # the retried order's extra request
    expect(card(page, "latency")).to_contain_text(" / ")
    for chart in ("chart-throughput", "chart-latency", "chart-history"):
        expect(page.get_by_test_id(chart).locator("canvas")).to_have_count(1)
    expect(page.get_by_test_id("circuits")).to_contain_text("circuit")
    circuits = page.get_by_test_id("circuit-row")
    expect(circuits).to_have_count(3, timeout=SLOW)  # one per agent of the catalog
    for agent in ("inventory", "payment", "shipping"):
        expect(page.locator(f'[data-testid=circuit-row][data-agent="{agent}"]')).to_be_visible()
    shoot(page, "overview")


def test_every_view_loads_from_the_navigation(page: Page, stack: Stack):
    open_view(page, stack, "overview")
    for view, ready in (
        ("Orders", "order-filters"),
        ("Alerts", "alerts-open-only"),
        ("Dead letters", "dead-letter-queues"),
        ("Supervisor", "supervisor-facts"),
        ("Overview", "cards"),
    ):
        page.get_by_role("navigation").get_by_role("link", name=view, exact=True).click()
        expect(page.get_by_test_id(ready)).to_be_visible(timeout=SLOW)
    with page.expect_popup() as popup:
        page.get_by_role("navigation").get_by_role("link", name="API", exact=True).click()
    expect(popup.value.get_by_test_id("swagger-ui")).to_contain_text("/orders/{order_id}/resubmit")


def test_orders_filter_by_state_text_and_step(page: Page, stack: Stack, shoot):
    open_view(page, stack, "orders?state=Processed")
    rows = page.get_by_test_id("order-row")
    expect(rows).to_have_count(stack.count(ProcessState.PROCESSED))
    page.get_by_test_id("filter-state").select_option("Error")
    page.get_by_test_id("apply-filters").click()
    expect(page).to_have_url(re.compile(r"#/orders\?state=Error$"))
    expect(rows).to_have_count(stack.count(ProcessState.ERROR))
    shoot(page, "orders")
    page.get_by_test_id("filter-text").fill(stack.scenario.compensated[-8:])
    page.get_by_test_id("apply-filters").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-order-id", stack.scenario.compensated)
    page.get_by_test_id("filter-text").fill("")
    page.get_by_test_id("filter-step").fill("reserve_inventory")
    page.get_by_test_id("apply-filters").click()
    # Compensated orders end at the step they undid last: the reservation.
    for row in rows.all():
        expect(row).to_contain_text("reserve_inventory")
    page.get_by_test_id("filter-step").fill("no_such_step")
    page.get_by_test_id("apply-filters").click()
    expect(page.locator(".notice.bad")).to_contain_text("no_such_step")
    page.problems.console.clear()  # the browser logs the refused filter's 400


def test_order_timeline_shows_attempts_retries_and_undo(page: Page, stack: Stack, shoot):
    open_view(page, stack, "orders?state=Error")
    page.locator(f'[data-order-id="{stack.scenario.compensated}"] a').click()
    expect(page.get_by_test_id("order-state")).to_have_text("Error")
    expect(page.locator("dl.facts")).to_contain_text("no: settled, only an operator changes it")
    bars = page.get_by_test_id("gantt-bar")
    # reserve_inventory (do), charge_payment (do, declined), then the undo of the reservation:
    # four entries (a retry the scenario did not plan would show here first, named).
    events = [t["event"] for t in api(stack, f"orders/{stack.scenario.compensated}")["timeline"]]
    assert len(events) == 4, events
    expect(bars).to_have_count(3)
    expect(page.locator('[data-testid=gantt-bar][data-kind="undo"]')).to_have_count(1)
    expect(page.locator('[data-testid=gantt-bar][data-outcome="declined"]')).to_have_attribute(
        "data-step", "charge_payment"
    )
    expect(page.get_by_test_id("timeline-row")).to_have_count(4)
    expect(page.get_by_test_id("step-row")).to_have_count(3)

    page.goto(f"{stack.dashboard}#/order/{stack.scenario.retried}")
    expect(page.get_by_test_id("order-state")).to_have_text("Processed")
    retry = page.locator('[data-testid=gantt-bar][data-outcome="retry"]')
    expect(retry).to_have_count(1)
    expect(retry).to_have_attribute("data-step", "create_shipment")
    expect(page.get_by_test_id("gantt-wait")).to_have_count(1)
    expect(page.locator('[data-testid=gantt-bar][data-outcome="succeeded"]')).to_have_count(3)
    expect(bars).to_have_count(4)
    expect(page.locator('[data-testid=timeline-row][data-event="released"]')).to_have_count(1)
    expect(page.get_by_test_id("step-row").nth(2)).to_contain_text("timed_out")
    expect(page.get_by_test_id("trace-hint")).to_contain_text(f"{SUBMITTER.trace_id:032x}")
    shoot(page, "order-timeline", full_page=False)  # the order, its timeline and steps


def test_resubmit_an_error_order_and_see_it_finish(page: Page, stack: Stack):
    order_id = stack.scenario.declined_first  # the stock has arrived: the services are clean
    open_view(page, stack, f"order/{order_id}")
    expect(page.get_by_test_id("order-state")).to_have_text("Error")
    page.get_by_test_id("resubmit").click()
    page.get_by_test_id("confirm").click()  # no reason yet: the dialog insists on one
    expect(page.get_by_test_id("reason")).to_be_focused()
    page.get_by_test_id("reason").fill("stock arrived <b>today</b>")
    page.get_by_test_id("confirm").click()
    expect(page.locator(".notice.ok")).to_contain_text("resubmitted")
    expect(page.get_by_test_id("order-state")).to_have_text("Processed", timeout=SLOW)
    resubmitted = page.locator('[data-testid=timeline-row][data-event="resubmitted"]')
    expect(resubmitted).to_contain_text(f"operator:{OPERATOR}")
    expect(resubmitted).to_contain_text("stock arrived <b>today</b>")  # text, not markup
    expect(page.locator('[data-testid=gantt-bar][data-outcome="succeeded"]')).to_have_count(3)
    expect(page.locator('[data-testid=gantt-marker][data-kind="operator"]')).to_have_count(1)
    assert stack.state(order_id) is ProcessState.PROCESSED


def test_acknowledge_an_alert(page: Page, stack: Stack, shoot):
    order_id = stack.scenario.to_acknowledge
    open_view(page, stack, "alerts?open=false")
    rows = page.get_by_test_id("alert-row")
    listed = api(stack, "alerts?open=false")["items"]
    expect(rows).to_have_count(len(listed), timeout=SLOW)
    for alert in listed:
        row = page.locator(f'[data-testid=alert-row][data-sequence="{alert["sequence_number"]}"]')
        expect(row).to_contain_text(alert["resolution"])
    shoot(page, "alerts")
    target = page.locator(f'[data-testid=alert-row][data-order-id="{order_id}"]')
    expect(target).to_contain_text("open")
    target.get_by_test_id("ack").click()
    page.get_by_test_id("confirm").click()  # no reason yet: the dialog insists on one
    expect(page.get_by_test_id("reason")).to_be_focused()
    expect(target).to_have_count(1)
    page.get_by_test_id("reason").fill("customer told, <i>refund</i> done")
    page.get_by_test_id("confirm").click()
    expect(page.locator(".notice.ok")).to_contain_text(f"recorded in {order_id}", timeout=SLOW)
    expect(target).to_have_count(0)
    expect(rows).to_have_count(len(listed) - 1)
    timeline = api(stack, f"orders/{order_id}")["timeline"]
    acks = [t for t in timeline if t["event"] == "alert_acknowledged"]
    assert [t["actor"] for t in acks] == [f"operator:{OPERATOR}"]
    assert acks[0]["detail"].endswith(": customer told, <i>refund</i> done")
    open_view(page, stack, f"order/{order_id}")
    acked = page.locator('[data-testid=timeline-row][data-event="alert_acknowledged"]')
    expect(acked).to_contain_text("customer told, <i>refund</i> done")  # text, not markup


def test_dead_letters_replay_refused_purge_done_markup_shown_as_text(
    page: Page, stack: Stack, shoot
):
    open_view(page, stack, "dead-letters")
    orders = page.locator('[data-testid=dead-letter-queue][data-queue="orders"]')
    expect(orders).to_contain_text("2", timeout=SLOW)
    orders.get_by_role("link").click()
    rows = page.get_by_test_id("dead-letter-row")
    expect(rows).to_have_count(2, timeout=SLOW)
    table = page.get_by_test_id("dead-letters-table")
    expect(table).to_contain_text(HOSTILE_MARKUP)  # the body and subject, shown as text
    expect(table.locator("img, script")).to_have_count(0)
    assert page.evaluate("window.__pwned") is None
    shoot(page, "dead-letters")

    submission = rows.filter(has_text=stack.scenario.dead_letters[0])
    garbage = rows.filter(has_text="{not json")
    submission.get_by_test_id("select-dead-letter").check()
    page.get_by_test_id("replay-selected").click()
    expect(page.get_by_test_id("dead-letter-preview")).to_contain_text("refused", timeout=SLOW)
    page.get_by_test_id("confirm").click()  # no reason yet: the dialog insists on one
    expect(page.get_by_test_id("reason")).to_be_focused()
    page.get_by_test_id("reason").fill("intake fixed")
    page.get_by_test_id("confirm").click()
    # First sent less than 10 minutes ago: duplicate detection would drop a copy, so it stays.
    expect(page.locator(".notice.bad")).to_contain_text("1 refused", timeout=SLOW)
    expect(submission.get_by_test_id("select-dead-letter")).not_to_be_checked()
    expect(rows).to_have_count(2)

    garbage.get_by_test_id("select-dead-letter").check()
    page.get_by_test_id("purge-selected").click()
    expect(page.get_by_test_id("dead-letter-preview")).to_contain_text("would_purge", timeout=SLOW)
    why = f"not JSON: nothing to salvage {HOSTILE_MARKUP}"
    page.get_by_test_id("reason").fill(why)
    page.get_by_test_id("confirm").click()
    expect(page.locator(".notice.ok")).to_contain_text("1 purged", timeout=SLOW)
    expect(garbage).to_have_count(0, timeout=SLOW)
    expect(submission).to_have_count(1)
    stack.scenario.dead_letters.remove("not-json")  # the overview counts what is left
    # The purged message names no order: the dead-letter log holds who purged it, and why.
    ops = LocalOperations(stack.rt)
    try:
        actions = stack.run(ops.dead_letter_log(limit=10)).actions
    finally:
        stack.run(ops.close())
    logged = {(e.action, e.reason, e.actor) for e in actions}
    assert ("purge", why, f"operator:{OPERATOR}") in logged
    assert ("replay", "intake fixed", f"operator:{OPERATOR}") in logged
    # And the dead letters views show it, under the dead letters, as text.
    actions = page.get_by_test_id("dead-letter-log").get_by_test_id("dead-letter-action")
    purge = actions.filter(has_text="not JSON: nothing to salvage")
    expect(purge).to_contain_text(why, timeout=SLOW)
    expect(purge).to_contain_text(f"operator:{OPERATOR}")
    expect(purge).to_contain_text("1 purged")
    expect(actions.filter(has_text="intake fixed")).to_contain_text("1 refused")
    expect(page.get_by_test_id("dead-letter-log").locator("img, script")).to_have_count(0)
    open_view(page, stack, "dead-letters")
    expect(page.get_by_test_id("dead-letter-queues")).to_be_visible(timeout=SLOW)
    expect(actions.filter(has_text="not JSON: nothing to salvage")).to_contain_text("orders")
    assert page.evaluate("window.__pwned") is None


def test_supervisor_and_health(page: Page, stack: Stack, shoot):
    open_view(page, stack, "supervisor")
    expect(page.get_by_test_id("supervisor-facts")).to_contain_text("Recovery bound")
    expect(page.get_by_test_id("health")).to_contain_text("servicebus", timeout=SLOW)
    shoot(page, "supervisor")


def test_an_open_circuit_shows_in_the_overview_until_it_closes(page: Page, stack: Stack, shoot):
    """The payment service fails every call (the fakes' fault control); a payment client of the
    tests' Runtime calls it until its breaker opens; the breaker records the transition in this
    process's row and the overview shows it. Then the service is clean again and the circuit
    closes. No order is involved: the others' counts stay as they are."""
    fault = stack.fakes.base_url + "/_fault"
    failing = {"profile": {"services": {"payment": {"transient_rate": 1.0}}}, "source": "test"}
    breakers = stack.rt.breakers
    assert breakers.reporter is not None
    assert httpx.post(fault, json=failing, timeout=60).status_code == 200
    try:
        client = remote_client(stack.rt, "payment")
        deadline = time.monotonic() + 60
        n = 0
        while client.breaker.state is not BreakerState.OPEN:
            assert time.monotonic() < deadline, "the payment circuit did not open"
            n += 1
            stack.run(
                client.call(
                    "charge",
                    {"order_id": f"circuit-probe-{n}", "amount": 1},
                    f"circuit-probe-{n}",
                    utc_now() + timedelta(seconds=5),
                )
            )
        assert stack.run(breakers.reporter.flush(timeout=30))
        open_view(page, stack, "overview")
        payment = page.locator('[data-testid=circuit-row][data-agent="payment"]')
        expect(payment).to_have_attribute("data-state", "open", timeout=SLOW)
        expect(payment).to_contain_text("failures")
        inventory = page.locator('[data-testid=circuit-row][data-agent="inventory"]')
        expect(inventory).not_to_have_attribute("data-state", "open")
        shoot(page, "overview-circuit-open")
    finally:
        clean = {"profile": {}, "source": "clean"}
        assert httpx.post(fault, json=clean, timeout=60).status_code == 200
        breakers.reset_all()  # the service is back: close it now rather than wait for a trial
        stack.run(breakers.reporter.flush(timeout=30))
    expect(payment).to_have_attribute("data-state", "closed", timeout=SLOW)


def test_an_orders_trace_panel_shows_its_hops_or_where_to_find_them(
    page: Page, stack: Stack, shoot, tmp_path, monkeypatch
):
    """In Azure (no TELEMETRY_DIR) the panel names the order's trace id and says to search it in
    Application Insights; locally it shows the spans from the telemetry files as a collapsible
    tree with durations, hostile text as text."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from adapters import trace_files
    from tests.browser.conftest import _wait
    from tests.support.pattern import new_order

    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    submitter = trace.SpanContext(
        int(trace_id, 16), 0x00F067AA0BA902B7, is_remote=True, trace_flags=trace.TraceFlags(1)
    )
    order = new_order()
    with trace.use_span(trace.NonRecordingSpan(submitter)):
        stack.run(stack.rt.bus.send(stack.rt.settings.queue("orders"), order))  # traceparent too
    _wait(stack, [order.order_id], 60)
    assert api(stack, f"orders/{order.order_id}")["trace_id"] == trace_id

    page.goto(f"{stack.dashboard}#/order/{order.order_id}")
    panel = page.get_by_test_id("trace-panel")
    expect(panel.get_by_test_id("trace-id")).to_have_text(trace_id)
    expect(panel.get_by_test_id("trace-hint")).to_contain_text("Application Insights")
    expect(panel.get_by_test_id("trace-hint")).to_contain_text(trace_id)
    expect(panel.get_by_test_id("trace-span")).to_have_count(0)

    # Locally: the spans the app writes to TELEMETRY_DIR, through the app's own file exporter.
    monkeypatch.setenv("TELEMETRY_DIR", str(tmp_path))
    provider = TracerProvider()
    path = tmp_path / trace_files.file_name("spans", "host", 1)
    provider.add_span_processor(SimpleSpanProcessor(trace_files.FileSpanExporter(path, "host", 1)))
    tracer = provider.get_tracer("orders")
    ids = {"order.id": order.order_id}
    with trace.use_span(trace.NonRecordingSpan(submitter)):
        with tracer.start_as_current_span("scheduler_intake", attributes=ids):
            with tracer.start_as_current_span("inventory_agent", attributes=ids):
                with tracer.start_as_current_span("scheduler_replies", attributes=ids):
                    time.sleep(0.02)
            hostile = {**ids, "note": HOSTILE_MARKUP}
            with tracer.start_as_current_span("supervisor_recover", attributes=hostile):
                with tracer.start_as_current_span(HOSTILE_MARKUP, attributes=ids):
                    pass
    provider.shutdown()

    panel.get_by_test_id("trace-refresh").click()
    names = panel.get_by_test_id("trace-span-name")
    expect(names).to_have_text(
        ["scheduler_intake", "inventory_agent", "scheduler_replies", "supervisor_recover",
         HOSTILE_MARKUP]
    )  # fmt: skip
    expect(panel.get_by_test_id("trace-tree")).to_have_count(1)
    expect(panel.get_by_test_id("trace-tree")).to_have_attribute("data-trace-id", trace_id)
    durations = panel.get_by_test_id("trace-span-duration").all_inner_texts()
    assert all(re.fullmatch(r"[0-9.]+ (ms|s)", d) for d in durations), durations
    assert page.evaluate("window.__pwned") is None  # the markup stayed text
    shoot(page, "order-trace", full_page=True)

    recover = panel.locator("summary", has=page.get_by_text("supervisor_recover", exact=True))
    recover.click()  # collapse: its child is hidden, the rest stays
    expect(panel.get_by_text(HOSTILE_MARKUP, exact=True)).to_be_hidden()
    expect(panel.get_by_text("scheduler_replies", exact=True)).to_be_visible()

    bad = httpx.get(stack.url + "dashboard/orders/%20bad%3Cid%3E/trace", timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_order_id"
