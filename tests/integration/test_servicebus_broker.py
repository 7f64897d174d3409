"""The development broker as a process: persistence across restarts, hostile peers, crashed
clients, management errors, and its command line. These need the broker itself, so they do not
run against an external Service Bus."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus._base_handler import ServiceBusSharedKeyCredential
from azure.servicebus.exceptions import ServiceBusError
from proton import Message
from proton.utils import BlockingConnection

from devstack.servicebus import stats as broker_stats
from devstack.stack.broker import BrokerProcess
from devstack.stack.processes import REPO_ROOT

CONTRACT_CONFIG = REPO_ROOT / "tests" / "contract" / "Config.json"


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    return broker_factory([CONTRACT_CONFIG])


def receive_all(client: ServiceBusClient, queue: str, wait: float = 2, **kwargs) -> list:
    received = []
    with client.get_queue_receiver(queue, **kwargs) as receiver:
        while batch := receiver.receive_messages(max_message_count=50, max_wait_time=wait):
            for message in batch:
                received.append((str(message), message.sequence_number, message))
                receiver.complete_message(message)
    return received


def receive_until(client: ServiceBusClient, queue: str, count: int, wait: float) -> list:
    """:func:`receive_all` until ``count`` messages have come, for at most ``wait`` s."""
    received: list = []
    deadline = time.monotonic() + wait
    with client.get_queue_receiver(queue) as receiver:
        while len(received) < count and (left := deadline - time.monotonic()) > 0:
            for message in receiver.receive_messages(max_message_count=50, max_wait_time=left):
                received.append((str(message), message.sequence_number, message))
                receiver.complete_message(message)
    return received


def test_data_dir_keeps_messages_schedules_dead_letters_and_dedup(broker_factory, tmp_path):
    broker = broker_factory([CONTRACT_CONFIG], data_dir=tmp_path / "sb")
    # Due well after the restart and the reads before it, even on a loaded machine.
    due = datetime.now(UTC) + timedelta(seconds=30)
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_sender("contract-basic") as sender:
            sender.send_messages([ServiceBusMessage(f"kept-{i}") for i in range(3)])
            sender.schedule_messages(ServiceBusMessage("scheduled"), due)
        with client.get_queue_sender("contract-dedup") as sender:
            sender.send_messages(ServiceBusMessage("original", message_id="dedup-1"))
        with client.get_queue_receiver("contract-basic") as receiver:
            (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.dead_letter_message(first, reason="Operator", error_description="parked")
    before_seqs = {"kept-1", "kept-2"}

    broker.restart()

    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_sender("contract-dedup") as sender:
            sender.send_messages(ServiceBusMessage("duplicate", message_id="dedup-1"))
        with client.get_queue_sender("contract-basic") as sender:
            sender.send_messages(ServiceBusMessage("after-restart"))
        active = receive_all(client, "contract-basic", wait=1)
        assert [body for body, _, _ in active] == ["kept-1", "kept-2", "after-restart"]
        assert {body for body, _, _ in active[:2]} == before_seqs
        seqs = [seq for _, seq, _ in active]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3, "sequence numbers continue"
        dead = receive_all(client, "contract-basic", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        assert [body for body, _, _ in dead] == ["kept-0"]
        assert dead[0][2].dead_letter_reason == "Operator"
        assert [body for body, _, _ in receive_all(client, "contract-dedup")] == ["original"]
        scheduled = receive_until(client, "contract-basic", 1, wait=60)
        assert [body for body, _, _ in scheduled] == ["scheduled"]
        assert datetime.now(UTC) >= due - timedelta(milliseconds=200)


def test_in_memory_broker_starts_empty_after_restart(broker):
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_sender("contract-basic") as sender:
            sender.send_messages(ServiceBusMessage("volatile"))
    broker.restart()
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        assert receive_all(client, "contract-basic", wait=1) == []


def test_garbage_and_half_open_peers_do_not_disturb_others(broker):
    hostile = []
    for payload in (
        b"GET / HTTP/1.1\r\n\r\n",
        b"AMQP\x00\x01\x00\x00" + os.urandom(64),  # AMQP header, then noise
        b"AMQP\x03\x01\x00\x00" + b"\xff" * 32,  # SASL header, then a broken frame
        b"AMQP",  # and then silence
    ):
        sock = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
        sock.sendall(payload)
        hostile.append(sock)
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_sender("contract-basic") as sender:
            sender.send_messages(ServiceBusMessage("business as usual"))
        assert [body for body, _, _ in receive_all(client, "contract-basic")] == [
            "business as usual"
        ]
    for sock in hostile:
        sock.close()
    assert broker.running


def test_crashed_receiver_leaves_its_lock_to_expire(broker):
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_sender("contract-short-lock") as sender:
            sender.send_messages(ServiceBusMessage("orphan"))
    crash = textwrap.dedent(
        f"""
        import os
        from azure.servicebus import ServiceBusClient
        client = ServiceBusClient.from_connection_string({broker.connection_string!r})
        receiver = client.get_queue_receiver("contract-short-lock")
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=10)
        print(message.sequence_number, flush=True)
        os._exit(0)  # die holding the lock, without detaching or settling
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", crash], capture_output=True, text=True, timeout=60, check=True
    )
    crashed_seq = int(result.stdout.strip())
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_receiver("contract-short-lock") as receiver:
            # Back once its lock (5 s) has expired: the wait is only a bound.
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=60)
            assert message.sequence_number == crashed_seq
            assert message.delivery_count == 1
            receiver.complete_message(message)


