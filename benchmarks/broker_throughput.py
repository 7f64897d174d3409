"""Throughput of the development Service Bus broker through the real (sync) azure-servicebus SDK.

Starts its own broker (in memory, then with ``--data-dir``), runs send -> receive -> complete
scenarios against it and prints ONE JSON document on stdout (progress goes to stderr):

- ``lockstep``: one sender and one receiver, one message at a time (send, receive, complete);
- ``batched``: send batches of 100, receive up to 100 per call, complete each message;
- ``competing``: N messages pre-sent in batches of 100, drained by 4 receiver threads, each with
  its own client and receiver (``msg_per_s`` is for the drain; the send phase is reported apart).

Each result carries wall seconds, msg/s, the broker's CPU seconds (utime+stime from
/proc/<pid>/stat) and this process's CPU seconds, in total and per message, so it shows whether
the broker or the client is the bottleneck: a broker near 1.0 CPU-s per wall-s is saturated (it
is single-threaded), and so is this process near 1.0 (its receiver threads share one GIL). In
lockstep nothing overlaps: a message costs about the broker's CPU plus the client's.

    python -m benchmarks.broker_throughput [--messages N] [--quick] [--storage memory]

The broker is stopped on exit, including Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import ctypes
import json
import logging
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusReceiver,
    ServiceBusSender,
)
from azure.servicebus import __version__ as sdk_version

from devstack.servicebus.config import write_config

REPO_ROOT = Path(__file__).resolve().parents[1]
BROKER_MODULE = "devstack.servicebus.broker"
KEY_NAME = "RootManageSharedAccessKey"
STARTUP_TIMEOUT_S = 20.0
STOP_GRACE_S = 5.0


SCENARIOS = ("lockstep", "batched", "competing")
STORAGES = ("memory", "disk")
DEFAULT_MESSAGES = {"lockstep": 2000, "batched": 10000, "competing": 10000}
QUICK_MESSAGES = {"lockstep": 200, "batched": 1000, "competing": 1000}
BATCH = 100
COMPETING_RECEIVERS = 4
WARMUP_MESSAGES = 20
RECEIVE_WAIT_S = 10.0
TARGETS_MSG_PER_S = {"lockstep-memory": 2000, "batched-memory": 5000}

log = logging.getLogger("benchmark")


@dataclass
class Result:
    scenario: str
    storage: str
    messages: int
    received: int
    seconds: float
    msg_per_s: float
    broker_cpu_s: float
    client_cpu_s: float
    broker_cpu_per_wall_s: float
    client_cpu_per_wall_s: float
    broker_cpu_us_per_msg: float
    client_cpu_us_per_msg: float
    send_seconds: float | None = None


# --- measuring ------------------------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat (Linux)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


@dataclass
class Meter:
    broker_pid: int
    wall: float = 0.0
    broker_cpu: float = 0.0
    client_cpu: float = 0.0

    def start(self) -> None:
        self.wall = time.perf_counter()
        self.broker_cpu = process_cpu_seconds(self.broker_pid)
        self.client_cpu = time.process_time()

    def result(
        self,
        scenario: str,
        storage: str,
        messages: int,
        received: int,
        end: float | None = None,
        send_seconds: float | None = None,
    ) -> Result:
        seconds = (end if end is not None else time.perf_counter()) - self.wall
        broker_cpu = process_cpu_seconds(self.broker_pid) - self.broker_cpu
        client_cpu = time.process_time() - self.client_cpu
        return Result(
            scenario=scenario,
            storage=storage,
            messages=messages,
            received=received,
            seconds=round(seconds, 3),
            msg_per_s=round(received / seconds, 1) if seconds > 0 else 0.0,
            broker_cpu_s=round(broker_cpu, 2),
            client_cpu_s=round(client_cpu, 2),
            broker_cpu_per_wall_s=round(broker_cpu / seconds, 2) if seconds > 0 else 0.0,
            client_cpu_per_wall_s=round(client_cpu / seconds, 2) if seconds > 0 else 0.0,
            broker_cpu_us_per_msg=round(broker_cpu * 1e6 / received) if received else 0.0,
            client_cpu_us_per_msg=round(client_cpu * 1e6 / received) if received else 0.0,
            send_seconds=None if send_seconds is None else round(send_seconds, 3),
        )


def body(i: int, size: int) -> str:
    return f"{i:010d}".ljust(size, ".")


def batch_of(start: int, count: int, size: int) -> list[ServiceBusMessage]:
    return [ServiceBusMessage(body(start + i, size)) for i in range(count)]


# --- scenarios ------------------------------------------------------------------------------


def receiver_for(client: ServiceBusClient, queue: str) -> ServiceBusReceiver:
    return client.get_queue_receiver(queue, prefetch_count=0)


def warm_up(sender: ServiceBusSender, receiver: ServiceBusReceiver, size: int) -> None:
    """Attach both links and exercise the path once, so setup cost is not in the timing."""
    sender.send_messages([ServiceBusMessage(body(-1, size)) for _ in range(WARMUP_MESSAGES)])
    drained = 0
    while drained < WARMUP_MESSAGES:
        batch = receiver.receive_messages(WARMUP_MESSAGES, max_wait_time=RECEIVE_WAIT_S)
        if not batch:
            raise RuntimeError("warm-up: the messages did not come back")
        for message in batch:
            receiver.complete_message(message)
        drained += len(batch)


def lockstep(conn: str, queue: str, n: int, size: int, meter: Meter, storage: str) -> Result:
    with ServiceBusClient.from_connection_string(conn) as client:
        with client.get_queue_sender(queue) as sender, receiver_for(client, queue) as receiver:
            warm_up(sender, receiver, size)
            seen: set[str] = set()
            meter.start()
            for i in range(n):
                sender.send_messages(ServiceBusMessage(body(i, size)))
                batch = receiver.receive_messages(1, max_wait_time=RECEIVE_WAIT_S)
                if not batch:
                    raise RuntimeError(f"lockstep: message {i} did not come back")
                for message in batch:
                    receiver.complete_message(message)
                    seen.add(str(message))
            return meter.result("lockstep", storage, n, len(seen))


def batched(conn: str, queue: str, n: int, size: int, meter: Meter, storage: str) -> Result:
    with ServiceBusClient.from_connection_string(conn) as client:
        with client.get_queue_sender(queue) as sender, receiver_for(client, queue) as receiver:
            warm_up(sender, receiver, size)
            seen: set[str] = set()
            meter.start()
            for start in range(0, n, BATCH):
                count = min(BATCH, n - start)
                sender.send_messages(batch_of(start, count, size))
                got = 0
                while got < count:
                    batch = receiver.receive_messages(BATCH, max_wait_time=RECEIVE_WAIT_S)
                    if not batch:
                        raise RuntimeError(f"batched: {count - got} message(s) did not come back")
                    for message in batch:
                        receiver.complete_message(message)
                        seen.add(str(message))
                    got += len(batch)
            return meter.result("batched", storage, n, len(seen))


def competing(conn: str, queue: str, n: int, size: int, meter: Meter, storage: str) -> Result:
    lock = threading.Lock()
    seen: set[str] = set()
    completed = 0
    finished_at: list[float] = []
    errors: list[BaseException] = []
    attached = threading.Barrier(COMPETING_RECEIVERS + 1)
    go = threading.Barrier(COMPETING_RECEIVERS + 1)
    deadline = [float("inf")]
    send_seconds = 0.0

    def record(message: ServiceBusReceivedMessage) -> None:
        nonlocal completed
        with lock:
            seen.add(str(message))
            completed += 1
            if completed == n:
                finished_at.append(time.perf_counter())

    def drain() -> None:
        try:
            with ServiceBusClient.from_connection_string(conn) as own_client:
                with receiver_for(own_client, queue) as receiver:
                    # attach the link while the queue is still empty, so setup is not timed
                    for message in receiver.receive_messages(1, max_wait_time=0.01):
                        receiver.complete_message(message)
                        record(message)
                    attached.wait()
                    go.wait()
                    while time.monotonic() < deadline[0]:
                        with lock:
                            if completed >= n:
                                return
                        for message in receiver.receive_messages(BATCH, max_wait_time=1):
                            receiver.complete_message(message)
                            record(message)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            attached.abort()
            go.abort()

    with (
        ServiceBusClient.from_connection_string(conn) as client,
        client.get_queue_sender(queue) as sender,
    ):
        with receiver_for(client, queue) as receiver:
            warm_up(sender, receiver, size)
        threads = [
            threading.Thread(target=drain, name=f"receiver-{i}", daemon=True)
            for i in range(COMPETING_RECEIVERS)
        ]
        for thread in threads:
            thread.start()
        try:
            attached.wait()
            send_started = time.perf_counter()
            for start in range(0, n, BATCH):
                sender.send_messages(batch_of(start, min(BATCH, n - start), size))
            send_seconds = time.perf_counter() - send_started
            deadline[0] = time.monotonic() + max(60.0, n / 50)
            meter.start()
            go.wait()
        except threading.BrokenBarrierError:
            pass  # a receiver failed; reported below
        for thread in threads:
            thread.join()
    if errors:
        raise RuntimeError(f"competing: a receiver failed: {errors[0]!r}") from errors[0]
    end = finished_at[0] if finished_at else None
    return meter.result("competing", storage, n, len(seen), end=end, send_seconds=send_seconds)


RUNNERS: dict[str, Callable[[str, str, int, int, Meter, str], Result]] = {
    "lockstep": lockstep,
    "batched": batched,
    "competing": competing,
}


# --- the broker -----------------------------------------------------------------------------


class Broker:
    """`python -m devstack.servicebus.broker` on a free port, in its own process group."""

    def __init__(self, workdir: Path, config: Path, data_dir: Path | None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.key = base64.b64encode(secrets.token_bytes(32)).decode("ascii")
        self.log_path = workdir / "broker.log"
        port_file = workdir / "broker.port"
        argv = [
            sys.executable, "-m", BROKER_MODULE,
            "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file),
            "--config", str(config), "--key-name", KEY_NAME, "--key", self.key,
            "--log-level", "warning",
        ]  # fmt: skip
        if data_dir is not None:
            argv += ["--data-dir", str(data_dir)]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
            ),
        }
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()),
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not (port_file.exists() and port_file.read_text().endswith("\n")):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the broker did not start; its log ends:\n{tail}")
            time.sleep(0.02)
        self.port = int(port_file.read_text())

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def connection_string(self) -> str:
        return (
            f"Endpoint=sb://localhost:{self.port};SharedAccessKeyName={KEY_NAME};"
            f"SharedAccessKey={self.key};UseDevelopmentEmulator=true"
        )

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL after a grace period."""
        if self.proc.poll() is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def _signal(self, sig: signal.Signals) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)


