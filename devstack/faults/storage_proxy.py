"""A fault-injecting HTTP proxy in front of Azurite's Table endpoint (dev stack only).

Azure Table Storage answers in ways Azurite never does: a busy partition answers ``503
ServerBusy`` with ``Retry-After``; a write that times out, or is answered ``500``, may have
been applied; a connection resets mid-request. The chaos run (``benchmarks.chaos --nemesis
storage``) points the hosts' storage connection string at this proxy, which forwards every
request to Azurite unchanged (path, query, headers and body, so Shared Key signatures still
verify) and injects, per request, from ONE seeded random sequence at the chosen rates:

- ``throttle`` (any request): ``503 ServerBusy`` with ``Retry-After`` (whole seconds) and
  ``x-ms-retry-after-ms``, without forwarding it;
- ``timeout`` (a write): forwarded; when Azurite applied it (2xx), no answer: the connection is
  held for ``hold_s`` (longer than the client's read timeout), then reset;
- ``error`` (a write): forwarded; when Azurite applied it, ``500 InternalError`` instead of its
  answer;
- ``reset`` (any request): the connection is reset (TCP RST); for a write, one time in two
  after Azurite applied it, else before it is forwarded.

A fault drawn for a write that Azurite refused (412, 409, ...) is not injected: its answer
passes unchanged, so every fault counted as ``*_after_apply`` hid a write that did happen.

A test scripts one exact failure instead (:meth:`StorageProxy.arm`): the next request of a
method and path gets the fault named, whatever the rates draw — ``reset_after_apply`` (forward,
then reset the client's connection once Azurite applied the write), ``timeout_after_apply``,
``error_after_apply``, ``reset_before_forward``, ``throttle``, or ``trickle``: forwarded, and
Azurite's answer sent at once but for its body, which follows a byte every ``trickle_s`` (a
server that never lets a read time out).

The proxy keeps its counts in ``--stats-file`` (rewritten about once a second while they change,
and at exit) and one JSON line per injected fault in ``--events-file``::

    {"pid", "started_utc", "updated_utc", "rates": {kind: rate}, "requests", "writes",
     "faults": {"throttle" | "timeout_after_apply" | "error_after_apply" |
                "reset_before_forward" | "reset_after_apply" | "trickle": n},
     "abandoned": n}

``abandoned``: trickled answers the client stopped reading before their end.

Run: ``python -m devstack.faults.storage_proxy --upstream http://127.0.0.1:10002
--port-file PATH --seed 7 --rates throttle=0.03,timeout=0.005,error=0.01,reset=0.01``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import signal
import socket
import struct
import sys
from collections import Counter
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import aiohttp
from aiohttp import web

log = logging.getLogger("storage_proxy")

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "MERGE", "DELETE"})
# Hop-by-hop headers (RFC 9110 7.6.1) and those the proxy's own framing sets.
_NOT_FORWARDED = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}
    | {"content-length", "proxy-connection"}
)
DEFAULT_HOLD_S = 40.0  # the app's Table client gives up reading after 30 s
DEFAULT_TRICKLE_S = 0.4  # well inside any read timeout: each byte restarts the client's wait
ARMABLE = frozenset(
    {"throttle", "reset_before_forward", "reset_after_apply", "timeout_after_apply"}
    | {"error_after_apply", "trickle"}
)
MAX_BODY_BYTES = 8 * 1024 * 1024  # a Table batch is at most 4 MiB
STATS_EVERY_S = 1.0
RETRY_AFTER_MS = (200, 2000)
SERVER_BUSY = {
    "odata.error": {
        "code": "ServerBusy",
        "message": {"lang": "en-US", "value": "The server is busy. (storage proxy)"},
    }
}
INTERNAL_ERROR = {
    "odata.error": {
        "code": "InternalError",
        "message": {"lang": "en-US", "value": "The server encountered an internal error."},
    }
}


@dataclass(frozen=True)
class FaultRates:
    """The fraction of requests (``throttle``, ``reset``) or of writes (``timeout``,
    ``error``) drawn for each fault."""

    throttle: float = 0.0
    timeout: float = 0.0
    error: float = 0.0
    reset: float = 0.0

    def __post_init__(self) -> None:
        for name, rate in asdict(self).items():
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"the {name} rate must be between 0 and 1, not {rate}")
        if sum(asdict(self).values()) > 1.0:
            raise ValueError(f"the fault rates add up to more than 1: {self.spec()}")

    @classmethod
    def parse(cls, spec: str) -> FaultRates:
        """``throttle=0.03,timeout=0.005`` (kinds left out: 0)."""
        known = {f.name for f in fields(cls)}
        rates: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, _, value = part.partition("=")
            if name not in known:
                raise ValueError(f"unknown storage fault {name!r}: use {', '.join(sorted(known))}")
            try:
                rates[name] = float(value)
            except ValueError:
                raise ValueError(f"the {name} rate must be a number, not {value!r}") from None
        return cls(**rates)

    def spec(self) -> str:
        return ",".join(f"{name}={rate:g}" for name, rate in asdict(self).items())

    def draw(self, rng: random.Random, write: bool) -> str | None:
        """The fault for the next request, or None. One draw per request whatever its kind,
        so the schedule is the seed's alone; a write-only fault drawn for a read is none."""
        point = rng.random()
        for name, rate in asdict(self).items():
            if point < rate:
                return name if write or name in ("throttle", "reset") else None
            point -= rate
        return None


