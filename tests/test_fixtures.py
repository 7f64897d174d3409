"""The test harness itself: Azurite comes up and answers, names are unique and storage-safe."""

from __future__ import annotations

import json
import re
import sys

import pytest
from azure.data.tables import TableServiceClient
from azure.storage.blob import BlobServiceClient

from devstack.stack import processes
from tests.support.app import APP_QUEUES, QueueReader
from tests.support.broker import write_suffixed_config

pytestmark = pytest.mark.integration

TABLE_NAME = re.compile(r"^[a-z][a-z0-9]{2,62}$")


def test_azurite_tables_create_and_delete(azurite, unique_name):
    service = TableServiceClient.from_connection_string(azurite.connection_string)
    name = unique_name("fixtures")
    table = service.create_table(name)
    table.create_entity({"PartitionKey": "p", "RowKey": "r", "Value": 42})
    assert table.get_entity("p", "r")["Value"] == 42
    assert name in {t.name for t in service.list_tables()}
    service.delete_table(name)
    assert name not in {t.name for t in service.list_tables()}


def test_azurite_blob_container(azurite, unique_name):
    service = BlobServiceClient.from_connection_string(azurite.connection_string)
    container = service.create_container(unique_name("fixtures"))
    container.upload_blob("lease-target", b"x")
    assert [b.name for b in container.list_blobs()] == ["lease-target"]
    container.delete_container()


def test_azurite_endpoints_answer_http(azurite):
    for url in (azurite.blob_endpoint, azurite.queue_endpoint, azurite.table_endpoint):
        assert processes.http_answers(url), url
    assert f"TableEndpoint={azurite.table_endpoint};" in azurite.connection_string
    assert f"BlobEndpoint={azurite.blob_endpoint};" in azurite.connection_string


def test_unique_name_is_unique_and_a_valid_table_name(unique_name):
    names = [unique_name("orders") for _ in range(2000)]
    assert len(set(names)) == len(names)
    for name in names:
        assert name.startswith("orders")
        assert TABLE_NAME.match(name), name


@pytest.mark.parametrize("prefix", ["", "9lives", "Order-State_v2", "x" * 100, "ümlaut", "--"])
def test_unique_name_sanitises_any_prefix(unique_name, prefix):
    name = unique_name(prefix)
    assert TABLE_NAME.match(name), name


def test_stop_kills_a_process_that_ignores_sigterm(tmp_path):
    stubborn = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "stubborn.log"
    proc = processes.spawn([sys.executable, "-c", stubborn], log_path=log)
    assert processes.wait_until(lambda: "ready" in log.read_text(), timeout=60, proc=proc)
    assert processes.stop(proc, grace=0.5) == -9  # SIGKILL after the grace period
    assert proc.poll() == -9


def test_suffixed_config_renames_queues_and_their_forwards(tmp_path):
    src = tmp_path / "Config.json"
    queue = {"Name": "orders", "Properties": {"ForwardDeadLetteredMessagesTo": "alerts"}}
    topic = {
        "Name": "events",
        "Subscriptions": [{"Name": "all", "Properties": {"ForwardTo": "alerts"}}],
    }
    config = {
        "UserConfig": {
            "Namespaces": [
                {
                    "Name": "sbemulatorns",
                    "Queues": [queue, {"Name": "alerts", "Properties": {"ForwardTo": ""}}],
                    "Topics": [topic],
                }
            ],
            "Logging": {"Type": "File"},
        }
    }
    src.write_text(json.dumps(config))
    mapping = write_suffixed_config(src, tmp_path / "out" / "Config.json", "ab12")
    assert mapping == {"orders": "orders-ab12", "alerts": "alerts-ab12", "events": "events-ab12"}
    ns = json.loads((tmp_path / "out" / "Config.json").read_text())["UserConfig"]["Namespaces"][0]
    assert [q["Name"] for q in ns["Queues"]] == ["orders-ab12", "alerts-ab12"]
    assert ns["Queues"][0]["Properties"]["ForwardDeadLetteredMessagesTo"] == "alerts-ab12"
    assert ns["Queues"][1]["Properties"]["ForwardTo"] == ""
    assert ns["Topics"][0]["Name"] == "events-ab12"
    assert ns["Topics"][0]["Subscriptions"][0]["Properties"]["ForwardTo"] == "alerts-ab12"


def test_a_queue_reader_checks_a_queue_it_never_read_within_a_short_wait(servicebus):
    """A check that nothing came waits half a second or less; the receiver's link is opened
    apart from it, so its first check does not fail for the link taking longer to open (on a
    loaded machine it did: OperationTimeoutError)."""
    reader = QueueReader(servicebus.connection_string)
    try:
        for logical in APP_QUEUES.values():
            assert reader.take(servicebus.queue(logical), "no-such-order", wait=0.05) is None
    finally:
        reader.close()
