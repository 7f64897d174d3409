"""Entity config files in the official emulator's Config.json format: the repo's own configs
load, and every unusable file is refused with a ConfigError that says where and why."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from devstack.servicebus.config import (
    ConfigError,
    QueueSettings,
    load_queues,
    parse_duration,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
DEVSTACK_CONFIG = REPO_ROOT / "devstack" / "servicebus" / "Config.json"
CONTRACT_CONFIG = REPO_ROOT / "tests" / "contract" / "Config.json"


def declared_queue_names(path: Path) -> list[str]:
    document = json.loads(path.read_text(encoding="utf-8"))
    return [
        queue["Name"]
        for namespace in document["UserConfig"]["Namespaces"]
        for queue in namespace.get("Queues", [])
    ]


def write_config(tmp_path: Path, queues: list[Any], name: str = "Config.json", **ns: Any) -> Path:
    namespace = {"Name": "sbemulatorns", "Queues": queues, "Topics": [], **ns}
    path = tmp_path / name
    path.write_text(json.dumps({"UserConfig": {"Namespaces": [namespace]}}), encoding="utf-8")
    return path


def queue(name: str = "q1", **properties: Any) -> dict[str, Any]:
    return {"Name": name, "Properties": properties}


# --- the repo's configs ---------------------------------------------------------------------


@pytest.mark.parametrize("path", [DEVSTACK_CONFIG, CONTRACT_CONFIG], ids=["devstack", "contract"])
def test_repo_configs_load(path: Path) -> None:
    queues = load_queues([path])
    names = declared_queue_names(path)
    assert names, "the config declares queues"
    assert sorted(q.name for q in queues.values()) == sorted(names)
    assert all(key == settings.name.lower() for key, settings in queues.items())


def test_repo_configs_load_together_without_clashes() -> None:
    queues = load_queues([DEVSTACK_CONFIG, CONTRACT_CONFIG])
    expected = declared_queue_names(DEVSTACK_CONFIG) + declared_queue_names(CONTRACT_CONFIG)
    assert len(queues) == len(expected)


def test_devstack_config_values_are_read() -> None:
    queues = load_queues([DEVSTACK_CONFIG])
    orders = queues["orders"]
    assert orders == QueueSettings(
        name="orders",
        lock_duration=timedelta(minutes=1),
        max_delivery_count=10,
        default_ttl=timedelta(days=14),
        dead_letter_on_expiration=True,
        requires_duplicate_detection=True,
        duplicate_detection_window=timedelta(minutes=10),
    )
    assert queues["order-status"].default_ttl == timedelta(days=1)
    assert queues["inventory-requests"].dead_letter_on_expiration is False


def test_contract_config_values_are_read() -> None:
    queues = load_queues([CONTRACT_CONFIG])
    assert queues["contract-short-lock"].lock_duration == timedelta(seconds=5)
    assert queues["contract-dead-letter"].max_delivery_count == 3
    assert queues["contract-dedup"].duplicate_detection_window == timedelta(minutes=1)


def test_defaults_apply_when_properties_are_missing(tmp_path: Path) -> None:
    path = write_config(tmp_path, [{"Name": "Bare"}])
    assert load_queues([path]) == {"bare": QueueSettings(name="Bare")}


# --- durations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PT1M", timedelta(minutes=1)),
        ("P14D", timedelta(days=14)),
        ("PT20S", timedelta(seconds=20)),
        ("PT0.5S", timedelta(seconds=0.5)),
        ("P1DT2H", timedelta(days=1, hours=2)),
        ("PT1H30M", timedelta(hours=1, minutes=30)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text, "here") == expected


@pytest.mark.parametrize("text", ["", "P", "PT", "1M", "PT1X", "P1W", "pt1m", "PT-1S", "1 minute"])
def test_bad_durations_are_refused_with_where_and_an_example(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_duration(text, "Queues[0].Properties.LockDuration")
    message = str(caught.value)
    assert "Queues[0].Properties.LockDuration" in message
    assert repr(text) in message and "ISO 8601" in message and "PT1M" in message


def test_non_string_duration_is_refused(tmp_path: Path) -> None:
    path = write_config(tmp_path, [queue(DefaultMessageTimeToLive=60)])
    with pytest.raises(ConfigError, match=r"Queues\[0\]\.Properties\.DefaultMessageTimeToLive"):
        load_queues([path])


def test_bad_duration_in_a_file_names_the_file_and_field(tmp_path: Path) -> None:
    path = write_config(tmp_path, [queue("ok"), queue("bad", LockDuration="one minute")])
    with pytest.raises(ConfigError) as caught:
        load_queues([path])
    message = str(caught.value)
    assert str(path) in message
    assert "Namespaces[0].Queues[1].Properties.LockDuration" in message
    assert "'one minute'" in message


@pytest.mark.parametrize("duration", ["PT0.5S", "PT6M", "P1D"])
def test_lock_duration_outside_service_bus_limits_is_refused(tmp_path: Path, duration: str) -> None:
    path = write_config(tmp_path, [queue(LockDuration=duration)])
    with pytest.raises(ConfigError, match="LockDuration must be between PT1S and PT5M"):
        load_queues([path])


# --- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        {"Properties": {}},
        {"Name": "", "Properties": {}},
        {"Name": 7},
        {"Name": "-starts-with-dash"},
        {"Name": "has space"},
        {"Name": "x" * 261},
    ],
)
def test_missing_or_invalid_name_is_refused(tmp_path: Path, entry: dict[str, Any]) -> None:
    path = write_config(tmp_path, [entry])
    with pytest.raises(ConfigError) as caught:
        load_queues([path])
    message = str(caught.value)
    assert "Queues[0].Name" in message and "not a valid queue name" in message


def test_duplicate_queue_across_files_is_refused_case_insensitively(tmp_path: Path) -> None:
    first = write_config(tmp_path, [queue("Orders")], name="a.json")
    second = write_config(tmp_path, [queue("other"), queue("orders")], name="b.json")
    with pytest.raises(ConfigError) as caught:
        load_queues([first, second])
    message = str(caught.value)
    assert str(second) in message and "'orders'" in message and "more than once" in message


def test_duplicate_queue_within_one_file_is_refused(tmp_path: Path) -> None:
    path = write_config(tmp_path, [queue("q"), queue("Q")])
    with pytest.raises(ConfigError, match="declared more than once"):
        load_queues([path])


def test_the_repo_config_cannot_be_loaded_twice() -> None:
    with pytest.raises(ConfigError, match="more than once"):
        load_queues([DEVSTACK_CONFIG, DEVSTACK_CONFIG])


# --- unsupported features -------------------------------------------------------------------


def test_topics_are_refused(tmp_path: Path) -> None:
    path = write_config(tmp_path, [queue()], Topics=[{"Name": "events", "Subscriptions": []}])
    with pytest.raises(ConfigError) as caught:
        load_queues([path])
    message = str(caught.value)
    assert "Namespaces[0].Topics" in message and "topics are not supported" in message


def test_an_empty_topic_list_is_fine(tmp_path: Path) -> None:
    assert list(load_queues([write_config(tmp_path, [queue()], Topics=[])])) == ["q1"]


def test_sessions_are_refused(tmp_path: Path) -> None:
    path = write_config(tmp_path, [queue(RequiresSession=True)])
    with pytest.raises(ConfigError, match=r"Queues\[0\]: sessions are not supported"):
        load_queues([path])


@pytest.mark.parametrize("key", ["ForwardTo", "ForwardDeadLetteredMessagesTo"])
def test_forwarding_is_refused(tmp_path: Path, key: str) -> None:
    path = write_config(tmp_path, [queue("a"), queue("b", **{key: "a"})])
    with pytest.raises(ConfigError) as caught:
        load_queues([path])
    message = str(caught.value)
    assert f"Queues[1].Properties.{key}" in message and "forwarding is not supported" in message


def test_empty_forwarding_fields_are_fine(tmp_path: Path) -> None:
    path = write_config(tmp_path, [queue(ForwardTo="", ForwardDeadLetteredMessagesTo="")])
    assert list(load_queues([path])) == ["q1"]


# --- malformed files ------------------------------------------------------------------------


def test_bad_json_reports_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "Config.json"
    path.write_text('{\n  "UserConfig": {\n    "Namespaces": [,]\n  }\n}\n', encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_queues([path])
    message = str(caught.value)
    assert str(path) in message
    assert "invalid JSON at line 3 column 20" in message


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match=r"cannot read entity config .*nope\.json"):
        load_queues([missing])


@pytest.mark.parametrize(
    ("document", "why"),
    [
        ([], "top-level 'UserConfig' must be an object"),
        ({}, "top-level 'UserConfig' must be an object"),
        ({"UserConfig": []}, "top-level 'UserConfig' must be an object"),
        ({"UserConfig": {}}, "UserConfig.Namespaces must be a non-empty list"),
        ({"UserConfig": {"Namespaces": []}}, "UserConfig.Namespaces must be a non-empty list"),
        ({"UserConfig": {"Namespaces": ["ns"]}}, r"Namespaces\[0\] must be an object"),
        ({"UserConfig": {"Namespaces": [{"Queues": ["q"]}]}}, r"Queues\[0\] must be an object"),
        (
            {"UserConfig": {"Namespaces": [{"Queues": [{"Name": "q", "Properties": ["PT1M"]}]}]}},
            r"Queues\[0\]\.Properties must be an object",
        ),
    ],
)
def test_wrong_shapes_are_refused(tmp_path: Path, document: Any, why: str) -> None:
    path = tmp_path / "Config.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(ConfigError, match=why):
        load_queues([path])


@pytest.mark.parametrize("queues", [5, True, "orders"])
def test_queues_that_is_not_a_list_is_a_config_error(tmp_path: Path, queues: Any) -> None:
    path = tmp_path / "Config.json"
    path.write_text(json.dumps({"UserConfig": {"Namespaces": [{"Queues": queues}]}}))
    with pytest.raises(ConfigError, match=r"Namespaces\[0\]\.Queues"):
        load_queues([path])


@pytest.mark.parametrize("value", [0, -1, "10", 2.5, True])
def test_max_delivery_count_must_be_a_positive_integer(tmp_path: Path, value: Any) -> None:
    path = write_config(tmp_path, [queue(MaxDeliveryCount=value)])
    with pytest.raises(ConfigError, match="MaxDeliveryCount must be a positive integer"):
        load_queues([path])


@pytest.mark.parametrize(
    "key",
    ["DeadLetteringOnMessageExpiration", "RequiresDuplicateDetection"],
)
def test_flags_must_be_booleans(tmp_path: Path, key: str) -> None:
    path = write_config(tmp_path, [queue(**{key: "true"})])
    with pytest.raises(ConfigError, match=f"{key} must be true or false"):
        load_queues([path])