def test_sigusr1_drops_every_client_connection_as_a_network_fault(broker):
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_sender("contract-short-lock") as sender:
            sender.send_messages([ServiceBusMessage("held"), ServiceBusMessage("waiting")])
        receiver = client.get_queue_receiver("contract-short-lock", prefetch_count=0)
        (held,) = receiver.receive_messages(max_message_count=1, max_wait_time=10)
        assert str(held) == "held"
        os.kill(broker.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while "connection ended (dropped)" not in broker.log_tail(200):
            assert time.monotonic() < deadline, broker.log_tail()
            time.sleep(0.05)
        assert "dropped 1 client connection(s)" in broker.log_tail(200)
        # Both messages are kept; the held one comes back once its lock has expired.
        with ServiceBusClient.from_connection_string(broker.connection_string) as other:
            again = receive_until(other, "contract-short-lock", 2, wait=60)
        assert sorted(body for body, _, _ in again) == ["held", "waiting"]
        assert {body: m.delivery_count for body, _, m in again}["held"] == 1
        receiver.close()
    # The broker rewrites its stats file about once a second.
    deadline = time.monotonic() + 30
    while (totals := broker_stats.read(broker.stats_path)["totals"])["expired_after_crash"] < 1:
        assert time.monotonic() < deadline, totals
        time.sleep(0.1)
    assert (totals["lock_lost"], totals["expired_after_crash"]) == (0, 1), totals


def test_a_restart_keeps_the_stopped_brokers_lock_counters(broker):
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_sender("contract-basic") as sender:
            sender.send_messages(ServiceBusMessage("counted"))
        assert [body for body, _, _ in receive_all(client, "contract-basic")] == ["counted"]
    broker.restart()
    deadline = time.monotonic() + 30
    while len(documents := broker_stats.read_all(broker.stats_path)) < 2:
        assert time.monotonic() < deadline, documents
        time.sleep(0.05)
    assert sum(d["totals"]["completed"] for d in documents) == 1
    assert len({d["pid"] for d in documents}) == 2


class RawClient:
    """A bare AMQP client (proton), for requests the SDK would never send."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.conn = BlockingConnection(
            f"127.0.0.1:{broker.port}", allowed_mechs="ANONYMOUS", timeout=10
        )
        self.links: dict[str, tuple] = {}

    def request(self, node: str, message: Message) -> Message:
        if node not in self.links:
            self.links[node] = (self.conn.create_sender(node), self.conn.create_receiver(node))
        sender, receiver = self.links[node]
        message.id = str(uuid.uuid4())
        message.reply_to = node
        sender.send(message)
        reply = receiver.receive(timeout=10)
        assert reply.correlation_id == message.id
        return reply

    def put_token(self, entity: str) -> Message:
        audience = f"sb://localhost:{self.broker.port}/{entity}"
        token = ServiceBusSharedKeyCredential(self.broker.key_name, self.broker.key).get_token(
            audience
        )
        return self.request(
            "$cbs",
            Message(
                body=token.token,
                properties={"operation": "put-token", "type": "jwt", "name": audience},
            ),
        )

    def management(self, entity: str, operation: str, body: object) -> Message:
        return self.request(
            f"{entity}/$management",
            Message(body=body, properties={"operation": f"com.microsoft:{operation}"}),
        )

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def raw(broker):
    client = RawClient(broker)
    yield client
    client.close()


def test_management_errors_are_answered_not_fatal(raw, broker):
    assert raw.put_token("contract-basic").properties["status-code"] == 202
    missing = raw.management("contract-basic", "renew-lock", {})
    assert missing.properties["statusCode"] == 400
    assert "lock-tokens" in missing.properties["statusDescription"]
    unknown_token = raw.management("contract-basic", "renew-lock", {"lock-tokens": [uuid.uuid4()]})
    assert unknown_token.properties["statusCode"] == 410
    assert unknown_token.properties["errorCondition"] == "com.microsoft:message-lock-lost"
    unknown_op = raw.management("contract-basic", "frobnicate", {})
    assert unknown_op.properties["statusCode"] == 400
    assert "not supported" in unknown_op.properties["statusDescription"]
    not_a_map = raw.management("contract-basic", "peek-message", "peek please")
    assert not_a_map.properties["statusCode"] == 400
    cancel_missing = raw.management(
        "contract-basic", "cancel-scheduled-message", {"sequence-numbers": [424242]}
    )
    assert cancel_missing.properties["statusCode"] == 404
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_sender("contract-basic") as sender:
            sender.send_messages(ServiceBusMessage("still fine"))
        assert [body for body, _, _ in receive_all(client, "contract-basic")] == ["still fine"]


def test_token_checks(raw, broker):
    forged = raw.request(
        "$cbs",
        Message(
            body="SharedAccessSignature sr=x&sig=bad&se=9999999999&skn=RootManageSharedAccessKey",
            properties={"operation": "put-token", "type": "jwt", "name": "sb://localhost/x"},
        ),
    )
    assert forged.properties["status-code"] == 401
    assert "signature" in forged.properties["status-description"].lower()
    assert raw.put_token("no-such-queue").properties["status-code"] == 404


def test_with_a_namespace_token_a_missing_queue_is_not_found(raw):
    from proton.utils import LinkDetached

    assert raw.put_token("").properties["status-code"] == 202
    with pytest.raises(LinkDetached) as caught:
        raw.conn.create_sender("no-such-queue")
    assert "amqp:not-found" in str(caught.value)


def test_session_receivers_are_refused_as_not_implemented(broker):
    with (
        ServiceBusClient.from_connection_string(broker.connection_string, retry_total=0) as client,
        pytest.raises(ServiceBusError, match="does not implement sessions"),
        client.get_queue_receiver("contract-basic", session_id="S") as receiver,
    ):
        receiver.receive_messages(max_message_count=1, max_wait_time=1)


def test_attach_without_a_token_is_refused(raw):
    from proton.utils import LinkDetached

    with pytest.raises(LinkDetached) as caught:
        raw.conn.create_sender("contract-basic")
    assert "unauthorized" in str(caught.value).lower()


def test_sigterm_stops_cleanly_and_removes_port_file(broker):
    port_file = broker.port_file
    assert port_file.exists()
    os.kill(broker.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while broker.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not broker.running, "the broker ignored SIGTERM"
    assert not port_file.exists()
    assert "stopped" in broker.log_tail()


def run_broker_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "devstack.servicebus.broker", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO_ROOT,
    )


def test_help_explains_every_option():
    result = run_broker_cli("--help")
    assert result.returncode == 0
    for option in (
        "--host",
        "--port",
        "--config",
        "--port-file",
        "--data-dir",
        "--key-name",
        "--key",
        "--log-level",
    ):
        assert option in result.stdout
    assert "UseDevelopmentEmulator=true" in result.stdout


def test_bad_config_is_refused_with_the_place_at_fault(tmp_path: Path):
    bad = tmp_path / "Config.json"
    bad.write_text(
        '{"UserConfig": {"Namespaces": [{"Queues": [{"Name": "q", "Properties": '
        '{"LockDuration": "one minute"}}]}]}}'
    )
    result = run_broker_cli("--config", str(bad), "--key", "k", "--port", "0")
    assert result.returncode == 2
    assert "LockDuration" in result.stderr and "ISO 8601" in result.stderr


def test_port_in_use_is_reported(broker):
    result = run_broker_cli(
        "--config", str(CONTRACT_CONFIG), "--key", "k", "--port", str(broker.port)
    )
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{broker.port}" in result.stderr
