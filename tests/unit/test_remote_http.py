"""adapters.remote_http against scripted servers on 127.0.0.1: one POST per call whatever
happens (a slow server receives one), the call's deadline over the whole answer and the
service's bound on it, the service's connection limit, the answer's size bound, failures by
kind, TLS, the environment's proxy, a client span per call with its ``traceparent`` sent, and a
session on each event loop it is used on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from adapters.remote_http import (
    AnswerTooLarge,
    CallFailed,
    CallTimedOut,
    RemoteHttp,
    RemoteService,
)
from adapters.settings import ServiceLimits, Settings
from tests.support.certificates import Certificates
from tests.support.scripted_http import (
    Reply,
    ScriptedServer,
    answer,
    slow,
)
from tests.support.spans import recording
from tests.support.threaded_http import answering_server

pytestmark = pytest.mark.anyio

HEADERS = {"Idempotency-Key": "order-1:reserve:do:1", "Content-Type": "application/json"}


def remote(server: ScriptedServer, limits: ServiceLimits | None = None, **options) -> RemoteHttp:
    service = RemoteService("inventory", f"{server.origin}/inventory", limits or ServiceLimits())
    return RemoteHttp([service], **options)


async def test_a_call_reads_the_whole_answer_and_sends_what_it_was_given(serve) -> None:
    server = await serve(lambda request, n: (answer(201, b'{"reserved":1}', {"X-A": "b"}), False))
    http = remote(server)
    reply = await http.post("inventory", "reserve", b'{"sku":"x"}', HEADERS, timeout=2)
    await http.close()
    assert (reply.status, reply.body, reply.headers["x-a"]) == (201, b'{"reserved":1}', "b")
    assert server.requests[0].startswith(b"POST /inventory/reserve HTTP/1.1\r\n")
    assert server.requests[0].endswith(b'\r\n\r\n{"sku":"x"}')
    assert server.headers(1)["idempotency-key"] == "order-1:reserve:do:1"
    head = server.requests[0].split(b"\r\n\r\n", 1)[0].decode().lower().split("\r\n")[1:]
    names = [line.split(":", 1)[0] for line in head]
    for name in ("host", "content-length", "content-type", "idempotency-key"):
        assert names.count(name) == 1, name  # each header sent once


@pytest.mark.parametrize("kept_alive", [True, False])
async def test_a_slow_server_receives_one_post(serve, kept_alive: bool) -> None:
    """A POST that timed out may still be processed: it is never sent again here (the remote
    client decides whether to call again, with the same Idempotency-Key)."""
    server = await serve(slow(1.5, after=1 if kept_alive else 0))
    http = remote(server)
    if kept_alive:
        await http.post("inventory", "health", b"", {}, timeout=2)
    started = time.monotonic()
    with pytest.raises(CallTimedOut, match=r"within 1.000 s"):
        await http.post("inventory", "reserve", b"{}", HEADERS, timeout=1.0)
    # It waited out its deadline; the raise shows it did not wait for the answer at 1.5 s.
    assert time.monotonic() - started >= 1.0
    await asyncio.sleep(0.7)  # a resend would have been answered by now
    await http.close()
    assert server.methods() == ["POST"] * (2 if kept_alive else 1)


async def test_the_services_timeout_bounds_every_call(serve) -> None:
    server = await serve(slow(5))
    http = remote(server, ServiceLimits(timeout_s=0.3))
    with pytest.raises(CallTimedOut, match=r"within 0.300 s"):  # the service's, not the 10 s
        await http.post("inventory", "reserve", b"{}", HEADERS, timeout=10)
    with pytest.raises(CallTimedOut):
        await http.post("inventory", "reserve", b"{}", HEADERS)  # no timeout given: the service's
    await http.close()


async def test_an_answer_still_arriving_at_the_deadline_is_cut_off(serve) -> None:
    """The deadline bounds the whole answer, not each read of it."""

    async def trickle() -> AsyncIterator[bytes]:
        yield b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n"
        for part in (b"a", b"b", b"c"):
            await asyncio.sleep(0.4)  # each part well within the deadline, not the whole
            yield part

    server = await serve(lambda request, n: (trickle(), False))
    http = remote(server)
    started = time.monotonic()
    with pytest.raises(CallTimedOut, match=r"within 1.000 s"):
        await http.post("inventory", "reserve", b"{}", HEADERS, timeout=1.0)
    # It waited out its deadline; the raise shows it did not wait for the last part at 1.2 s.
    assert time.monotonic() - started >= 1.0
    await http.close()


async def test_at_most_the_services_connections_at_once(serve) -> None:
    under_way = 0
    most = 0

    async def script(request: bytes, n: int) -> Reply:
        nonlocal under_way, most
        under_way += 1
        most = max(most, under_way)
        await asyncio.sleep(0.1)
        under_way -= 1
        return answer(200), False

    server = await serve(script)
    http = remote(server, ServiceLimits(max_connections=3))
    await asyncio.gather(*(http.post("inventory", "r", b"{}", HEADERS) for _ in range(12)))
    await http.close()
    assert most == 3 and server.connections == 3


async def test_waiting_for_a_connection_counts_against_the_call(serve) -> None:
    server = await serve(slow(0.5))
    http = remote(server, ServiceLimits(max_connections=1))
    first = asyncio.ensure_future(http.post("inventory", "r", b"{}", HEADERS, timeout=2))
    await asyncio.sleep(0.05)
    with pytest.raises(CallTimedOut):
        await http.post("inventory", "r", b"{}", HEADERS, timeout=0.2)
    assert (await first).status == 200
    await http.close()
    assert server.methods() == ["POST"]


@pytest.mark.parametrize(
    "reply",
    [
        answer(200, b"x" * 2048),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"400\r\n" + b"y" * 1024
        + b"\r\n" + b"400\r\n" + b"y" * 1024 + b"\r\n0\r\n\r\n",
    ],
    ids=["declared", "chunked"],
)  # fmt: skip
async def test_an_answer_longer_than_the_bound_is_refused(serve, reply: bytes) -> None:
    server = await serve(lambda request, n: (reply, False))
    http = remote(server, max_answer_bytes=1500)
    with pytest.raises(AnswerTooLarge, match="1500"):
        await http.post("inventory", "r", b"{}", HEADERS)
    with pytest.raises(AnswerTooLarge, match="1500"):  # a call cannot read past the worker's bound
        await http.post("inventory", "r", b"{}", HEADERS, max_answer_bytes=4096)
    await http.close()


async def test_a_call_may_read_less_than_the_workers_bound(serve) -> None:
    server = await serve(lambda request, n: (answer(200, b"x" * 600), False))
    http = remote(server)
    with pytest.raises(AnswerTooLarge, match="500"):
        await http.post("inventory", "r", b"{}", HEADERS, max_answer_bytes=500)
    assert len((await http.post("inventory", "r", b"{}", HEADERS)).body) == 600
    await http.close()


async def test_failures_without_an_answer_say_what_happened(serve) -> None:
    closing = await serve(lambda request, n: None)  # reads the request, closes unanswered
    http = remote(closing)
    with pytest.raises(CallFailed, match="closed the connection"):
        await http.post("inventory", "r", b"{}", HEADERS)
    await http.close()
    malformed = await serve(lambda request, n: (b"HTTP/1.1 2xx Nope\r\n\r\n", True))
    http = remote(malformed)
    with pytest.raises(CallFailed, match=r"POST http://127\.0\.0\.1:\d+/inventory/r"):
        await http.post("inventory", "r", b"{}", HEADERS)
    await http.close()
    origin = malformed.origin
    await malformed.close()
    gone = RemoteHttp([RemoteService("inventory", f"{origin}/inventory")])
    with pytest.raises(CallFailed, match="Cannot connect"):
        await gone.post("inventory", "r", b"{}", HEADERS)
    await gone.close()
    assert closing.methods() == ["POST"]


async def test_an_unknown_service_is_refused_by_name() -> None:
    with pytest.raises(KeyError, match="payment"):
        await RemoteHttp([]).post("payment", "r", b"{}", HEADERS)


# ---------------------------------------------------------------------------------- TLS


@pytest.mark.parametrize(
    ("pair", "refusal"),
    [
        ("self_signed", "certificate refused.*self-signed"),
        ("wrong_host", "certificate refused.*(IP address mismatch|doesn't match)"),
    ],
)
async def test_a_certificate_not_for_this_host_or_not_trusted_is_refused(
    serve, certificates, pair, refusal
) -> None:
    server = await serve(
        lambda request, n: (answer(200), False), Certificates.server(getattr(certificates, pair))
    )
    options = {"ssl_context": certificates.trusting_ca()} if pair == "wrong_host" else {}
    http = remote(server, **options)
    with pytest.raises(CallFailed, match=refusal):
        await http.post("inventory", "r", b"{}", HEADERS)
    await http.close()
    assert server.requests == []


async def test_a_certificate_from_a_trusted_authority_is_accepted(serve, certificates) -> None:
    server = await serve(
        lambda request, n: (answer(200, b"secret"), False),
        Certificates.server(certificates.localhost),
    )
    http = remote(server, ssl_context=certificates.trusting_ca())
    assert (await http.post("inventory", "r", b"{}", HEADERS)).body == b"secret"
    assert (await http.post("inventory", "r", b"{}", HEADERS)).body == b"secret"
    await http.close()
    assert server.connections == 1


# ------------------------------------------------------------------------- proxy, spans


async def test_the_proxy_the_environment_names_is_used(serve, monkeypatch) -> None:
    proxy = await serve(lambda request, n: (answer(200), False))
    monkeypatch.setenv("HTTP_PROXY", proxy.origin)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    http = RemoteHttp([RemoteService("inventory", "http://inventory.invalid:8080/api")])
    await http.post("inventory", "reserve", b"{}", HEADERS)
    await http.close()
    line = proxy.requests[0].split(b"\r\n", 1)[0]
    assert line == b"POST http://inventory.invalid:8080/api/reserve HTTP/1.1"


async def test_each_call_is_a_client_span_and_sends_its_traceparent(serve) -> None:
    server = await serve(lambda request, n: (answer(503 if n == 1 else 200), False))
    exporter = InMemorySpanExporter()
    with recording(exporter) as provider:
        http = remote(server)
        with provider.get_tracer("test").start_as_current_span("agent") as parent:
            await http.post("inventory", "reserve", b"{}", HEADERS)
            await http.post("inventory", "reserve", b"{}", HEADERS)
        await http.close()
    calls = [span for span in exporter.get_finished_spans() if span.kind is SpanKind.CLIENT]
    assert len(calls) == 2
    for n, span in enumerate(calls, start=1):
        context = span.context
        assert span.parent.span_id == parent.get_span_context().span_id
        assert server.headers(n)["traceparent"].startswith(
            f"00-{context.trace_id:032x}-{context.span_id:016x}-"
        )
    assert calls[0].status.status_code is trace.StatusCode.ERROR  # the 503
    assert calls[1].status.status_code is trace.StatusCode.UNSET
    assert dict(calls[1].attributes) == {
        "http.request.method": "POST",
        "url.full": f"{server.origin}/inventory/reserve",
        "server.address": "127.0.0.1",
        "server.port": server.port,
        "http.response.status_code": 200,
    }


async def test_a_call_without_an_answer_is_an_error_span(serve) -> None:
    server = await serve(slow(5))
    exporter = InMemorySpanExporter()
    with recording(exporter):
        http = remote(server)
        with pytest.raises(CallTimedOut):
            await http.post("inventory", "reserve", b"{}", HEADERS, timeout=0.2)
        await http.close()
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is trace.StatusCode.ERROR
    assert span.events[0].attributes["exception.type"].endswith("CallTimedOut")
    assert span.attributes["error.type"] == "CallTimedOut"  # issue 39: it had none


@pytest.mark.parametrize(
    ("script", "failure", "error_type"),
    [
        (slow(5), CallTimedOut, "CallTimedOut"),
        (lambda request, n: None, CallFailed, "ServerDisconnectedError"),
        (
            lambda request, n: (b"HTTP/1.1 2xx Nope\r\n\r\n", True),
            CallFailed,
            "ClientResponseError",
        ),
        (lambda request, n: (answer(200, b"x" * 2048), False), AnswerTooLarge, "AnswerTooLarge"),
        (None, CallFailed, "ClientConnectorError"),
        (lambda request, n: (answer(503), False), None, "503"),
    ],
    ids=["timeout", "closed", "malformed", "too_large", "refused", "status"],
)
async def test_every_failed_call_is_an_error_span_with_an_error_type(
    serve, script, failure, error_type
) -> None:
    """OpenTelemetry's HTTP conventions: ``error.type`` on every failed call (issue 39)."""
    server = await serve(script or (lambda request, n: (answer(200), False)))
    if script is None:
        await server.close()  # nothing listens there any more: the connection is refused
    timeout = 0.5 if failure is CallTimedOut else 30.0  # only the timeout may run out
    exporter = InMemorySpanExporter()
    with recording(exporter):
        http = remote(server, max_answer_bytes=1500)
        if failure is None:
            await http.post("inventory", "reserve", b"{}", HEADERS, timeout=timeout)
        else:
            with pytest.raises(failure):
                await http.post("inventory", "reserve", b"{}", HEADERS, timeout=timeout)
        await http.close()
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is trace.StatusCode.ERROR
    assert span.attributes["error.type"] == error_type


