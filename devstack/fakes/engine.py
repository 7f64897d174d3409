"""The fake services' behaviour, apart from HTTP: idempotency, the effects ledger, injected faults.

``FakeServiceEngine.handle`` turns one request into an action: a ``Reply`` to send or a ``Drop``
(close the connection without answering). It may block (latency, hangs); it is thread-safe, and
requests with different idempotency keys never wait for each other.

Order of events for one request: validate -> latency -> fail_first_n -> hang / 429 / 503 ->
(under the key's lock) replay a stored answer, or refuse (decline) or apply the effect and store
the answer -> maybe drop the connection after a fresh effect (crash-after-effect).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from devstack.fakes.catalog import SERVICES, amount, quantity
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
    seq: int
    time: str
    service: str
    operation: str
    idempotency_key: str
    order_id: str
    amount: float | None
    qty: int | None


@dataclass(frozen=True)
class _Stored:
    fingerprint: str
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
        # Striped locks serialise requests that share a key (and, rarely, a stripe). Nothing
        # slow happens under them: latency and hangs are served before.
        self._stripes = tuple(threading.Lock() for _ in range(_STRIPES))
        self._store: dict[tuple[str, str], _Stored] = {}
        self._seen: Counter[tuple[str, str]] = Counter()
        self._ledger: list[LedgerEntry] = []
        self._stats: Counter[str] = Counter()

    # -- control -----------------------------------------------------------------------------

    @property
    def profile(self) -> Profile:
        return self._profile

    def set_profile(self, profile: Profile) -> None:
        self._profile = profile  # one reference swap: each request reads it once

    def ledger(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(entry) for entry in self._ledger]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

    def reset(self) -> None:
        """Forget effects, stored answers and per-key request counts."""
        with self._lock:
            self._ledger.clear()
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
        return self._settle(service, operation, key, payload, rules, draws)

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
        payload: dict[str, Any],
        rules: FaultRules,
        draws: _Draws,
    ) -> Action:
        fingerprint = _fingerprint(operation, payload)
        with self._key_lock(service, key):
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
            reply, applied = self._decide(service, operation, key, payload, rules, draws)
            self._store[(service, key)] = _Stored(fingerprint, reply)
        if applied and draws.crash < rules.crash_after_effect_rate:
            self._count("fault.crash_after_effect")
            return Drop("injected crash after effect")
        return reply

    def _decide(
        self,
        service: str,
        operation: str,
        key: str,
        payload: dict[str, Any],
        rules: FaultRules,
        draws: _Draws,
    ) -> tuple[Reply, bool]:
        spec = SERVICES[service]
        op = spec.operations[operation]
        order_id = payload["order_id"]
        if op.forward and (
            order_id in rules.decline_order_ids or draws.decline < rules.decline_rate
        ):
            self._count("fault.decline")
            decline = spec.decline
            return error_reply(
                decline.status, decline.code, decline.message, _fault("decline")
            ), False
        with self._lock:
            seq = len(self._ledger) + 1
            self._ledger.append(
                LedgerEntry(
                    seq=seq,
                    time=self._now().isoformat(),
                    service=service,
                    operation=operation,
                    idempotency_key=key,
                    order_id=order_id,
                    amount=amount(payload),
                    qty=quantity(payload),
                )
            )
            self._stats["effects"] += 1
        return Reply(200, op.result(seq, payload)), True

    def _key_lock(self, service: str, key: str) -> threading.Lock:
        return self._stripes[hash((service, key)) % _STRIPES]

    def _pause(self, seconds: float) -> bool:
        """Sleep; False when the server is stopping."""
        if seconds <= 0:
            return not self._stopping.is_set()
        return not self._stopping.wait(seconds)

    def _count(self, what: str) -> None:
        with self._lock:
            self._stats[what] += 1


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