def _die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """Linux: SIGKILL the broker if this process dies without stopping it (e.g. SIGKILL)."""
    if not sys.platform.startswith("linux"):
        return None

    def preexec() -> None:
        with suppress(Exception):
            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


@contextmanager
def running_broker(workdir: Path, storage: str, config: Path) -> Iterator[Broker]:
    broker = Broker(workdir, config, workdir / "data" if storage == "disk" else None)
    atexit.register(broker.stop)  # in case the finally below never runs
    try:
        yield broker
    finally:
        broker.stop()
        atexit.unregister(broker.stop)


def _stop_on_sigterm() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


# --- command line ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.broker_throughput",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "--messages",
        type=int,
        help="messages per scenario (default: 2000 lockstep, 10000 batched and competing; "
        "--quick: 200 / 1000 / 1000)",
    )
    parser.add_argument("--quick", action="store_true", help="a short run (smoke test)")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS,
        help="run only this scenario (repeatable; default: all)",
    )
    parser.add_argument(
        "--storage",
        action="append",
        choices=STORAGES,
        help="memory (no --data-dir) or disk (--data-dir in a temp dir); repeatable; default both",
    )
    parser.add_argument("--size", type=int, default=128, help="message body bytes (default 128)")
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the temp dir with broker logs; print path"
    )
    args = parser.parse_args(argv)
    if args.messages is not None and args.messages < 1:
        parser.error("--messages must be at least 1")
    if args.size < 10:
        parser.error("--size must be at least 10")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("azure").setLevel(logging.ERROR)
    _stop_on_sigterm()
    scenarios = args.scenario or list(SCENARIOS)
    storages = args.storage or list(STORAGES)
    counts = QUICK_MESSAGES if args.quick else DEFAULT_MESSAGES
    results: dict[str, dict[str, Any]] = {}
    workdir = Path(tempfile.mkdtemp(prefix="sb-bench-"))
    config = workdir / "Config.json"
    write_config(
        config,
        [f"bench-{s}" for s in scenarios],
        DefaultMessageTimeToLive="PT1H",
        DuplicateDetectionHistoryTimeWindow="PT1M",
    )
    try:
        for storage in storages:
            with running_broker(workdir / storage, storage, config) as broker:
                meter = Meter(broker.pid)
                for scenario in scenarios:
                    n = args.messages or counts[scenario]
                    log.info("%s / %s: %d messages ...", scenario, storage, n)
                    runner = RUNNERS[scenario]
                    conn = broker.connection_string
                    result = runner(conn, f"bench-{scenario}", n, args.size, meter, storage)
                    log.info(
                        "  %.0f msg/s (%.2f s; CPU per message: broker %.0f us, client %.0f us)",
                        result.msg_per_s,
                        result.seconds,
                        result.broker_cpu_us_per_msg,
                        result.client_cpu_us_per_msg,
                    )
                    results[f"{scenario}-{storage}"] = asdict(result)
    except KeyboardInterrupt:
        log.info("interrupted; broker stopped")
        return 130
    finally:
        if args.keep_logs:
            log.info("broker logs in %s", workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    document = {
        "benchmark": "broker_throughput",
        "sdk": f"azure-servicebus {sdk_version}",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "quick": args.quick,
        "message_bytes": args.size,
        "batch": BATCH,
        "competing_receivers": COMPETING_RECEIVERS,
        "targets_msg_per_s": TARGETS_MSG_PER_S,
        "results": results,
    }
    print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
