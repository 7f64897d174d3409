"""The fake remote services over real HTTP: idempotency, ledger, fault profiles, the CLI."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.fakes.profiles import ProfileError, example_profile, load_profile
from devstack.fakes.remote_services import MAX_BODY_BYTES, FakeServices
from service.remote_calls import RetryPolicy

REPO = Path(__file__).resolve().parents[2]
ORDER = {"order_id": "order-1", "amount": 42.5}


@pytest.fixture
def fakes() -> Iterator[FakeServices]:
    with FakeServices.start(seed=11) as running:
        yield running


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as client:
        yield client


def post(
    http: httpx.Client,
    fakes: FakeServices,
    path: str,
    body: dict[str, Any] | None = None,
    key: str | None = "key-1",
    **kwargs: Any,
) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return http.post(
        f"{fakes.base_url}/{path}", json=ORDER if body is None else body, headers=headers, **kwargs
    )


# -- routes and validation --------------------------------------------------------------------


def wait_for(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_health_and_unknown_routes(fakes: FakeServices, http: httpx.Client) -> None:
    health = http.get(f"{fakes.base_url}/_health")
    assert health.json() == {"status": "ok", "services": ["inventory", "payment", "shipping"]}
    assert post(http, fakes, "payment/teleport").status_code == 404
    assert post(http, fakes, "banking/charge").status_code == 404
    assert http.get(f"{fakes.base_url}/nothing").status_code == 404


def test_missing_or_invalid_idempotency_key_is_400(fakes: FakeServices, http: httpx.Client) -> None:
    missing = post(http, fakes, "payment/charge", key=None)
    assert missing.status_code == 400
    assert missing.json()["error"]["code"] == "missing_idempotency_key"
    assert "Idempotency-Key header is required" in missing.json()["error"]["message"]
    spaced = post(http, fakes, "payment/charge", key="has space")
    assert spaced.status_code == 400
    assert spaced.json()["error"]["code"] == "invalid_idempotency_key"
    assert fakes.ledger() == []


def test_malformed_bodies_are_400_or_413(fakes: FakeServices, http: httpx.Client) -> None:
    url = f"{fakes.base_url}/payment/charge"
    headers = {"Idempotency-Key": "k"}
    assert http.post(url, content=b"{nope", headers=headers).json()["error"]["code"] == (
        "invalid_json"
    )
    no_order = http.post(url, json={"amount": 1}, headers=headers)
    assert no_order.status_code == 400 and "order_id" in no_order.json()["error"]["message"]
    huge = http.post(url, content=b"x" * (MAX_BODY_BYTES + 1), headers=headers)
    assert huge.status_code == 413
    chunked = http.post(url, content=iter([b'{"order_id": "o"}']), headers=headers)
    assert chunked.status_code == 411
    assert fakes.ledger() == []


# -- idempotency ------------------------------------------------------------------------------


def test_same_key_replays_the_stored_answer_and_applies_once(
    fakes: FakeServices, http: httpx.Client
) -> None:
    first = post(http, fakes, "payment/charge")
    again = post(http, fakes, "payment/charge")
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    assert first.json()["charge_id"] == "ch-000001" and first.json()["amount"] == 42.5
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    [entry] = fakes.ledger()
    assert entry["service"] == "payment" and entry["operation"] == "charge"
    assert entry["idempotency_key"] == "key-1" and entry["order_id"] == "order-1"
    assert entry["amount"] == 42.5 and entry["seq"] == 1 and entry["time"]


def test_key_reuse_with_a_different_body_is_422(fakes: FakeServices, http: httpx.Client) -> None:
    assert post(http, fakes, "payment/charge").status_code == 200
    reused = post(http, fakes, "payment/charge", {"order_id": "order-1", "amount": 99})
    assert reused.status_code == 422
    error = reused.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert "already used for a different request" in error["message"]
    other_op = post(http, fakes, "payment/refund", {**ORDER, "undoes": "key-0"})
    assert other_op.status_code == 422
    assert other_op.json()["error"]["code"] == "idempotency_key_reused"
    assert len(fakes.ledger()) == 1


def test_keys_are_per_service(fakes: FakeServices, http: httpx.Client) -> None:
    assert post(http, fakes, "payment/charge").status_code == 200
    assert post(http, fakes, "shipping/create").status_code == 200
    assert [e["service"] for e in fakes.ledger()] == ["payment", "shipping"]


def test_concurrent_duplicates_apply_once(
    fakes: FakeServices, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Widen the race window: deciding and applying an effect now takes 50 ms, so without the
    # per-key lock every duplicate would find the store empty and apply the effect again.
    decide = fakes.engine._forward

    def slow_decide(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)
        return decide(*args, **kwargs)

    monkeypatch.setattr(fakes.engine, "_forward", slow_decide)
    barrier = threading.Barrier(16)

    def charge(_: int) -> httpx.Response:
        barrier.wait(10)
        return post(http, fakes, "payment/charge", key="dup-key")

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(charge, range(16)))
    assert {a.status_code for a in answers} == {200}
    assert len({a.text for a in answers}) == 1
    assert sum("Idempotent-Replayed" in a.headers for a in answers) == 15
    assert len(fakes.ledger()) == 1


def test_reset_forgets_effects_tombstones_and_keys(fakes: FakeServices, http: httpx.Client) -> None:
    post(http, fakes, "inventory/reserve", {"order_id": "o", "items": [{"qty": 2}, {"qty": 3}]})
    assert fakes.ledger()[0]["qty"] == 5
    post(http, fakes, "inventory/release", {"order_id": "o", "undoes": "never-done"}, key="u")
    assert len(fakes.tombstones()) == 1
    assert http.post(f"{fakes.base_url}/_reset").json() == {"reset": True}
    empty = {"count": 0, "entries": [], "tombstones": []}
    assert http.get(f"{fakes.base_url}/_ledger").json() == empty
    assert http.get(f"{fakes.base_url}/_tombstones").json() == {"count": 0, "entries": []}
    again = post(http, fakes, "inventory/reserve", {"order_id": "o2", "qty": 1})
    assert again.status_code == 200 and "Idempotent-Replayed" not in again.headers
    revived = post(http, fakes, "inventory/reserve", {"order_id": "o"}, key="never-done")
    assert revived.status_code == 200  # the tombstone is gone too


# -- faults -----------------------------------------------------------------------------------


def test_transient_503(fakes: FakeServices, http: httpx.Client) -> None:
    fakes.set_profile({"default": {"transient_rate": 1.0}})
    answer = post(http, fakes, "payment/charge")
    assert answer.status_code == 503 and answer.headers["X-Fake-Fault"] == "transient"
    assert fakes.ledger() == []


def test_throttle_429_with_retry_after(fakes: FakeServices, http: httpx.Client) -> None:
    fakes.set_profile({"default": {"throttle_rate": 1.0, "retry_after_seconds": 3}})
    answer = post(http, fakes, "shipping/create")
    assert answer.status_code == 429 and answer.headers["Retry-After"] == "3"
    assert fakes.ledger() == []


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("inventory/reserve", 409, "out_of_stock"),
        ("payment/charge", 402, "card_declined"),
        ("shipping/create", 422, "address_invalid"),
    ],
)
def test_declines_per_service(
    fakes: FakeServices, http: httpx.Client, path: str, status: int, code: str
) -> None:
    fakes.set_profile({"default": {"decline_rate": 1.0}})
    answer = post(http, fakes, path)
    assert answer.status_code == status and answer.json()["error"]["code"] == code
    assert post(http, fakes, path).status_code == status  # the refusal is stored and replayed
    assert fakes.ledger() == []


def test_declines_by_order_id_and_never_for_compensations(
    fakes: FakeServices, http: httpx.Client
) -> None:
    fakes.set_profile({"services": {"payment": {"decline_order_ids": ["order-bad"]}}})
    fakes.set_profile(
        {"default": {"decline_rate": 1.0}, "services": {"payment": {"decline_rate": 0.0}}}
    )
    bad = {"order_id": "order-bad", "amount": 5}
    assert post(http, fakes, "payment/charge", bad, key="a").status_code == 200
    fakes.set_profile({"services": {"payment": {"decline_order_ids": ["order-bad"]}}})
    assert post(http, fakes, "payment/charge", bad, key="a2").status_code == 402
    assert post(http, fakes, "payment/charge", ORDER, key="b").status_code == 200
    refund = post(http, fakes, "payment/refund", {**bad, "undoes": "a"}, key="c")
    assert refund.status_code == 200 and refund.json()["status"] == "refunded"
    assert post(http, fakes, "shipping/create", bad, key="d").status_code == 200
    assert [e["idempotency_key"] for e in fakes.ledger()] == ["a", "b", "c", "d"]


def test_crash_after_effect_applies_then_drops(fakes: FakeServices, http: httpx.Client) -> None:
    fakes.set_profile({"default": {"crash_after_effect_rate": 1.0}})
    with pytest.raises(httpx.RemoteProtocolError):
        post(http, fakes, "payment/charge")
    assert len(fakes.ledger()) == 1  # the effect happened
    replay = post(http, fakes, "payment/charge")  # a replay is not a fresh effect: no crash
    assert replay.status_code == 200 and replay.json()["effect_seq"] == 1
    assert len(fakes.ledger()) == 1


def test_crash_after_effect_needs_an_effect(fakes: FakeServices, http: httpx.Client) -> None:
    fakes.set_profile({"default": {"crash_after_effect_rate": 1.0, "decline_rate": 1.0}})
    declined = post(http, fakes, "payment/charge")  # refused: no effect, so no crash
    assert declined.status_code == 402
    assert fakes.stats().get("fault.crash_after_effect", 0) == 0


def test_hang_then_respond_late(fakes: FakeServices, http: httpx.Client) -> None:
    fakes.set_profile({"default": {"hang_rate": 1.0, "hang_seconds": 0.3}})
    started = time.monotonic()
    answer = post(http, fakes, "payment/charge")
    assert answer.status_code == 200 and time.monotonic() - started >= 0.3
    # A hang far past the client's read timeout, however late this thread reads (a loaded
    # machine): the timeout fires, never the answer.
    fakes.set_profile({"default": {"hang_rate": 1.0, "hang_seconds": 30}})
    with pytest.raises(httpx.ReadTimeout):
        post(http, fakes, "payment/charge", key="k2", timeout=0.5)


def test_hang_then_close(fakes: FakeServices, http: httpx.Client) -> None:
    fakes.set_profile({"default": {"hang_rate": 1.0, "hang_seconds": 0.3, "hang_then": "close"}})
    started = time.monotonic()
    with pytest.raises(httpx.RemoteProtocolError):
        post(http, fakes, "payment/charge")
    assert time.monotonic() - started >= 0.3
    assert fakes.ledger() == []


def test_a_hang_does_not_block_other_requests(fakes: FakeServices, http: httpx.Client) -> None:
    fakes.set_profile({"services": {"shipping": {"hang_rate": 1.0, "hang_seconds": 30}}})
    errors: list[BaseException] = []

    def hang() -> None:
        try:
            post(http, fakes, "shipping/create")
        except httpx.HTTPError as exc:
            errors.append(exc)

    hung = threading.Thread(target=hang, daemon=True)
    hung.start()
    wait_for(lambda: fakes.stats().get("fault.hang") == 1)  # the shipping request is hanging
    for n in range(5):
        assert post(http, fakes, "payment/charge", key=f"p{n}").status_code == 200
    assert hung.is_alive() and not errors, "answered while the shipping request still hung"
    fakes.stop()  # wakes the hung request: it drops its connection
    hung.join(5)
    assert not hung.is_alive()
    assert len(errors) == 1  # dropped, never answered


def test_latency_fixed_and_uniform(
    fakes: FakeServices, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each request waits the latency drawn for it (at least that long: a loaded machine only
    adds), and the draws are within the profile's bounds (asked of the engine, not timed)."""
    pause = fakes.engine._pause
    paused: list[float] = []

    def recorded(seconds: float) -> bool:
        paused.append(seconds)
        return pause(seconds)

    monkeypatch.setattr(fakes.engine, "_pause", recorded)
    fakes.set_profile({"default": {"latency": {"fixed_ms": 150}}})
    started = time.monotonic()
    post(http, fakes, "inventory/reserve")
    assert time.monotonic() - started >= 0.15
    assert paused == [0.15]
    fakes.set_profile({"default": {"latency": {"min_ms": 50, "max_ms": 80}}})
    for n in range(5):
        started = time.monotonic()
        post(http, fakes, "inventory/reserve", key=f"k{n + 2}")
        assert time.monotonic() - started >= 0.05
    assert all(0.05 <= seconds <= 0.08 for seconds in paused[1:]), paused
    assert len(set(paused[1:])) > 1, "drawn, not fixed"


