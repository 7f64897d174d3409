"""``python -m devstack.host``: run the app's functions locally until SIGINT or SIGTERM.

    python -m devstack.host [--app function_app[:app] ...] [--settings local.settings.json]
        [--host-json host.json] [--functions a,b] [--concurrency N] [--stop-timeout 30]
        [--http-port 7071]
        [--stats-file PATH] [--log-level info]

Like ``func start``, the settings from local.settings.json are exported to the environment
(a variable already set wins) before the app module is imported.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from adapters.op_counts import COUNTS
from devstack.host.host import LocalHost
from devstack.host.settings import HostConfigError, load_settings

log = logging.getLogger("devstack.host")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.host", description="Run this app's functions locally."
    )
    parser.add_argument(
        "--app",
        action="append",
        help="module[:attribute] of the app (default function_app); repeat it to serve several "
        "apps in one host (the pattern app and the operations app: operations_app)",
    )
    parser.add_argument("--settings", default="local.settings.json", type=Path)
    parser.add_argument("--host-json", default="host.json", type=Path)
    parser.add_argument("--functions", default="", help="comma-separated function names")
    parser.add_argument("--concurrency", type=int, help="receivers per Service Bus trigger")
    parser.add_argument("--stop-timeout", type=float, default=30.0, help="seconds")
    parser.add_argument(
        "--http-port",
        type=int,
        default=7071,
        help="serve HTTP triggers on this port (0: a free one, -1: do not serve them)",
    )
    parser.add_argument(
        "--stats-file", type=Path, help="keep per-function counters in this JSON file"
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    return parser.parse_args(argv)


def write_stats(host: LocalHost, path: Path) -> None:
    """``{"pid", "updated_utc", "functions", "operations"}``, replaced atomically.

    ``operations`` are this process's storage requests (counted at the SDK pipeline) and
    Service Bus operations (sends by the app, receives and settlements by this host).
    """
    document = {
        "pid": os.getpid(),
        "updated_utc": datetime.now(UTC).isoformat(),
        "functions": {name: stats.as_dict() for name, stats in host.stats().items()},
        "operations": COUNTS.snapshot(),
    }
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("azure").setLevel(max(logging.WARNING, logging.getLogger().level))
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    apps = [app.partition(":") for app in args.app or ["function_app"]]
    attributes = {attribute or "app" for _, _, attribute in apps}
    selected = [name.strip() for name in args.functions.split(",") if name.strip()]
    if not args.settings.is_file():
        log.info("%s is not a file: app settings come from the environment only", args.settings)
    try:
        settings = load_settings(args.settings)
        for name, value in settings.items():
            os.environ.setdefault(name, value)
        if len(attributes) > 1:
            raise HostConfigError("the apps of one host must have the same attribute name")
        host = LocalHost(
            [module for module, _, _ in apps],
            settings=settings,
            host_json=args.host_json,
            concurrency_override=args.concurrency,
            functions=selected or None,
            app_attribute=attributes.pop(),
            http_port=None if args.http_port < 0 else args.http_port,
        )
    except HostConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for info in host.functions:
        print(info.describe(), flush=True)

    stop_requested = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("%s received; stopping", signal.Signals(signum).name)
        stop_requested.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        host.start()
    except OSError as error:
        print(f"error: cannot serve HTTP on port {args.http_port}: {error}", file=sys.stderr)
        return 2
    if host.http is not None:
        print(f"http triggers at {host.http.base_url}", flush=True)
    print(f"host started ({len(host.functions)} function(s)); Ctrl+C stops it", flush=True)
    while not stop_requested.wait(1.0):
        if args.stats_file:
            write_stats(host, args.stats_file)
    clean = host.stop(timeout=args.stop_timeout)
    if args.stats_file:
        write_stats(host, args.stats_file)
    for name, stats in host.stats().items():
        print(
            f"{name}: invocations={stats.invocations} successes={stats.successes} "
            f"failures={stats.failures} skipped_ticks={stats.skipped_ticks}",
            flush=True,
        )
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