# ---------------------------------------------------------------------------- event loops


def test_each_event_loop_gets_a_session_of_its_own() -> None:
    """Each asyncio.run is a new loop (orderctl's commands, each test): the same RemoteHttp
    opens a session on it rather than use the earlier loop's."""
    with answering_server(b"ok") as origin:
        http = RemoteHttp([RemoteService("inventory", f"{origin}/inventory")])
        sessions: list[Any] = []

        async def call(*, close: bool = False) -> bytes:
            reply = await http.post("inventory", "r", b"{}", HEADERS, timeout=5)
            sessions.append(http._session)
            if close:
                await http.close()
            return reply.body

        assert asyncio.run(call()) == b"ok"
        assert asyncio.run(call(close=True)) == b"ok"
    assert sessions[0] is not sessions[1] and sessions[1].closed


# ----------------------------------------------------------------------------- settings


def test_the_services_come_from_the_settings() -> None:
    settings = Settings(
        queues={},
        service_urls={"inventory": "http://inv.test/a", "payment": "http://pay.test"},
        servicebus=None,  # type: ignore[arg-type]
        storage=None,  # type: ignore[arg-type]
        remote_limits=ServiceLimits(timeout_s=3, max_connections=5),
    )
    http = RemoteHttp.from_settings(settings)
    assert http.base_url("inventory") == "http://inv.test/a"
    assert http._services["inventory"].limits == ServiceLimits(3, 5)
    assert http._services["payment"].limits == ServiceLimits(3, 5)