def test_fail_first_n_per_key(fakes: FakeServices, http: httpx.Client) -> None:
    fakes.set_profile({"services": {"payment": {"fail_first_n": 2}}})
    statuses = [post(http, fakes, "payment/charge").status_code for _ in range(3)]
    assert statuses == [503, 503, 200]
    assert post(http, fakes, "payment/charge", key="other").status_code == 503
    assert post(http, fakes, "inventory/reserve").status_code == 200  # other service: clean
    assert len(fakes.ledger()) == 2


def test_seeded_faults_are_reproducible(http: httpx.Client) -> None:
    profile = {"default": {"transient_rate": 0.5}}

    def statuses(seed: int) -> list[int]:
        with FakeServices.start(profile, seed=seed) as running:
            return [
                post(http, running, "payment/charge", key=f"k{n}").status_code for n in range(24)
            ]

    first = statuses(5)
    assert first == statuses(5)
    assert first != statuses(6)
    assert {200, 503} == set(first)


# -- profiles ---------------------------------------------------------------------------------


def test_profile_changes_at_run_time(fakes: FakeServices, http: httpx.Client) -> None:
    url = f"{fakes.base_url}/_profile"
    assert post(http, fakes, "payment/charge", key="a").status_code == 200
    changed = http.post(url, json={"description": "down", "default": {"transient_rate": 1.0}})
    assert changed.status_code == 200
    assert http.get(url).json()["default"]["transient_rate"] == 1.0
    assert post(http, fakes, "payment/charge", key="b").status_code == 503
    fakes.set_profile(example_profile("clean"))
    assert http.get(url).json()["default"]["transient_rate"] == 0.0
    assert post(http, fakes, "payment/charge", key="b").status_code == 200