class StorageProxy:
    """The aiohttp handler: forward, and inject what :meth:`FaultRates.draw` chose."""

    def __init__(
        self,
        upstream: str,
        rates: FaultRates,
        *,
        seed: int,
        hold_s: float = DEFAULT_HOLD_S,
        trickle_s: float = DEFAULT_TRICKLE_S,
        events_path: Path | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.rates = rates
        self.hold_s = hold_s
        self.trickle_s = trickle_s
        self.events_path = events_path
        self._rng = random.Random(seed)
        self._session: aiohttp.ClientSession | None = None
        self._armed: list[_Armed] = []
        self.requests = 0
        self.writes = 0
        self.faults: Counter[str] = Counter()
        self.abandoned = 0

    def arm(self, fault: str, *, method: str, path: str = "", times: int = 1) -> None:
        """Give ``fault`` to the next ``times`` requests of ``method`` whose path contains
        ``path``, whatever the rates draw (a ``*_after_apply`` fault still spares a write that
        Azurite refused, and is spent on it)."""
        if fault not in ARMABLE:
            raise ValueError(f"unknown fault {fault!r}: arm one of {', '.join(sorted(ARMABLE))}")
        self._armed.append(_Armed(fault, method.upper(), path, times))

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            auto_decompress=False,
            # Sign-relevant headers the client did not send must not appear on the way.
            skip_auto_headers=("Content-Type", "User-Agent", "Accept-Encoding"),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=self.hold_s + 30),
            connector=aiohttp.TCPConnector(limit=0),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def stats(self) -> dict[str, Any]:
        return {
            "rates": asdict(self.rates),
            "requests": self.requests,
            "writes": self.writes,
            "faults": dict(sorted(self.faults.items())),
            "abandoned": self.abandoned,
        }

    async def handle(self, request: web.Request) -> web.StreamResponse:
        write = request.method in WRITE_METHODS
        self.requests += 1
        self.writes += int(write)
        fault = self.rates.draw(self._rng, write)  # drawn even when armed: the seed's schedule
        armed = self._armed_for(request)
        if armed is not None:
            fault = _ARMED_AS.get(armed, armed)
        if fault == "reset":  # drawn: before or after, one time in two for a write
            fault = "reset_after_apply" if write and self._rng.random() < 0.5 else "reset_before"
        if fault == "throttle":
            return self._inject(request, "throttle", _server_busy(self._rng))
        if fault == "reset_before":
            return self._inject(request, "reset_before_forward", _reset(request))
        body = await request.read()
        try:
            answer, payload = await self._forward(request, body)
        except aiohttp.ClientError as exc:
            log.warning("Azurite did not answer %s %s: %s", request.method, request.path, exc)
            return web.Response(status=502, text=f"storage proxy: no answer from Azurite: {exc}")
        applied = write and 200 <= answer.status < 300
        if fault == "timeout" and applied:
            self._record(request, "timeout_after_apply")
            await asyncio.sleep(self.hold_s)
            return _reset(request)
        if fault == "error" and applied:
            return self._inject(request, "error_after_apply", _internal_error())
        if fault == "reset_after_apply" and applied:
            return self._inject(request, "reset_after_apply", _reset(request))
        if fault == "trickle":
            self._record(request, "trickle")
            return await self._trickle(request, answer, payload)
        return web.Response(status=answer.status, headers=answer.headers, body=payload)

    def _armed_for(self, request: web.Request) -> str | None:
        """The fault armed for ``request`` (spending it), or None."""
        for armed in self._armed:
            if armed.method == request.method and armed.path in request.path:
                armed.times -= 1
                if armed.times == 0:
                    self._armed.remove(armed)
                return armed.fault
        return None

    async def _trickle(
        self, request: web.Request, answer: _Answer, payload: bytes
    ) -> web.StreamResponse:
        """Azurite's answer, its body a byte every ``trickle_s``, until the client leaves."""
        response = web.StreamResponse(status=answer.status, headers=answer.headers)
        response.content_length = len(payload)
        await response.prepare(request)
        try:
            for n in range(len(payload)):
                await response.write(payload[n : n + 1])
                await asyncio.sleep(self.trickle_s)
            await response.write_eof()
        except ConnectionError:  # the client stopped reading (aiohttp: a reset transport)
            self.abandoned += 1
        return response

    async def _forward(self, request: web.Request, body: bytes) -> tuple[_Answer, bytes]:
        assert self._session is not None, "start the proxy first"
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body
        ) as upstream:
            payload = await upstream.read()
            kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _NOT_FORWARDED}
            return _Answer(upstream.status, kept), payload

    def _inject(
        self, request: web.Request, fault: str, response: web.StreamResponse
    ) -> web.StreamResponse:
        self._record(request, fault)
        return response

    def _record(self, request: web.Request, fault: str) -> None:
        self.faults[fault] += 1
        if self.events_path is None:
            return
        event = {
            "at": datetime.now(UTC).isoformat(),
            "fault": fault,
            "method": request.method,
            "path": request.path,
        }
        with open(self.events_path, "a") as events:
            events.write(json.dumps(event) + "\n")


