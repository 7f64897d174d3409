"""The broker's stats file (lock and redelivery counters) and how it tells a dead receiver from a
live one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from proton import Endpoint, Message

from devstack.servicebus import stats
from devstack.servicebus.auth import SharedAccessPolicy
from devstack.servicebus.broker import ABORTED, Broker, _how_it_ended
from devstack.servicebus.config import QueueSettings
from devstack.servicebus.queues import (
    HOLDER_CLOSED,
    HOLDER_CLOSED_BY_BROKER,
    HOLDER_DROPPED,
    LockHolder,
    parse_incoming,
)

T0 = 1_700_000_000.0


def test_the_default_stats_file_sits_beside_the_port_file() -> None:
    assert stats.default_stats_path(Path("/w/broker.port")) == Path("/w/broker.stats.json")
    assert stats.default_stats_path(None) is None


def test_totals_add_counters_and_causes() -> None:
    summed = stats.totals(
        [
            {"lock_lost": 1, "delivered": 3, "redelivered_after": {"lock_lost": 1}},
            {"lock_lost": 0, "delivered": 2, "redelivered_after": {"abandoned": 2, "lock_lost": 1}},
        ]
    )
    assert summed == {
        "lock_lost": 1,
        "delivered": 5,
        "redelivered_after": {"abandoned": 2, "lock_lost": 2},
    }


def test_read_tolerates_a_missing_or_partial_file(tmp_path: Path) -> None:
    assert stats.read(tmp_path / "none.json") is None
    (tmp_path / "half.json").write_text('{"pid": ')
    assert stats.read(tmp_path / "half.json") is None


def test_a_kept_document_is_read_with_the_current_one(tmp_path: Path) -> None:
    path = tmp_path / "broker.stats.json"
    stats.write(path, {"pid": 11, "totals": {"lock_lost": 1}})
    stats.keep(path)
    assert not path.exists(), "moved aside for the next broker"
    stats.write(path, {"pid": 12, "totals": {"lock_lost": 2}})
    documents = stats.read_all(path)
    assert sorted(d["pid"] for d in documents) == [11, 12]
    assert (tmp_path / "broker.11.stats.json").exists()
    stats.keep(tmp_path / "none.stats.json")  # nothing to keep: nothing happens


def test_the_broker_writes_per_queue_counters_only_when_they_change(tmp_path: Path) -> None:
    settings = QueueSettings("Orders", lock_duration=timedelta(seconds=30))
    path = tmp_path / "broker.stats.json"
    broker = Broker({"orders": settings}, SharedAccessPolicy("k", "v"), stats_file=path)
    queue = broker.queues["orders"]
    queue.enqueue(parse_incoming(Message(body="x").encode()), T0)
    queue.lock_next(T0, LockHolder("receiver"))
    queue.tick(T0 + 30)
    broker.write_stats()
    document = json.loads(path.read_text())
    assert document["queues"]["Orders"]["lock_lost"] == 1
    assert document["totals"]["lock_lost"] == 1
    assert document["queues"]["Orders/$deadletterqueue"]["delivered"] == 0
    assert {"pid", "started_utc", "updated_utc"} <= set(document)
    path.unlink()
    broker.write_stats()
    assert not path.exists(), "nothing changed: not rewritten"


@dataclass
class FakeCondition:
    name: str
    description: str = ""


@dataclass
class FakeConnection:
    state: int


@dataclass
class FakeTransport:
    condition: Any


ACTIVE = Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE


def test_a_connection_closed_by_the_client_is_closed() -> None:
    conn = FakeConnection(Endpoint.LOCAL_CLOSED | Endpoint.REMOTE_CLOSED)
    assert _how_it_ended(conn, FakeTransport(None)) == HOLDER_CLOSED


def test_a_connection_the_broker_closed_is_closed_by_the_broker() -> None:
    conn = FakeConnection(Endpoint.LOCAL_CLOSED | Endpoint.REMOTE_ACTIVE)
    assert _how_it_ended(conn, FakeTransport(None)) == HOLDER_CLOSED_BY_BROKER


def test_a_socket_that_ended_without_a_close_is_dropped() -> None:
    assert _how_it_ended(FakeConnection(ACTIVE), FakeTransport(None)) == HOLDER_DROPPED
    for description in ("connection aborted", "connection aborted (connection aborted)"):
        aborted = FakeTransport(FakeCondition(ABORTED[0], description))
        assert _how_it_ended(FakeConnection(ACTIVE), aborted) == HOLDER_DROPPED


@pytest.mark.parametrize(
    ("name", "description"),
    [
        ("amqp:session:invalid-field", "sequencing error, expected delivery-id 3, got 4"),
        ("amqp:connection:framing-error", "Unknown protocol detected: 'garbage'"),
    ],
)
def test_a_protocol_error_is_not_a_crash(name: str, description: str) -> None:
    refused = FakeTransport(FakeCondition(name, description))
    assert _how_it_ended(FakeConnection(ACTIVE), refused) == HOLDER_CLOSED_BY_BROKER
