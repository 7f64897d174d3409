"""benchmarks.deploy_cpu's pure parts: which executions make one order, on which queues, in
which order; and how the CPU per execution is summed up. (The measurement itself needs the
stack; it is a benchmark, run by hand.)"""

from __future__ import annotations

import pytest

from adapters.settings import Settings
from benchmarks.deploy_cpu import hops, summary
from domain import signing
from scheduler.functions import on_reply, on_submission
from tests.support.app import EXAMPLE_SETTINGS
from tests.support.keys import new_key_text

SERVICEBUS = (
    "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=RootManageSharedAccessKey;"
    "SharedAccessKey=unit;UseDevelopmentEmulator=true"
)


def settings(**extra: str) -> Settings:
    return Settings.from_env(
        {
            **EXAMPLE_SETTINGS,
            "ServiceBusConnection": SERVICEBUS,
            signing.SIGNING_KEYS_SETTING: new_key_text("unit"),
            **extra,
        }
    )


def test_an_order_is_its_submission_then_each_steps_request_and_reply() -> None:
    s = settings()
    executions = hops(s, "order")
    assert [name for name, _, _ in executions] == [
        "intake",
        "agent inventory",
        "reply",
        "agent payment",
        "reply",
        "agent shipping",
        "reply",
    ]
    queues = [queue for _, queue, _ in executions]
    assert queues[0] == s.queue("orders")
    assert queues[1::2] == [s.queue("inventory"), s.queue("payment"), s.queue("shipping")]
    assert set(queues[2::2]) == {s.queue("responses")}
    assert executions[0][2] is on_submission
    assert all(handler is on_reply for _, _, handler in executions[2::2])


def test_the_steps_are_those_of_the_version_new_orders_take() -> None:
    names = [name for name, _, _ in hops(settings(WORKFLOW_VERSIONS="order=2"), "order")]
    assert names.count("agent shipping") == 2, "order@2 verifies the address, then ships"
    assert len(names) == 1 + 2 * 4
    assert [name for name, _, _ in hops(settings(), "single_step")] == [
        "intake",
        "agent inventory",
        "reply",
    ]


def test_summary_is_in_milliseconds_per_name() -> None:
    spent = {"order": [i / 1000 for i in range(1, 12)], "reply": [0.002, 0.004]}
    report = summary(spent)
    assert report["order"] == {"median_ms": 6.0, "p10_ms": 2.0, "p90_ms": 10.0, "count": 11}
    assert report["reply"]["median_ms"] == pytest.approx(3.0)
    assert report["reply"]["count"] == 2
