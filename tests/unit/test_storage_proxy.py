"""The fault-injecting storage proxy (devstack.faults.storage_proxy) in front of a recording
upstream: each fault does what it says, a write it calls applied was applied, and what passes
through arrives unchanged."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from aiohttp import web

from devstack.faults.storage_proxy import FaultRates, StorageProxy


class Upstream:
    """Stands for Azurite: records what reaches it and answers ``status``."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        self.status = 200

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.seen.append((request.method, request.path_qs, dict(request.headers), body))
        return web.Response(status=self.status, headers={"ETag": 'W/"1"'}, body=b"stored")


async def _serve(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    listener = socket.create_server(("127.0.0.1", 0))
    await web.SockSite(runner, listener).start()
    return runner, f"http://127.0.0.1:{listener.getsockname()[1]}"


def through_proxy(
    rates: FaultRates,
    requests: list[tuple[str, dict[str, str], bytes]],
    *,
    upstream_status: int = 200,
    hold_s: float = 0.3,
    arm: tuple[str, str] | None = None,
) -> tuple[list[Any], Upstream, StorageProxy]:
    """Send ``requests`` (method, headers, body) one by one through a proxy (``arm``: a fault
    and the method it is armed for); each outcome is (status, headers, body) or the exception
    the client saw."""

    async def run() -> tuple[list[Any], Upstream, StorageProxy]:
        upstream = Upstream()
        upstream.status = upstream_status
        upstream_runner, upstream_url = await _serve(upstream.handle)
        proxy = StorageProxy(upstream_url, rates, seed=3, hold_s=hold_s, trickle_s=0.01)
        if arm is not None:
            proxy.arm(arm[0], method=arm[1], path="orders")
        await proxy.start()
        proxy_runner, proxy_url = await _serve(proxy.handle)
        outcomes: list[Any] = []
        url = f"{proxy_url}/devstoreaccount1/orders(PartitionKey='a')?$format=x"
        try:
            async with httpx.AsyncClient(timeout=5) as client:  # httpx never resends
                for method, headers, body in requests:
                    try:
                        r = await client.request(method, url, headers=headers, content=body)
                        outcomes.append((r.status_code, r.headers, r.content))
                    except httpx.TransportError as exc:
                        outcomes.append(exc)
        finally:
            await proxy_runner.cleanup()
            await proxy.close()
            await upstream_runner.cleanup()
        return outcomes, upstream, proxy

    return asyncio.run(run())


WRITE = ("PUT", {"Authorization": "SharedKey devstoreaccount1:sig", "If-Match": "*"}, b'{"a":1}')
READ = ("GET", {"Authorization": "SharedKey devstoreaccount1:sig"}, b"")


def test_without_faults_requests_and_answers_pass_unchanged():
    (outcome,), upstream, proxy = through_proxy(FaultRates(), [WRITE])
    status, headers, body = outcome
    assert (status, body, headers["ETag"]) == (200, b"stored", 'W/"1"')
    method, path_qs, seen_headers, seen_body = upstream.seen[0]
    assert (method, seen_body) == ("PUT", b'{"a":1}')
    assert path_qs == "/devstoreaccount1/orders(PartitionKey='a')?$format=x"
    assert seen_headers["Authorization"] == "SharedKey devstoreaccount1:sig"
    assert "Content-Type" not in seen_headers, "a signed header the client did not send"
    assert proxy.stats()["faults"] == {}


def test_throttle_answers_server_busy_with_retry_after_and_forwards_nothing():
    outcomes, upstream, proxy = through_proxy(FaultRates(throttle=1.0), [WRITE, READ])
    for status, headers, body in outcomes:
        assert status == 503
        assert headers["x-ms-error-code"] == "ServerBusy"
        wait_ms = int(headers["x-ms-retry-after-ms"])
        assert 200 <= wait_ms <= 2000
        assert int(headers["Retry-After"]) == -(-wait_ms // 1000)
        assert b"ServerBusy" in body
    assert upstream.seen == []
    assert proxy.stats()["faults"] == {"throttle": 2}


def test_error_after_apply_hides_an_applied_write_behind_a_500():
    outcomes, upstream, proxy = through_proxy(FaultRates(error=1.0), [WRITE, READ])
    assert outcomes[0][0] == 500 and outcomes[0][1]["x-ms-error-code"] == "InternalError"
    assert outcomes[1][0] == 200, "a read is never given a write's fault"
    assert [m for m, *_ in upstream.seen] == ["PUT", "GET"], "the write was applied"
    assert proxy.stats()["faults"] == {"error_after_apply": 1}


def test_a_write_the_store_refused_is_answered_as_it_was():
    outcomes, upstream, proxy = through_proxy(FaultRates(error=1.0), [WRITE], upstream_status=412)
    assert outcomes[0][0] == 412 and len(upstream.seen) == 1
    assert proxy.stats()["faults"] == {}, "nothing was applied, so nothing was hidden"


def test_timeout_after_apply_never_answers_and_then_resets():
    started = time.monotonic()
    outcomes, upstream, proxy = through_proxy(FaultRates(timeout=1.0), [WRITE], hold_s=1.0)
    assert time.monotonic() - started >= 1.0, "held without an answer"
    assert isinstance(outcomes[0], httpx.TransportError), outcomes[0]
    assert len(upstream.seen) == 1, "the write was applied"
    assert proxy.stats()["faults"] == {"timeout_after_apply": 1}


def test_reset_comes_before_or_after_the_write_is_applied():
    outcomes, upstream, proxy = through_proxy(FaultRates(reset=1.0), [WRITE] * 12)
    assert all(isinstance(o, httpx.TransportError) for o in outcomes), outcomes
    faults = proxy.stats()["faults"]
    assert faults["reset_before_forward"] > 0 and faults["reset_after_apply"] > 0
    assert len(upstream.seen) == faults["reset_after_apply"]


def test_trickle_sends_the_answer_whole_a_byte_at_a_time():
    outcomes, _, proxy = through_proxy(FaultRates(), [READ, READ], arm=("trickle", "GET"))
    assert [(status, body) for status, _, body in outcomes] == [(200, b"stored")] * 2
    assert outcomes[0][1]["ETag"] == 'W/"1"'
    assert proxy.stats()["faults"] == {"trickle": 1} and proxy.stats()["abandoned"] == 0


def test_an_armed_fault_goes_to_the_next_request_of_its_method_only():
    """Forward, then reset: the write is applied, the client gets no answer; the rates (none
    here) decide for every other request."""
    requests = [READ, WRITE, WRITE]
    outcomes, upstream, proxy = through_proxy(
        FaultRates(), requests, arm=("reset_after_apply", "PUT")
    )
    assert outcomes[0][0] == 200
    assert isinstance(outcomes[1], httpx.TransportError), outcomes[1]
    assert outcomes[2][0] == 200
    assert [m for m, *_ in upstream.seen] == ["GET", "PUT", "PUT"], "the reset one was applied"
    assert proxy.stats()["faults"] == {"reset_after_apply": 1}


def test_an_armed_fault_after_apply_spares_a_write_the_store_refused():
    outcomes, upstream, proxy = through_proxy(
        FaultRates(), [WRITE, WRITE], upstream_status=412, arm=("error_after_apply", "PUT")
    )
    assert [o[0] for o in outcomes] == [412, 412] and len(upstream.seen) == 2
    assert proxy.stats()["faults"] == {}, "nothing was applied, so nothing was hidden"


def test_only_a_known_fault_is_armed():
    proxy = StorageProxy("http://127.0.0.1:1", FaultRates(), seed=0)
    with pytest.raises(ValueError, match="unknown fault 'slow'"):
        proxy.arm("slow", method="GET")


def test_the_schedule_is_the_seeds_and_reads_never_draw_write_faults():
    rates = FaultRates(throttle=0.1, timeout=0.2, error=0.2, reset=0.1)

    def schedule(write: bool) -> list[str | None]:
        rng = random.Random(5)
        return [rates.draw(rng, write) for _ in range(400)]

    assert schedule(True) == schedule(True)
    assert {"throttle", "timeout", "error", "reset", None} == set(schedule(True))
    assert set(schedule(False)) == {"throttle", "reset", None}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("throttle=2", "between 0 and 1"),
        ("slow=0.1", "unknown storage fault 'slow'"),
        ("error=x", "must be a number"),
        ("throttle=0.6,reset=0.6", "add up to more than 1"),
    ],
)
def test_bad_rates_are_refused_with_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        FaultRates.parse(spec)


def test_rates_round_trip_through_their_spec():
    rates = FaultRates.parse("throttle=0.03,timeout=0.003")
    assert FaultRates.parse(rates.spec()) == rates
    assert rates.error == 0.0
