"""Every numeric setting at 0, negative, tiny, huge, NaN, infinite and not a number.

Each is refused with one problem that names the setting and says what is expected, or, where the
setting allows 0, taken as exactly zero (never as unset, never as its default). The bounds are
those the app can honour; the tests below tie each to what it comes from.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

import pytest

from adapters.retention_settings import RetentionAppSettings, RetentionSettings, retention_of
from adapters.setting_values import SettingsError
from adapters.settings import MAX_SUPERVISOR_CONCURRENCY, MAX_WAIT, QUEUE_SETTINGS, Settings
from adapters.store.active_index import INDEX_BUCKETS
from devstack.stack.processes import REPO_ROOT
from domain.workflows import Step
from tests.support.app import EXAMPLE_SETTINGS


def step(settings: Settings) -> Step:
    return settings.workflows()["order@1"].steps[0]


DURATIONS: dict[str, Callable[[Settings], timedelta]] = {
    "REMOTE_TIMEOUT_SECONDS": lambda s: timedelta(seconds=s.remote_limits.timeout_s),
    "PENDING_STALE_AFTER_SECONDS": lambda s: s.pending_stale_after,
    "STEP_TIMEOUT_SECONDS": lambda s: step(s).complete_by_budget,
    "STEP_QUEUE_SECONDS": lambda s: step(s).queue_budget,
    "RETRY_BASE_DELAY_SECONDS": lambda s: s.workflows()["order@1"].retry.base_delay,
    "RETRY_MAX_DELAY_SECONDS": lambda s: s.retry_max_delay,
    "COMPENSATION_BUDGET_SECONDS": lambda s: s.compensation_budget,
    "COMPENSATION_WARN_AFTER_SECONDS": lambda s: s.compensation_warn_after,
    "CLOCK_SKEW_TOLERANCE_SECONDS": lambda s: s.clock_skew,
}
"""Each duration setting, and where its value lands."""
COUNTS: dict[str, Callable[[Settings], int]] = {
    "REMOTE_MAX_CONNECTIONS": lambda s: s.remote_limits.max_connections,
    "SUPERVISOR_CONCURRENCY": lambda s: s.supervisor_concurrency,
    "FAILURE_THRESHOLD": lambda s: s.workflows()["order@1"].failure_threshold,
    "RETENTION_DAYS": lambda s: retention_of(s).days,
}
ZERO_ALLOWED = {"STEP_QUEUE_SECONDS", "CLOCK_SKEW_TOLERANCE_SECONDS", "RETENTION_DAYS"}

ODD_VALUES = {
    "zero": "0",
    "negative": "-1",
    "negative fraction": "-0.5",
    "tiny": "0.0000001",
    "huge": "1e300",
    "huge digits": "9" * 40,
    "NaN": "nan",
    "NaN capitalised": "NaN",
    "infinite": "inf",
    "negative infinite": "-Infinity",
    "a word": "soon",
    "a unit": "6h",
    "hexadecimal": "0x10",
    "a decimal comma": "1,5",
}
CASES = [(name, case) for name in DURATIONS for case in ODD_VALUES] + [
    (name, case) for name in COUNTS for case in [*ODD_VALUES, "half"]
]


def test_the_tables_hold_every_numeric_setting():
    numeric = {timedelta, timedelta | None, int, int | None}
    declared = {
        name
        for name, field in RetentionAppSettings.model_fields.items()
        if field.annotation in numeric
    }
    assert declared == set(DURATIONS) | set(COUNTS)


@pytest.mark.parametrize(("name", "case"), CASES)
def test_an_odd_number_is_refused_naming_its_setting_or_is_exactly_zero(name, case):
    value = ODD_VALUES.get(case, "0.5")
    if value == "0" and name in ZERO_ALLOWED:
        settings = RetentionSettings.from_env(EXAMPLE_SETTINGS | {name: value})
        assert (DURATIONS | COUNTS)[name](settings) in (0, timedelta(0))
        return
    with pytest.raises(SettingsError) as refused:
        RetentionSettings.from_env(EXAMPLE_SETTINGS | {name: value})
    message = str(refused.value)
    assert message.startswith(f"{name} must be "), message  # one problem: this setting's
    assert "\n" not in message and repr(value[:40]) in message


@pytest.mark.parametrize("name", DURATIONS)
def test_a_duration_of_milliseconds_is_those_milliseconds(name):
    earlier_warning = {"COMPENSATION_WARN_AFTER_SECONDS": "0.001"}
    extra = earlier_warning if name == "COMPENSATION_BUDGET_SECONDS" else {}
    settings = Settings.from_env(EXAMPLE_SETTINGS | extra | {name: "0.002"})
    assert DURATIONS[name](settings) == timedelta(milliseconds=2)


@pytest.mark.parametrize("name", COUNTS)
def test_a_count_is_that_count(name):
    assert COUNTS[name](RetentionSettings.from_env(EXAMPLE_SETTINGS | {name: " 007 "})) == 7


def test_the_longest_wait_is_what_a_queue_keeps_a_message():
    """MAX_WAIT is the app's queues' message time-to-live (Config.json; tests/infra keeps the
    Bicep's equal to it)."""
    config = json.loads((REPO_ROOT / "devstack/servicebus/Config.json").read_text())
    queues = {q["Name"]: q["Properties"] for q in config["UserConfig"]["Namespaces"][0]["Queues"]}
    app_queues = {EXAMPLE_SETTINGS[name] for name in QUEUE_SETTINGS.values()}
    assert {queues[name]["DefaultMessageTimeToLive"] for name in app_queues} == {"P14D"}
    assert timedelta(days=14) == MAX_WAIT
    settings = Settings.from_env(EXAMPLE_SETTINGS | {"STEP_QUEUE_SECONDS": "1209600"})
    assert settings.step_queue == MAX_WAIT
    with pytest.raises(SettingsError, match="STEP_QUEUE_SECONDS must be at most 1209600 seconds"):
        Settings.from_env(EXAMPLE_SETTINGS | {"STEP_QUEUE_SECONDS": "1209600.001"})


def test_a_tick_sweeps_at_most_one_bucket_at_a_time_per_bucket():
    assert MAX_SUPERVISOR_CONCURRENCY == INDEX_BUCKETS
    assert Settings.from_env(EXAMPLE_SETTINGS | {"SUPERVISOR_CONCURRENCY": "16"})
    with pytest.raises(SettingsError, match="SUPERVISOR_CONCURRENCY must be a whole number from"):
        Settings.from_env(EXAMPLE_SETTINGS | {"SUPERVISOR_CONCURRENCY": "17"})
