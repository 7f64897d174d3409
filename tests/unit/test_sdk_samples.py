"""The SDK-samples conformance script's offline parts: which official samples are in scope,
which environment variables they read, and what it reports for a finished sample."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from benchmarks import sdk_samples
from benchmarks.sdk_samples import Sample, classify, env_vars, is_open_ended, last_line

QUEUE_SAMPLE = textwrap.dedent(
    """
    import os
    from azure.servicebus import ServiceBusClient, ServiceBusMessage
    CONNECTION_STR = os.environ['SERVICEBUS_CONNECTION_STR']
    QUEUE_NAME = os.environ["SERVICEBUS_QUEUE_NAME"]
    with ServiceBusClient.from_connection_string(CONNECTION_STR) as client:
        with client.get_queue_receiver(QUEUE_NAME, max_wait_time=5) as receiver:
            for msg in receiver:
                receiver.complete_message(msg)
    """
)


def test_a_plain_queue_sample_is_in_scope() -> None:
    assert classify(QUEUE_SAMPLE) == []
    assert env_vars(QUEUE_SAMPLE) == ["SERVICEBUS_CONNECTION_STR", "SERVICEBUS_QUEUE_NAME"]
    assert not is_open_ended(QUEUE_SAMPLE)


@pytest.mark.parametrize(
    ("snippet", "reasons"),
    [
        ("receiver = c.get_queue_receiver(q, session_id='S')", ["sessions"]),
        ("os.environ['SERVICEBUS_SESSION_QUEUE_NAME']", ["sessions"]),
        ("c.get_topic_sender(topic_name=TOPIC)", ["topics"]),
        ("os.environ['SERVICEBUS_SUBSCRIPTION_NAME']", ["topics"]),
        ("ServiceBusAdministrationClient.from_connection_string(c)", ["management-api"]),
        ("from azure.identity import DefaultAzureCredential", ["azure-ad"]),
        ("http_proxy = {'proxy_hostname': '127.0.0.1'}", ["tls"]),
        ("ServiceBusClient.from_connection_string(c, custom_endpoint_address=A)", ["tls"]),
        (
            "NS = os.environ['SERVICEBUS_FULLY_QUALIFIED_NAMESPACE']\n"
            "ServiceBusClient(NS, AzureNamedKeyCredential(P, K))",
            ["tls"],
        ),
        (
            "os.environ['SERVICEBUS_TOPIC_NAME']\nos.environ['SERVICEBUS_SESSION_ID']\n"
            "DefaultAzureCredential()",
            ["sessions", "topics", "azure-ad"],
        ),
    ],
)
def test_out_of_scope_features_are_recognised(snippet: str, reasons: list[str]) -> None:
    assert classify(snippet) == reasons
    assert all(reason in sdk_samples.REASONS for reason in reasons)


def test_a_connection_string_sample_that_also_names_the_namespace_stays_in_scope() -> None:
    both = QUEUE_SAMPLE + "NS = os.environ['SERVICEBUS_FULLY_QUALIFIED_NAMESPACE']\n"
    assert classify(both) == []


def test_environment_variables_in_every_spelling_the_samples_use() -> None:
    source = (
        "a = os.environ['A_1']\nb = os.environ[\"B\"]\nc = os.environ.get('C')\n"
        "d = os.getenv(\"D\")\ne = os.environ['A_1']\n"
    )
    assert env_vars(source) == ["A_1", "B", "C", "D"]


def test_a_receiver_iterated_without_a_wait_limit_runs_until_stopped() -> None:
    endless = QUEUE_SAMPLE.replace("max_wait_time=5", "")
    assert is_open_ended(endless)
    assert not is_open_ended(QUEUE_SAMPLE)


def test_the_auto_lock_renew_samples_point_at_the_contract_tests() -> None:
    for name in ("sync_samples/auto_lock_renew.py", "async_samples/auto_lock_renew_async.py"):
        note = sdk_samples.note_for(name)
        assert note is not None and "tests/contract" in note


def test_last_line_of_a_traceback_is_the_error() -> None:
    output = "Traceback (most recent call last):\n  File x\nValueError: broken\n\n"
    assert last_line(output) == "ValueError: broken"
    assert last_line("") == ""


def test_queue_names_are_valid_and_distinct() -> None:
    names = {
        Sample(Path(n), n, "").queue
        for n in ("sync_samples/send_queue.py", "async_samples/send_queue_async.py")
    }
    assert names == {"sample-send-queue", "sample-send-queue-async"}


def test_find_samples_reads_both_folders(tmp_path: Path) -> None:
    (tmp_path / "sync_samples").mkdir()
    (tmp_path / "async_samples").mkdir()
    (tmp_path / "sync_samples" / "send_queue.py").write_text(QUEUE_SAMPLE)
    (tmp_path / "async_samples" / "send_topic_async.py").write_text("get_topic_sender()")
    found = sdk_samples.find_samples(tmp_path)
    assert [(s.name, s.reasons) for s in found] == [
        ("sync_samples/send_queue.py", []),
        ("async_samples/send_topic_async.py", ["topics"]),
    ]


def test_a_finished_sample_is_reported_with_its_error(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("print('working')\nraise SystemExit('no such queue')\n")
    sample = Sample(script, "sync_samples/fails.py", "")
    result = sdk_samples.run_sample(sample, {"PATH": ""}, 30, tmp_path)
    assert result["error"] == "no such queue"
    script.write_text("print('fine')\n")
    assert "error" not in sdk_samples.run_sample(sample, {"PATH": ""}, 30, tmp_path)


def test_a_sample_past_its_time_is_stopped(tmp_path: Path) -> None:
    script = tmp_path / "hangs.py"
    script.write_text("import time\ntime.sleep(60)\n")
    result = sdk_samples.run_sample(Sample(script, "sync_samples/hangs.py", ""), {}, 1, tmp_path)
    assert result["error"] == "timed out after 1 s"
    assert result["seconds"] < 10


def test_timeout_is_capped_at_a_minute() -> None:
    with pytest.raises(SystemExit):
        sdk_samples.parse_args(["--timeout", "61"])
    assert sdk_samples.parse_args([]).timeout == 60
