"""Conformance of the development Service Bus broker with the official azure-servicebus samples.

Fetches the samples of azure-servicebus 7.11.4 (the last release whose samples take a
connection string) from its source distribution on PyPI, starts a development broker with one
fresh queue per sample, runs every queue sample *unmodified* with the installed SDK and the
environment variables it reads, and prints ONE JSON document on stdout (progress on stderr):

- ``passed``: the sample exited 0 within its time limit;
- ``failed``: it did not, with the last line of its error output;
- ``out_of_scope``: samples for features this project's broker deliberately does not offer,
  each with the reasons (``reasons`` in the document says why each is out of scope).

    python -m benchmarks.sdk_samples [--timeout 60] [--budget 900] [--samples-dir DIR]

It needs the network (PyPI) unless ``--samples-dir`` points at an unpacked sdist's
``samples`` folder, so it is not part of the test run; tests/unit/test_sdk_samples.py covers
the classification offline. Every sample runs in its own process group, which is killed at its
time limit; the whole run stops by itself after ``--budget`` seconds. Exit code: 0 when no
in-scope sample failed, 1 otherwise, 2 when the samples could not be had.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from devstack.servicebus.config import write_config

SDK_PACKAGE = "azure-servicebus"
SAMPLES_VERSION = "7.11.4"
SAMPLE_TIMEOUT_S = 60.0
RUN_BUDGET_S = 900.0
DOWNLOAD_TIMEOUT_S = 300.0

log = logging.getLogger("sdk_samples")

# Why each kind of sample is out of scope: the project's choice, not a gap to close.
REASONS: dict[str, str] = {
    "sessions": (
        "Session-enabled queues (session ids, session locks and state) are not implemented: "
        "the application processes each message on its own and never asks for sessions, and "
        "a session receiver is refused with amqp:not-implemented rather than served wrongly."
    ),
    "topics": (
        "Topics, subscriptions and rules are not implemented: the application uses queues "
        "only, so publish/subscribe fan-out and filter rules would be untested surface."
    ),
    "management-api": (
        "ServiceBusAdministrationClient talks to the ATOM/REST management API over HTTPS; the "
        "broker's entities come from the emulator-format Config.json instead, as the official "
        "emulator's do, and infrastructure code creates the real ones."
    ),
    "azure-ad": (
        "Azure AD (Entra ID) tokens need an identity provider; locally the broker checks "
        "shared access keys, which is how every connection string authenticates."
    ),
    "tls": (
        "TLS and AMQP over WebSockets: the broker speaks plain AMQP on localhost, as the "
        "official emulator does with UseDevelopmentEmulator=true. A sample that connects by "
        "namespace name plus a credential, a custom endpoint, or a proxy/WebSocket transport "
        "needs amqps on port 5671 (or wss on 443) with a publicly trusted certificate."
    ),
}

# (reason, patterns in the sample's source that call for it)
FEATURE_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sessions", ("session_id", "SESSION_ID", "SESSION_QUEUE", "NEXT_AVAILABLE_SESSION")),
    (
        "topics",
        ("get_topic_sender", "get_subscription_receiver", "TOPIC_NAME", "SUBSCRIPTION_NAME"),
    ),
    ("management-api", ("ServiceBusAdministrationClient",)),
    ("azure-ad", ("DefaultAzureCredential", "EnvironmentCredential", "azure.identity")),
    ("tls", ("http_proxy", "AmqpOverWebsocket", "custom_endpoint_address", "connection_verify")),
)

# Samples whose scope deserves a word beyond their reasons.
NOTES: dict[str, str] = {
    "auto_lock_renew": (
        "Its second scenario renews a session lock. Its first (AutoLockRenewer renewing many "
        "message locks at once on one receiver) is what tests/contract "
        "test_*auto_lock_renewer_holds_fifty_locks_on_one_receiver check, sync and async, in "
        "seconds; the sample itself sleeps 280 s, past the per-sample limit."
    ),
}

# A sample that iterates a receiver with no max_wait_time never returns, on Azure too.
OPEN_ENDED = re.compile(r"\bfor\s+\w+\s+in\s+receiver\b")
MARKERS = 5  # messages put on an open-ended sample's queue before it starts
IDLE_S = 2.0  # an open-ended sample that printed every marker and then this long nothing: done

ENV_VAR = re.compile(r"""os\.(?:environ(?:\.get)?\s*[\[(]|getenv\s*\()\s*['"]([A-Z0-9_]+)['"]""")


def env_vars(source: str) -> list[str]:
    """The environment variables a sample reads, in order of first use."""
    return list(dict.fromkeys(ENV_VAR.findall(source)))


def classify(source: str) -> list[str]:
    """The reasons (keys of REASONS) a sample is out of scope; [] when the broker should pass
    it."""
    reasons = [reason for reason, patterns in FEATURE_RULES if any(p in source for p in patterns)]
    needs = env_vars(source)
    if (
        "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE" in needs
        and "SERVICEBUS_CONNECTION_STR" not in needs
        and "tls" not in reasons
    ):
        reasons.append("tls")  # a credential with a namespace name: amqps on 5671
    return reasons


def is_open_ended(source: str) -> bool:
    return bool(OPEN_ENDED.search(source)) and "max_wait_time" not in source


def note_for(name: str) -> str | None:
    stem = Path(name).stem.removesuffix("_async")
    return NOTES.get(stem)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@dataclass
class Sample:
    path: Path
    name: str  # e.g. sync_samples/send_queue.py
    source: str
    reasons: list[str] = field(default_factory=list)

    @property
    def queue(self) -> str:
        return "sample-" + re.sub(r"[^a-z0-9]+", "-", Path(self.name).stem.lower()).strip("-")


def find_samples(samples_dir: Path) -> list[Sample]:
    found = []
    for kind in ("sync_samples", "async_samples"):
        for path in sorted((samples_dir / kind).glob("*.py")):
            source = path.read_text(encoding="utf-8")
            found.append(Sample(path, f"{kind}/{path.name}", source, classify(source)))
    return found


def fetch_samples(workdir: Path, version: str) -> Path:
    """Download the sdist with pip (from PyPI) and unpack its samples folder."""
    download = workdir / "sdist"
    command = [
        sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
        "--disable-pip-version-check", "--quiet", f"{SDK_PACKAGE}=={version}", "-d", str(download),
    ]  # fmt: skip
    log.info("fetching %s %s samples from PyPI ...", SDK_PACKAGE, version)
    subprocess.run(command, check=True, timeout=DOWNLOAD_TIMEOUT_S, stdout=sys.stderr)
    (archive,) = download.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if "/samples/" in m.name]
        tar.extractall(workdir / "src", members=members, filter="data")
    (samples,) = (workdir / "src").glob("*/samples")
    return samples


def sample_env(sample: Sample, broker: object) -> dict[str, str]:
    port = broker.port  # type: ignore[attr-defined]
    values = {
        "SERVICEBUS_CONNECTION_STR": broker.connection_string,  # type: ignore[attr-defined]
        "SERVICEBUS_CONN_STR": broker.connection_string,  # type: ignore[attr-defined]
        "SERVICEBUS_QUEUE_NAME": sample.queue,
        "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE": f"localhost:{port}",
        "SERVICEBUS_SAS_POLICY": broker.key_name,  # type: ignore[attr-defined]
        "SERVICEBUS_SAS_KEY": broker.key,  # type: ignore[attr-defined]
    }
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the sample sees the installed SDK only, not this repository
    env["PYTHONUNBUFFERED"] = "1"
    for name in env_vars(sample.source):
        if name in values:
            env[name] = values[name]
    return env


def run_sample(
    sample: Sample,
    env: dict[str, str],
    timeout: float,
    logdir: Path,
    markers: tuple[str, ...] = (),
) -> dict:
    """Run one sample unmodified in its own process group; kill the group at the limit.

    With `markers` (an open-ended sample, which receives until stopped) it is stopped once its
    output shows every marker and then stays quiet for IDLE_S: it has drained its queue."""
    out_path = logdir / (sample.name.replace("/", "__") + ".log")
    started = time.monotonic()
    deadline = started + timeout
    stopped = False
    with open(out_path, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(sample.path)],
            cwd=sample.path.parent,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            last_size, quiet_since = -1, time.monotonic()
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
                if not markers:
                    continue
                size = out_path.stat().st_size
                if size != last_size:
                    last_size, quiet_since = size, time.monotonic()
                    continue
                idle = time.monotonic() - quiet_since >= IDLE_S
                if idle and all(m in out_path.read_text(errors="replace") for m in markers):
                    stopped = True
                    break
        finally:
            code = proc.poll()
            if code is None:
                _stop_group(proc)
    seconds = round(time.monotonic() - started, 1)
    output = out_path.read_text(errors="replace")
    result: dict = {"sample": sample.name, "seconds": seconds}
    if stopped:
        result["stopped"] = f"receives until stopped; stopped after it drained {len(markers)} "
        result["stopped"] += "messages put on its queue"
    elif code is None:
        seen = sum(m in output for m in markers)
        result["error"] = f"timed out after {timeout:.0f} s" + (
            f" ({seen} of {len(markers)} messages received)" if markers else ""
        )
    elif code != 0:
        result["error"] = last_line(output) or f"exit code {code}"
    return result


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGINT to the sample's process group, then SIGKILL."""
    for sig, grace in ((signal.SIGINT, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def put_markers(connection_string: str, queue: str) -> tuple[str, ...]:
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    markers = tuple(f"conformance-marker-{i}" for i in range(MARKERS))
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(m) for m in markers])
    return markers


def left_on_queue(connection_string: str, queue: str) -> int:
    """Messages still on the queue, locked or not (a drained queue has none)."""
    from azure.servicebus import ServiceBusClient

    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_receiver(queue) as receiver:
            return len(receiver.peek_messages(max_message_count=100, sequence_number=1))


def missing_env(sample: Sample) -> list[str]:
    known = {
        "SERVICEBUS_CONNECTION_STR",
        "SERVICEBUS_CONN_STR",
        "SERVICEBUS_QUEUE_NAME",
        "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE",
        "SERVICEBUS_SAS_POLICY",
        "SERVICEBUS_SAS_KEY",
    }
    return [name for name in env_vars(sample.source) if name not in known]


def run_one(sample: Sample, broker: object, timeout: float, logdir: Path) -> dict:
    conn = broker.connection_string  # type: ignore[attr-defined]
    if not is_open_ended(sample.source):
        return run_sample(sample, sample_env(sample, broker), timeout, logdir)
    markers = put_markers(conn, sample.queue)
    result = run_sample(sample, sample_env(sample, broker), timeout, logdir, markers)
    if "error" not in result and (left := left_on_queue(conn, sample.queue)):
        result["error"] = f"{left} message(s) left on its queue after it drained it"
    return result


def run_all(samples: list[Sample], timeout: float, budget: float, workdir: Path) -> dict:
    from devstack.stack.broker import BrokerProcess

    in_scope = [s for s in samples if not s.reasons]
    config = workdir / "Config.json"
    write_config(config, [s.queue for s in in_scope])
    logdir = workdir / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    passed: list[dict] = []
    failed: list[dict] = []
    deadline = time.monotonic() + budget
    broker = BrokerProcess([config], log_path=workdir / "broker.log")
    broker.start()
    try:
        for sample in in_scope:
            remaining = deadline - time.monotonic()
            if remaining < 1:
                failed.append({"sample": sample.name, "error": "not run: the run budget is spent"})
                continue
            if unknown := missing_env(sample):
                failed.append({"sample": sample.name, "error": f"needs unknown env {unknown}"})
                continue
            log.info("%s ...", sample.name)
            for attempt in (1, 2):
                if not broker.running:
                    broker.restart()
                result = run_one(sample, broker, min(timeout, remaining), logdir)
                if broker.running:
                    break
                result.setdefault("error", "the broker exited")
                result["broker_log"] = broker.log_tail(5)
                if attempt == 1:  # killed from outside, or by the sample: a second run tells
                    log.info("  the broker exited during the sample; running it again")
            if attempt == 2:
                result["note"] = "run twice: the broker exited during the first run"
            (failed if "error" in result else passed).append(result)
            log.info("  %s (%.1f s)", result.get("error", "passed"), result["seconds"])
    finally:
        broker.stop()
    return {
        "passed": passed,
        "failed": failed,
        "out_of_scope": [out_of_scope_entry(s) for s in samples if s.reasons],
    }


def out_of_scope_entry(sample: Sample) -> dict:
    entry: dict = {"sample": sample.name, "reasons": sample.reasons}
    if note := note_for(sample.name):
        entry["note"] = note
    return entry


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sdk_samples",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--version", default=SAMPLES_VERSION, help="release to take samples of")
    parser.add_argument(
        "--samples-dir", type=Path, help="an unpacked sdist's samples folder (skips the download)"
    )
    parser.add_argument(
        "--timeout", type=float, default=SAMPLE_TIMEOUT_S, help="seconds per sample (max 60)"
    )
    parser.add_argument(
        "--budget", type=float, default=RUN_BUDGET_S, help="seconds for the whole run"
    )
    parser.add_argument("--only", action="append", help="run only samples whose name has this")
    parser.add_argument("--keep", action="store_true", help="keep the work dir with the logs")
    args = parser.parse_args(argv)
    if not 0 < args.timeout <= SAMPLE_TIMEOUT_S:
        parser.error(f"--timeout must be in (0, {SAMPLE_TIMEOUT_S:.0f}]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("azure").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the broker
    workdir = Path(tempfile.mkdtemp(prefix="sb-samples-"))
    try:
        try:
            samples_dir = args.samples_dir or fetch_samples(workdir, args.version)
        except (subprocess.SubprocessError, OSError, ValueError) as exc:
            print(f"error: cannot get the {args.version} samples: {exc}", file=sys.stderr)
            return 2
        samples = find_samples(samples_dir)
        if args.only:
            samples = [s for s in samples if any(o in s.name for o in args.only)]
        results = run_all(samples, args.timeout, args.budget, workdir)
    finally:
        if args.keep:
            log.info("logs in %s", workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    from azure.servicebus import __version__ as sdk_version

    document = {
        "benchmark": "sdk_samples",
        "samples": f"{SDK_PACKAGE} {args.version}",
        "sdk": f"{SDK_PACKAGE} {sdk_version}",
        "summary": {key: len(results[key]) for key in ("passed", "failed", "out_of_scope")},
        **results,
        "reasons": {key: REASONS[key] for key in REASONS},
    }
    print(json.dumps(document, indent=2))
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
