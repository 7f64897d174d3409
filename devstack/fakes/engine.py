"""The fake services' behaviour, apart from HTTP: idempotency, undo, the ledger, injected faults.

``FakeServiceEngine.handle`` turns one request into an action: a ``Reply`` to send or a ``Drop``
(close the connection without answering). Its controls: the fault profile in force (and where
it came from: ``source``), and forced declines, "decline the next N forward calls of this
service" (:meth:`FakeServiceEngine.decline_next`), consumed by forward calls seen for the first
time (a replay of a stored answer, an undo and a refused key consume none).

It may block (latency, hangs); it is thread-safe, and requests with different idempotency keys
never wait for each other (an undo waits for the forward call it names, and only for that one).

Order of events for one request: validate -> latency -> fail_first_n -> hang / 429 / 503 ->
(under the key's lock; for an undo, under the forward key's lock too) replay a stored answer,
or settle: a forward call is refused if its key was undone before it was applied (tombstone) or
if it is declined, and applied otherwise; an undo is applied if the forward call it names took
effect, and otherwise records a tombstone for that key and answers ``nothing_to_undo`` -> store
the answer -> maybe drop the connection after a fresh effect or tombstone (crash-after-effect).

The contract a real service must meet is docs/remote-service-contract.md.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from devstack.fakes.catalog import SERVICES, Operation, ServiceSpec, amount, quantity
from devstack.fakes.profiles import FaultRules, Profile

_KEY = re.compile(r"^[!-~]{1,255}$")  # visible ASCII, no spaces
_MAX_ORDER_ID = 200
_STRIPES = 64


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Drop:
    """Close the connection without an answer."""

    reason: str


Action = Reply | Drop


@dataclass(frozen=True)
class LedgerEntry:
    """One effect. ``undoes`` is None for a forward effect, the forward key for an undo."""

    seq: int
    time: str
    service: str
    operation: str
    idempotency_key: str
    order_id: str
    amount: float | None
    qty: int | None
    undoes: str | None = None


@dataclass(frozen=True)
class Tombstone:
    """A forward key undone before it took effect: the service refuses it for ever."""

    seq: int
    time: str
    service: str
    idempotency_key: str
    """The forward key that will never take effect."""
    undo_key: str
    order_id: str


@dataclass(frozen=True)
class _Stored:
    fingerprint: str
    operation: str
    reply: Reply


def error_reply(status: int, code: str, message: str, *headers: tuple[str, str]) -> Reply:
    return Reply(status, {"error": {"code": code, "message": message}}, tuple(headers))


def _fault(kind: str) -> tuple[str, str]:
    return ("X-Fake-Fault", kind)


@dataclass(frozen=True)
class _Draws:
    """Every random choice for one request, drawn up front in a fixed order."""

    latency: float
    fault: float
    decline: float
    crash: float

    @classmethod
    def make(cls, rules: FaultRules, seed: int, service: str, key: str, n: int) -> _Draws:
        rng = random.Random(f"{seed}|{service}|{key}|{n}")
        return cls(rules.latency.sample_seconds(rng), rng.random(), rng.random(), rng.random())


class FakeServiceEngine:
    def __init__(
        self,
        profile: Profile,
        seed: int = 0,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._profile = profile
        self._seed = seed
        self._now = now
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        # Striped locks serialise requests that share a key (and, rarely, a stripe); an undo
        # holds its forward key's stripe as well, taken in stripe order so two never deadlock.
        # Nothing slow happens under them: latency and hangs are served before.
        self._stripes = tuple(threading.Lock() for _ in range(_STRIPES))
        self._store: dict[tuple[str, str], _Stored] = {}
        self._seen: Counter[tuple[str, str]] = Counter()
        self._ledger: list[LedgerEntry] = []
        self._tombstones: dict[tuple[str, str], Tombstone] = {}
        self._undone: dict[tuple[str, str], str] = {}  # (service, forward key) -> undo key
        self._stats: Counter[str] = Counter()
        self._source = "clean" if profile == Profile() else "given at start"
        self._declines: Counter[str] = Counter()

    # -- control -----------------------------------------------------------------------------

    @property
    def profile(self) -> Profile:
        return self._profile

    @property
    def source(self) -> str:
        """Where the profile in force came from: a name (clean, flaky, ...) or a path."""
        return self._source

    def set_profile(self, profile: Profile, source: str = "set at run time") -> None:
        self._profile = profile  # one reference swap: each request reads it once
        self._source = source

    def decline_next(self, service: str, count: int) -> None:
        """Decline the next ``count`` forward calls of ``service`` (0: stop declining)."""
        if service not in SERVICES:
            raise ValueError(f"unknown service {service!r}; known: {', '.join(sorted(SERVICES))}")
        if not 0 <= count <= 100_000:
            raise ValueError("count must be from 0 to 100000")
        with self._lock:
            self._declines[service] = count

    def declines_pending(self) -> dict[str, int]:
        with self._lock:
            return {service: n for service, n in sorted(self._declines.items()) if n > 0}

    def _take_decline(self, service: str) -> bool:
        with self._lock:
            if self._declines[service] <= 0:
                return False
            self._declines[service] -= 1
            return True

    def ledger(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(entry) for entry in self._ledger]

    def tombstones(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(entry) for entry in self._tombstones.values()]

    def snapshot(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Ledger and tombstones read together, so a checker sees one consistent state."""
        with self._lock:
            return (
                [asdict(entry) for entry in self._ledger],
                [asdict(entry) for entry in self._tombstones.values()],
            )

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

    def reset(self) -> None:
        """Forget effects, tombstones, stored answers and per-key request counts."""
        with self._lock:
            self._ledger.clear()
            self._tombstones.clear()
            self._undone.clear()
            self._store.clear()
            self._seen.clear()
            self._stats.clear()

    def stop(self) -> None:
        """Wake every sleeping request (latency, hang) so that it ends with a Drop."""
        self._stopping.set()

    # -- requests ----------------------------------------------------------------------------

    def handle(self, service: str, operation: str, key: str | None, raw_body: bytes) -> Action:
        spec = SERVICES.get(service)
        if spec is None or operation not in spec.operations:
            return error_reply(404, "not_found", f"no operation {service}/{operation}")
        if key is None or key == "":
            return error_reply(
                400, "missing_idempotency_key", "the Idempotency-Key header is required"
            )
        if not _KEY.match(key):
            return error_reply(
                400,
                "invalid_idempotency_key",
                "Idempotency-Key must be 1-255 visible ASCII characters without spaces",
            )
        payload = _parse_payload(raw_body)
        if isinstance(payload, Reply):
            return payload
        undoes = _check_undoes(spec.operations[operation], key, payload)
        if isinstance(undoes, Reply):
            return undoes

        rules = self._profile.rules_for(service)
        with self._lock:
            self._seen[(service, key)] += 1
            n = self._seen[(service, key)]
            self._stats["requests"] += 1
        draws = _Draws.make(rules, self._seed, service, key, n)

        if not self._pause(draws.latency):
            return Drop("server stopping")
        early = self._early_fault(rules, draws, n)
        if early is not None:
            return early
        return self._settle(service, operation, key, undoes, payload, rules, draws)

    def _early_fault(self, rules: FaultRules, draws: _Draws, n: int) -> Action | None:
        """Faults before the idempotency store is touched (they may hit a replay too)."""
        if n <= rules.fail_first_n:
            self._count("fault.fail_first_n")
            return error_reply(
                503,
                "unavailable",
                f"injected: request {n} of this key (fail_first_n={rules.fail_first_n})",
                _fault("fail_first_n"),
            )
        hang_edge = rules.hang_rate
        throttle_edge = hang_edge + rules.throttle_rate
        transient_edge = throttle_edge + rules.transient_rate
        if draws.fault < hang_edge:
            self._count("fault.hang")
            if not self._pause(rules.hang_seconds) or rules.hang_then == "close":
                return Drop("injected hang")
            return None  # answer late, normally
        if draws.fault < throttle_edge:
            self._count("fault.throttle")
            return error_reply(
                429,
                "too_many_requests",
                "injected throttling",
                ("Retry-After", str(rules.retry_after_seconds)),
                _fault("throttle"),
            )
        if draws.fault < transient_edge:
            self._count("fault.transient")
            return error_reply(
                503, "unavailable", "injected transient failure", _fault("transient")
            )
        return None

    def _settle(
        self,
        service: str,
        operation: str,
        key: str,
        undoes: str | None,
        payload: dict[str, Any],
        rules: FaultRules,
        draws: _Draws,
    ) -> Action:
        fingerprint = _fingerprint(operation, payload)
        with self._key_locks(service, key, undoes):
            stored = self._store.get((service, key))
            if stored is not None:
                if stored.fingerprint != fingerprint:
                    return error_reply(
                        422,
                        "idempotency_key_reused",
                        f"Idempotency-Key {key!r} was already used for a different request "
                        f"to {service}; use a new key for a new request",
                    )
                self._count("replays")
                return Reply(
                    stored.reply.status,
                    stored.reply.body,
                    (*stored.reply.headers, ("Idempotent-Replayed", "true")),
                )
            spec = SERVICES[service]
            op = spec.operations[operation]
            if undoes is None:
                reply, changed = self._forward(spec, op, key, payload, rules, draws)
            else:
                forward = self._store.get((service, undoes))
                if forward is not None and forward.operation != op.reverses:
                    # A client bug, not a state of the world: answered, never stored.
                    return error_reply(
                        422,
                        "undoes_mismatch",
                        f"undoes names {undoes!r}, a {forward.operation} request; "
                        f"{operation} undoes {op.reverses} requests only",
                    )
                reply, changed = self._undo(spec, op, key, undoes, forward, payload)
            self._store[(service, key)] = _Stored(fingerprint, operation, reply)
        if changed and draws.crash < rules.crash_after_effect_rate:
            self._count("fault.crash_after_effect")
            return Drop("injected crash after effect")
        return reply

    def _forward(
        self,
        spec: ServiceSpec,
        op: Operation,
        key: str,
        payload: dict[str, Any],
        rules: FaultRules,
        draws: _Draws,
    ) -> tuple[Reply, bool]:
        """A forward call seen for the first time: refused, declined or applied."""
        order_id = payload["order_id"]
        tombstone = self._tombstones.get((spec.name, key))
        if tombstone is not None:
            self._count("refused_after_undo")
            return error_reply(
                409,
                "undone_before_applied",
                f"Idempotency-Key {key!r}: this key was undone before it was applied; it will "
                f"never take effect (undone by {tombstone.undo_key!r})",
            ), False
        drawn = order_id in rules.decline_order_ids or draws.decline < rules.decline_rate
        forced = not drawn and self._take_decline(spec.name)
        if drawn or forced:
            self._count("fault.decline_next" if forced else "fault.decline")
            decline = spec.decline
            return error_reply(
                decline.status, decline.code, decline.message, _fault("decline")
            ), False
        seq = self._record(spec.name, op.name, key, payload, undoes=None)
        return Reply(200, op.result(seq, payload)), True

    def _undo(
        self,
        spec: ServiceSpec,
        op: Operation,
        key: str,
        undoes: str,
        forward: _Stored | None,
        payload: dict[str, Any],
    ) -> tuple[Reply, bool]:
        """An undo seen for the first time: undo the forward effect, or tombstone its key."""
        order_id = payload["order_id"]
        if forward is not None and 200 <= forward.reply.status < 300:
            earlier = self._undone.get((spec.name, undoes))
            if earlier is not None:
                return error_reply(
                    409,
                    "already_undone",
                    f"{undoes!r} was already undone by {earlier!r}; it is undone once only",
                ), False
            self._undone[(spec.name, undoes)] = key
            seq = self._record(spec.name, op.name, key, payload, undoes=undoes)
            return Reply(200, {**op.result(seq, payload), "undoes": undoes}), True
        # Never seen, refused, or still on its way (a hang): it must never take effect now.
        changed = (spec.name, undoes) not in self._tombstones
        if changed:
            with self._lock:
                self._tombstones[(spec.name, undoes)] = Tombstone(
                    seq=len(self._tombstones) + 1,
                    time=self._now().isoformat(),
                    service=spec.name,
                    idempotency_key=undoes,
                    undo_key=key,
                    order_id=order_id,
                )
                self._stats["tombstones"] += 1
        return Reply(
            200, {"order_id": order_id, "status": "nothing_to_undo", "undoes": undoes}
        ), changed

    def _record(
        self,
        service: str,
        operation: str,
        key: str,
        payload: dict[str, Any],
        *,
        undoes: str | None,
    ) -> int:
        with self._lock:
            seq = len(self._ledger) + 1
            self._ledger.append(
                LedgerEntry(
                    seq=seq,
                    time=self._now().isoformat(),
                    service=service,
                    operation=operation,
                    idempotency_key=key,
                    order_id=payload["order_id"],
                    amount=amount(payload),
                    qty=quantity(payload),
                    undoes=undoes,
                )
            )
            self._stats["effects"] += 1
            if undoes is not None:
                self._stats["undos"] += 1
        return seq

    def _key_locks(self, service: str, key: str, undoes: str | None) -> ExitStack:
        """The stripe locks of ``key`` and, for an undo, of the forward key, in stripe order."""
        stripes = {hash((service, key)) % _STRIPES}
        if undoes is not None:
            stripes.add(hash((service, undoes)) % _STRIPES)
        stack = ExitStack()
        for index in sorted(stripes):
            stack.enter_context(self._stripes[index])
        return stack

    def _pause(self, seconds: float) -> bool:
        """Sleep; False when the server is stopping."""
        if seconds <= 0:
            return not self._stopping.is_set()
        return not self._stopping.wait(seconds)

    def _count(self, what: str) -> None:
        with self._lock:
            self._stats[what] += 1


