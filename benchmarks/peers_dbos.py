"""The DBOS side of ``python -m benchmarks.peers``, and the 1 ms HTTP fake its steps call.

It runs in DBOS's own virtual environment (``.bench/dbos-venv``, made by benchmarks.peers), so
it imports only the standard library, httpx and dbos (lazily: ``serve`` needs neither):

    python -m benchmarks.peers_dbos serve --port-file PATH [--delay-ms 1]
    python -m benchmarks.peers_dbos run --workflow order --orders 1000 --fake-url URL
                                        --db-dir /dev/shm/... [--rate 0] [--concurrency 32]
                                        [--polling 0.05] [--warmup 20]

``serve``: a ``ThreadingHTTPServer`` (keep-alive, one thread per connection, like the project's
fakes) answering every POST with 200 after ``--delay-ms``.

``run``: launches DBOS on SQLite in ``--db-dir``, registers one queue (``--concurrency``
workflows at once in this process, polled every ``--polling`` s), runs ``--warmup`` workflows
unmeasured, then enqueues ``--orders`` workflows (all at once, or ``--rate`` per second) and
waits for them. Each workflow is durable work equivalent to the project's: one or three DBOS
steps (``single_step``: charge; ``order``: reserve, charge, create), each an HTTP POST with an
``Idempotency-Key`` to the fake, checkpointed by DBOS before the next. Prints one JSON line:
per workflow when its enqueue returned and when its last step did (``time.time()``, taken here:
DBOS's own SQLite timestamps are whole seconds on Python 3.11), the statuses DBOS recorded, and
this process's CPU seconds from the first enqueue to the last completion.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

QUEUE = "peers"
STEPS = {
    "single_step": (("payment", "charge"),),
    "order": (("inventory", "reserve"), ("payment", "charge"), ("shipping", "create")),
}
WAIT_TIMEOUT_S = 1800.0


# ------------------------------------------------------------------------------ the HTTP fake


class _FakeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    delay_s = 0.001
    body = b'{"status":"done"}'

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        time.sleep(self.delay_s)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def do_GET(self) -> None:  # liveness
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # read by listen() in __init__: 32+ workers connect at once


def serve(port_file: Path, delay_ms: float) -> int:
    _FakeHandler.delay_s = delay_ms / 1000.0
    server = _FakeServer(("127.0.0.1", 0), _FakeHandler)
    temporary = port_file.with_name(port_file.name + ".tmp")
    temporary.write_text(f"{server.server_address[1]}\n")
    os.replace(temporary, port_file)
    server.serve_forever(poll_interval=0.5)  # until SIGTERM
    return 0


# ------------------------------------------------------------------------------ DBOS


class Finished:
    """When each workflow reached its last line, by id (instrumentation, not workflow state:
    on Python 3.11 DBOS's SQLite timestamps have whole-second resolution)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._target = 0
        self.at: dict[str, float] = {}
        self.done = threading.Event()

    def expect(self, count: int) -> None:
        with self._lock:
            self.at, self._target = {}, count
            self.done.clear()

    def add(self, workflow_id: str) -> None:
        with self._lock:
            self.at[workflow_id] = time.time()
            if len(self.at) >= self._target:
                self.done.set()


def define_workflows(fake_url: str, finished: Finished) -> dict[str, Callable[[str], None]]:
    """The two workflows, registered with DBOS: each step one POST to the fake."""
    import httpx
    from dbos import DBOS

    client = httpx.Client(
        timeout=30, limits=httpx.Limits(max_connections=64, max_keepalive_connections=64)
    )

    @DBOS.step()
    def call(service: str, operation: str, order_id: str) -> dict[str, Any]:
        key = f"{order_id}:{service}:{operation}"
        answer = client.post(
            f"{fake_url}/{service}/{operation}",
            headers={"Idempotency-Key": key},
            json={"order_id": order_id, "amount_cents": 1998, "currency": "EUR"},
        )
        answer.raise_for_status()
        return answer.json()

    def flow(name: str) -> Callable[[str], None]:
        steps = STEPS[name]

        def run(order_id: str) -> None:
            try:
                for service, operation in steps:
                    call(service, operation, order_id)
            finally:
                finished.add(order_id)  # a failed workflow ends the wait too: the report shows it

        run.__name__ = run.__qualname__ = name
        return DBOS.workflow(name=name)(run)

    return {name: flow(name) for name in STEPS}


def launch(db_dir: Path, concurrency: int, polling: float) -> None:
    from dbos import DBOS, DBOSConfig

    db_dir.mkdir(parents=True, exist_ok=True)
    config: DBOSConfig = {
        "name": "peers",
        "system_database_url": f"sqlite:///{db_dir / 'dbos.sqlite'}",
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    DBOS.register_queue(
        QUEUE,
        worker_concurrency=concurrency,
        polling_interval_sec=polling,
        on_conflict="always_update",
    )


def enqueue(flow: Callable[[str], None], ids: Sequence[str], rate: float) -> dict[str, float]:
    """Enqueue one workflow per id, all at once (rate 0) or ``rate`` per second; returns when
    each was enqueued (the time its row was written)."""
    from dbos import DBOS, SetWorkflowID

    enqueued: dict[str, float] = {}
    started = time.monotonic()
    for n, workflow_id in enumerate(ids):
        if rate > 0:
            time.sleep(max(0.0, started + n / rate - time.monotonic()))
        with SetWorkflowID(workflow_id):
            DBOS.enqueue_workflow(QUEUE, flow, workflow_id)
        enqueued[workflow_id] = time.time()
    return enqueued


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of this process (all its threads), or of process ``pid``."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def batch(
    flow: Callable[[str], None],
    finished: Finished,
    prefix: str,
    count: int,
    rate: float,
    fake_pid: int | None = None,
) -> dict[str, Any]:
    """Run ``count`` workflows: per workflow its enqueue and completion times, and the CPU
    seconds this process (and the fake, ``fake_pid``) used from the first enqueue to the
    last completion."""
    ids = [f"{prefix}{n:06d}" for n in range(count)]
    finished.expect(count)
    cpu_before = cpu_seconds()
    fake_before = cpu_seconds(fake_pid) if fake_pid else 0.0
    enqueued = enqueue(flow, ids, rate)
    if not finished.done.wait(WAIT_TIMEOUT_S):
        raise TimeoutError(f"{count} workflows did not finish in {WAIT_TIMEOUT_S:.0f} s")
    cpu_s = cpu_seconds() - cpu_before
    fake_s = cpu_seconds(fake_pid) - fake_before if fake_pid else None
    return {
        "cpu_s": round(cpu_s, 3),
        "fake_cpu_s": round(fake_s, 3) if fake_s is not None else None,
        "workflows": [
            {"id": i, "enqueued_at": enqueued[i], "completed_at": finished.at[i]} for i in ids
        ],
    }


def statuses(prefix: str, settle_s: float = 5.0) -> dict[str, int]:
    """How many of the batch's workflows DBOS recorded in each status (SUCCESS, ERROR...),
    once their final status writes (just after their last line) have landed."""
    from collections import Counter

    from dbos import DBOS

    deadline = time.monotonic() + settle_s
    while True:
        found = DBOS.list_workflows(workflow_id_prefix=prefix, load_input=False, load_output=False)
        counts = Counter(str(s.status) for s in found)
        if not counts.keys() & {"PENDING", "ENQUEUED"} or time.monotonic() > deadline:
            return dict(counts)
        time.sleep(0.1)


def run(args: argparse.Namespace) -> int:
    from dbos import DBOS

    finished = Finished()
    flows = define_workflows(args.fake_url.rstrip("/"), finished)
    launch(args.db_dir, args.concurrency, args.polling)
    try:
        flow = flows[args.workflow]
        run_id = uuid.uuid4().hex[:6]
        if args.warmup:
            batch(flow, finished, f"warmup-{run_id}-", args.warmup, 0.0)
        prefix = f"{args.workflow}-{run_id}-"
        measured = batch(flow, finished, prefix, args.orders, args.rate, args.fake_pid)
        report = {
            "dbos": _version("dbos"),
            "workflow": args.workflow,
            "orders": args.orders,
            "rate": args.rate,
            "concurrency": args.concurrency,
            "polling_s": args.polling,
            "statuses": statuses(prefix),
            **measured,
        }
    finally:
        DBOS.destroy(destroy_registry=True)
    print(json.dumps(report), flush=True)
    return 0


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers_dbos", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    fake = commands.add_parser("serve", help="the 1 ms HTTP fake")
    fake.add_argument("--port-file", type=Path, required=True)
    fake.add_argument("--delay-ms", type=float, default=1.0)
    work = commands.add_parser("run", help="run workflows on DBOS, print one JSON line")
    work.add_argument("--workflow", choices=sorted(STEPS), required=True)
    work.add_argument("--orders", type=int, required=True)
    work.add_argument("--fake-url", required=True)
    work.add_argument("--db-dir", type=Path, required=True)
    work.add_argument("--rate", type=float, default=0.0, help="workflows/s; 0: all at once")
    work.add_argument("--concurrency", type=int, default=32, help="queue worker concurrency")
    work.add_argument("--polling", type=float, default=0.05, help="queue polling interval, s")
    work.add_argument("--warmup", type=int, default=20, help="unmeasured workflows first")
    work.add_argument("--fake-pid", type=int, help="also measure this process's CPU")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "serve":
        return serve(args.port_file, args.delay_ms)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