def test_bad_profile_is_refused_with_line_and_column(
    fakes: FakeServices, http: httpx.Client
) -> None:
    url = f"{fakes.base_url}/_profile"
    broken = b'{\n  "default": {\n    "transient_rate": 0.5,\n  }\n}'
    answer = http.post(url, content=broken)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_profile"
    assert "line 4 column 3" in answer.json()["error"]["message"]

    wrong = http.post(url, json={"default": {"transient_rate": 2, "retries": 1}})
    message = wrong.json()["error"]["message"]
    assert wrong.status_code == 400
    assert "default.transient_rate" in message and "default.retries" in message

    too_much = {"default": {"transient_rate": 0.6}, "services": {"payment": {"hang_rate": 0.6}}}
    message = http.post(url, json=too_much).json()["error"]["message"]
    assert "services.payment" in message and "at most 1" in message
    assert http.get(url).json()["default"]["transient_rate"] == 0.0  # old profile still in force


def test_example_profiles_load() -> None:
    for name in ("clean", "flaky", "chaotic", "stress"):
        profile = load_profile(example_profile(name))
        assert profile.description
    stress = load_profile(example_profile("stress"))
    for service in ("inventory", "payment", "shipping"):
        rules = stress.rules_for(service)
        assert rules.transient_rate + rules.throttle_rate == pytest.approx(0.20)
        assert rules.hang_then == "respond" and rules.hang_rate > 0
        # A hang outlasts an agent attempt (RetryPolicy.attempt_timeout, default 10 s) and the
        # quick demo's step budget, so the forward call lands after the agent gave up on it.
        assert rules.hang_seconds > RetryPolicy().attempt_timeout
        assert rules.hang_seconds > float(_quick_settings()["STEP_TIMEOUT_SECONDS"])
        assert rules.decline_rate > 0 and rules.crash_after_effect_rate > 0
    chaotic = load_profile(example_profile("chaotic"))
    assert chaotic.rules_for("payment").decline_order_ids == ["order-card-declined"]
    assert chaotic.rules_for("payment").crash_after_effect_rate == 0.05  # from the default
    with pytest.raises(ProfileError, match="no example profile"):
        example_profile("calm")


