"""One real HTTP server hosting the fake inventory, payment and shipping services (local only).

Routes::

    POST /{service}/{operation}   inventory: reserve, release; payment: charge, refund;
                                  shipping: create, cancel. Needs an Idempotency-Key header;
                                  an undo (release, refund, cancel) also needs "undoes": the
                                  forward call's key, in its JSON body.
    GET  /_health                 liveness and the service list
    GET  /_ledger                 every applied effect, in order ("entries"; an undo's entry
                                  names the forward key in "undoes"), and the tombstones
                                  ("tombstones"), read together
    GET  /_tombstones             forward keys undone before they took effect (refused for ever)
    GET  /_stats                  counts of requests, effects, replays and injected faults
    GET  /_profile                the fault profile in force
    POST /_profile                replace the fault profile (JSON body; 400 names what is wrong)
    GET  /_fault                  the faults in force: the profile, where it came from
                                  ("source": clean, flaky, a path...), and the forced declines
                                  still pending per service
    POST /_fault                  change them: {"profile": {...}, "source": "flaky",
                                  "decline_next": {"service": "payment", "count": 3}}, each
                                  part optional; answers as GET /_fault (400 names what is wrong)
    POST /_reset                  forget effects, tombstones, stored answers, per-key counts

Standard library ``ThreadingHTTPServer``: one thread per connection, so a hanging request never
blocks another, and direct access to the socket, which a fake needs to drop a connection without
answering (crash-after-effect) -- an ASGI server would turn that into a 500.

Run: ``python -m devstack.fakes.remote_services --port 0 --port-file PATH --profile PATH --seed N``
In-process: ``with FakeServices.start(profile) as fakes: fakes.url("payment")``.

Faults chosen at run time (``orderctl fault``) outlive a crash of this process: with a port
file, each change is written to ``<port file stem>.fault.json`` beside it, and a process
started on a given port (a restart at the address it had: ``orderctl up`` restarts a dead
process so) takes them up again; one started on port 0 (a new stack) removes that file and
starts from ``--profile``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from devstack.fakes.catalog import SERVICES
from devstack.fakes.engine import Drop, FakeServiceEngine, Reply, error_reply
from devstack.fakes.profiles import (
    Profile,
    ProfileError,
    as_profile,
    load_profile,
    parse_profile,
    source_name,
    validate_profile,
)

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a hung request must not hold up shutdown
    request_queue_size = 128
    allow_reuse_address = True

    def __init__(
        self, address: tuple[str, int], engine: FakeServiceEngine, state_file: Path | None = None
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)
        self.engine = engine
        self.state_file = state_file
        self.control_lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            log.debug("client %s went away: %s", client_address, error)
            return
        log.exception("error while serving %s", client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse connections
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms stall
    server: _Server

    def do_GET(self) -> None:
        engine = self.server.engine
        path = urlsplit(self.path).path
        if path == "/_health":
            self._send(Reply(200, {"status": "ok", "services": sorted(SERVICES)}))
        elif path == "/_ledger":
            entries, tombstones = engine.snapshot()
            body = {"count": len(entries), "entries": entries, "tombstones": tombstones}
            self._send(Reply(200, body))
        elif path == "/_tombstones":
            tombstones = engine.tombstones()
            self._send(Reply(200, {"count": len(tombstones), "entries": tombstones}))
        elif path == "/_stats":
            self._send(Reply(200, engine.stats()))
        elif path == "/_profile":
            self._send(Reply(200, engine.profile.model_dump(mode="json")))
        elif path == "/_fault":
            self._send(Reply(200, fault_state(engine)))
        else:
            self._send(error_reply(404, "not_found", f"no resource GET {path}"))

    def do_POST(self) -> None:
        body = self._read_body()
        if body is None:
            return
        path = urlsplit(self.path).path
        engine = self.server.engine
        if path == "/_profile":
            self._send(self._replace_profile(body))
        elif path == "/_fault":
            self._send(self._change_faults(body))
        elif path == "/_reset":
            engine.reset()
            self._send(Reply(200, {"reset": True}))
        else:
            parts = path.strip("/").split("/")
            if len(parts) != 2:
                self._send(error_reply(404, "not_found", f"no resource POST {path}"))
                return
            key = self.headers.get("Idempotency-Key")
            self._act(engine.handle(parts[0], parts[1], key, body))

    def _replace_profile(self, body: bytes) -> Reply:
        try:
            profile = parse_profile(body.decode("utf-8", errors="replace"), "profile")
        except ProfileError as exc:
            return error_reply(400, "invalid_profile", str(exc))
        with self.server.control_lock:
            self.server.engine.set_profile(profile)
            _save_state(self.server)
        log.info("fault profile replaced: %s", profile.description or "(no description)")
        return Reply(200, profile.model_dump(mode="json"))

    def _change_faults(self, body: bytes) -> Reply:
        try:
            change = parse_fault_change(body)
        except ValueError as exc:
            return error_reply(400, "invalid_fault", str(exc))
        engine = self.server.engine
        with self.server.control_lock:
            if change.profile is not None:
                engine.set_profile(change.profile, change.source or "set at run time")
                log.info("fault profile: %s", engine.source)
            if change.decline is not None:
                engine.decline_next(*change.decline)
                log.info("declining the next %d %s calls", change.decline[1], change.decline[0])
            _save_state(self.server)
        return Reply(200, fault_state(engine))

    def _read_body(self) -> bytes | None:
        length = self.headers.get("Content-Length")
        if length is None and "Transfer-Encoding" not in self.headers:
            return b""  # e.g. `curl -X POST .../_reset`
        if length is None or not length.isdigit():
            self.close_connection = True
            self._send(error_reply(411, "length_required", "a Content-Length header is required"))
            return None
        size = int(length)
        if size > MAX_BODY_BYTES:
            self.close_connection = True  # the body stays unread
            self._send(error_reply(413, "too_large", f"request body over {MAX_BODY_BYTES} bytes"))
            return None
        return self.rfile.read(size)

    def _act(self, action: Reply | Drop) -> None:
        if isinstance(action, Reply):
            self._send(action)
            return
        log.debug("dropping connection without an answer: %s", action.reason)
        self.close_connection = True
        with contextlib.suppress(OSError):  # the client may be gone already
            self.connection.shutdown(socket.SHUT_RDWR)

    def _send(self, reply: Reply) -> None:
        data = json.dumps(reply.body, separators=(",", ":")).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in reply.headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


@dataclass(frozen=True)
class FaultChange:
    profile: Profile | None
    source: str | None
    decline: tuple[str, int] | None


def parse_fault_change(body: bytes) -> FaultChange:
    """A POST /_fault body; ValueError names what is wrong."""
    try:
        data = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict) or set(data) - {"profile", "source", "decline_next"}:
        raise ValueError('the body is an object of "profile", "source" and "decline_next"')
    profile = None
    if "profile" in data:
        try:
            profile = validate_profile(data["profile"], "profile")
        except ProfileError as exc:
            raise ValueError(str(exc)) from None
    source = data.get("source")
    if source is not None and (not isinstance(source, str) or not 0 < len(source) <= 500):
        raise ValueError("source is the profile's name or path: a string of 1-500 characters")
    decline = data.get("decline_next")
    if decline is None:
        return FaultChange(profile, source, None)
    if not isinstance(decline, dict) or set(decline) != {"service", "count"}:
        raise ValueError('decline_next is {"service": "payment", "count": N}')
    service, count = decline["service"], decline["count"]
    if service not in SERVICES:
        raise ValueError(f"decline_next.service must be one of: {', '.join(sorted(SERVICES))}")
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 100_000:
        raise ValueError("decline_next.count must be an integer from 0 to 100000")
    return FaultChange(profile, source, (service, count))


def fault_state(engine: FakeServiceEngine) -> dict[str, Any]:
    return {
        "source": engine.source,
        "description": engine.profile.description,
        "profile": engine.profile.model_dump(mode="json", exclude_defaults=True),
        "declines_pending": engine.declines_pending(),
    }


def _save_state(server: _Server) -> None:
    if server.state_file is not None:
        _write_atomically(server.state_file, json.dumps(fault_state(server.engine)))


def _restore_state(engine: FakeServiceEngine, path: Path) -> None:
    """Take up the faults a previous process at this address chose at run time."""
    state = json.loads(path.read_text())
    engine.set_profile(validate_profile(state["profile"], str(path)), state["source"])
    for service, count in state.get("declines_pending", {}).items():
        engine.decline_next(service, count)


class FakeServices:
    """A running fake-services server (in a background thread) and its controls."""

    def __init__(self, server: _Server, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.engine = server.engine
        host, port = server.server_address[:2]
        self.host = str(host)
        self.port = int(port)
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.base_url = f"http://{shown}:{self.port}"
        self._stopped = False

    @classmethod
    def start(
        cls,
        profile: Profile | Mapping[str, Any] | str | Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int = 0,
        state_file: Path | None = None,
    ) -> FakeServices:
        engine = FakeServiceEngine(as_profile(profile), seed)
        server = _Server((host, port), engine, state_file)
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-services-{server.server_address[1]}",
            daemon=True,
        )
        thread.start()
        return cls(server, thread)

    def url(self, service: str) -> str:
        """Base URL of one service: ``{url}/{operation}`` is the operation's endpoint."""
        if service not in SERVICES:
            raise ValueError(f"unknown service {service!r}; known: {sorted(SERVICES)}")
        return f"{self.base_url}/{service}"

    def ledger(self) -> list[dict[str, Any]]:
        return self.engine.ledger()

    def tombstones(self) -> list[dict[str, Any]]:
        return self.engine.tombstones()

    def stats(self) -> dict[str, int]:
        return self.engine.stats()

    def set_profile(self, profile: Profile | Mapping[str, Any] | str | Path | None) -> None:
        self.engine.set_profile(as_profile(profile))

    def decline_next(self, service: str, count: int) -> None:
        self.engine.decline_next(service, count)

    def reset(self) -> None:
        self.engine.reset()

    def stop(self) -> None:
        """Stop serving; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self.engine.stop()  # wakes hanging requests, which then drop their connections
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeServices:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _write_atomically(path: Path, text: str) -> None:
    """So a reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def state_file_for(port_file: Path) -> Path:
    return port_file.with_name(f"{port_file.stem}.fault.json")


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.fakes.remote_services",
        description="Fake inventory, payment and shipping services with fault profiles.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--profile", type=Path, help="fault profile JSON (default: clean)")
    parser.add_argument("--port-file", type=Path, help="write the chosen port here")
    parser.add_argument("--seed", type=int, default=0, help="seed for injected faults")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    try:
        profile = load_profile(args.profile) if args.profile else Profile()
    except ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # Block the stop signals before any thread starts (threads inherit the mask), then wait
    # for one synchronously: no handler runs at an awkward moment.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    state_file = state_file_for(args.port_file) if args.port_file else None
    try:
        fakes = FakeServices.start(
            profile, host=args.host, port=args.port, seed=args.seed, state_file=state_file
        )
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    if args.profile:
        fakes.engine.set_profile(profile, source_name(args.profile))
    if state_file is not None and args.port == 0:
        state_file.unlink(missing_ok=True)
    elif state_file is not None and state_file.exists():
        try:
            _restore_state(fakes.engine, state_file)
            print(f"faults chosen at run time taken up again: {fakes.engine.source}", flush=True)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"warning: {state_file} unreadable ({exc}); using --profile", flush=True)
    try:
        if args.port_file:
            _write_atomically(args.port_file, f"{fakes.port}\n")
        print(
            f"fake remote services listening on {fakes.base_url} "
            f"(profile: {args.profile or 'clean'}, seed: {args.seed})",
            flush=True,
        )
        signum = signal.sigwait(stop_signals)
        log.info("signal %d: stopping", signum)
    finally:
        fakes.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