@dataclass
class _Armed:
    fault: str
    method: str
    path: str
    times: int


_ARMED_AS: Final = {
    "reset_before_forward": "reset_before",
    "timeout_after_apply": "timeout",
    "error_after_apply": "error",
}
"""An armed fault by the name :meth:`StorageProxy.handle` acts on (the others: their own)."""


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: dict[str, str]


def _server_busy(rng: random.Random) -> web.Response:
    wait_ms = rng.randint(*RETRY_AFTER_MS)
    headers = {
        "Retry-After": str(math.ceil(wait_ms / 1000)),
        "x-ms-retry-after-ms": str(wait_ms),
        "x-ms-error-code": "ServerBusy",
    }
    return web.json_response(SERVER_BUSY, status=503, headers=headers)


def _internal_error() -> web.Response:
    return web.json_response(
        INTERNAL_ERROR, status=500, headers={"x-ms-error-code": "InternalError"}
    )


def _reset(request: web.Request) -> web.Response:
    """Reset the client's connection (RST: linger 0, then abort). The response returned is
    never written: aiohttp skips writing to an aborted transport."""
    transport = request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    return web.Response(status=500)


# --- the process -------------------------------------------------------------------------------


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.faults.storage_proxy", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--upstream", required=True, help="Azurite's table service, http://h:p")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (see --port-file)")
    parser.add_argument("--port-file", type=Path, help="written once listening")
    parser.add_argument("--stats-file", type=Path)
    parser.add_argument("--events-file", type=Path, help="one JSON line per injected fault")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rates", default="", help="throttle=R,timeout=R,error=R,reset=R")
    parser.add_argument(
        "--hold", type=float, default=DEFAULT_HOLD_S, help="seconds a timeout holds the answer"
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace, rates: FaultRates) -> None:
    proxy = StorageProxy(
        args.upstream,
        rates,
        seed=args.seed,
        hold_s=args.hold,
        events_path=args.events_file,
    )
    await proxy.start()
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    listener = socket.create_server((args.host, args.port), reuse_port=False)
    await web.SockSite(runner, listener).start()
    port = listener.getsockname()[1]
    if args.port_file:
        _write_atomically(args.port_file, f"{port}\n")
    print(f"storage proxy on http://{args.host}:{port} -> {args.upstream} ({rates.spec()})")
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    started = datetime.now(UTC).isoformat()
    written: dict[str, Any] | None = None
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), STATS_EVERY_S)
            if args.stats_file and proxy.stats() != written:
                written = proxy.stats()
                _write_stats(args.stats_file, started, written)
    finally:
        await runner.cleanup()
        await proxy.close()
        if args.stats_file:
            _write_stats(args.stats_file, started, proxy.stats())


def _write_stats(path: Path, started: str, stats: dict[str, Any]) -> None:
    document = {"pid": os.getpid(), "started_utc": started}
    document |= {"updated_utc": datetime.now(UTC).isoformat(), **stats}
    _write_atomically(path, json.dumps(document, indent=2) + "\n")


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s %(message)s")
    try:
        rates = FaultRates.parse(args.rates)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(args, rates))
    return 0


if __name__ == "__main__":
    sys.exit(main())