def _quick_settings() -> dict[str, str]:
    """orderctl.demo.QUICK_SETTINGS, read from the source (importing the demo starts a lot)."""
    tree = ast.parse((REPO / "orderctl" / "demo.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "QUICK_SETTINGS":
            return ast.literal_eval(node.value)
    raise AssertionError("orderctl/demo.py has no QUICK_SETTINGS")


# -- command line -----------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "devstack.fakes.remote_services", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_cli_serves_until_sigterm(tmp_path: Path, http: httpx.Client) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text('{"services": {"payment": {"fail_first_n": 1}}}')
    port_file = tmp_path / "run" / "port"
    proc = _cli("--port", "0", "--port-file", str(port_file), "--profile", str(profile))
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no port file"
            time.sleep(0.05)
        base = f"http://127.0.0.1:{int(port_file.read_text())}"
        headers = {"Idempotency-Key": "cli-1"}
        first = http.post(f"{base}/payment/charge", json=ORDER, headers=headers)
        second = http.post(f"{base}/payment/charge", json=ORDER, headers=headers)
        assert (first.status_code, second.status_code) == (503, 200)
        assert http.get(f"{base}/_ledger").json()["count"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"listening on {base}" in out


def test_cli_refuses_a_bad_profile_file(tmp_path: Path) -> None:
    profile = tmp_path / "bad.json"
    profile.write_text('{\n  "default": {"transient_rate": 0.1,,}\n}')
    proc = _cli("--profile", str(profile))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert f"{profile}: invalid JSON at line 2 column" in err