def _check_undoes(op: Operation, key: str, payload: dict[str, Any]) -> str | Reply | None:
    """The forward key an undo names (None for a forward call), or a 400 saying what is wrong."""
    undoes = payload.get("undoes")
    if op.forward:
        if undoes is not None:
            return error_reply(
                400,
                "invalid_request",
                f"undoes belongs on an undo only; {op.name} is a forward operation",
            )
        return None
    if "undoes" not in payload:
        return error_reply(
            400,
            "invalid_request",
            f'an undo must name the call it undoes: add "undoes": "<the Idempotency-Key of '
            f'the {op.reverses} call>" to the body',
        )
    if not isinstance(undoes, str) or not _KEY.match(undoes):
        return error_reply(
            400,
            "invalid_request",
            "undoes must be the forward call's Idempotency-Key: 1-255 visible ASCII "
            "characters without spaces",
        )
    if undoes == key:
        return error_reply(
            400,
            "invalid_request",
            "undoes names this request's own Idempotency-Key; it must name the "
            f"{op.reverses} call's",
        )
    return undoes


def _parse_payload(raw: bytes) -> dict[str, Any] | Reply:
    try:
        payload = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return error_reply(400, "invalid_json", f"request body is not valid JSON: {exc}")
    if not isinstance(payload, dict):
        return error_reply(400, "invalid_request", "request body must be a JSON object")
    order_id = payload.get("order_id")
    if not isinstance(order_id, str) or not 0 < len(order_id) <= _MAX_ORDER_ID:
        return error_reply(
            400, "invalid_request", f"order_id must be a string of 1-{_MAX_ORDER_ID} characters"
        )
    return payload


def _fingerprint(operation: str, payload: dict[str, Any]) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{operation}\n{canonical}".encode()).hexdigest()
