"""The local host serves HTTP triggers on /api/<route>, as the Functions host routes them."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import socket
import ssl
import struct
import sys

import httpx
import pytest

from devstack.host import LocalHost
from devstack.stack.processes import wait_until

MODULE = "tests.integration.host_http_app.function_app"


@pytest.fixture
def host():
    sys.modules.pop(MODULE, None)  # get_functions() runs once per FunctionApp object
    local = LocalHost(importlib.import_module(MODULE), settings={}, host_json=None, http_port=0)
    local.start()
    yield local
    local.stop(timeout=2)


def test_routes_params_and_query_reach_the_function(host):
    response = httpx.get(f"{host.http.base_url}items/42?verbose=yes", timeout=5)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"item": "42", "verbose": "yes"}


def test_body_status_and_headers_come_back(host):
    response = httpx.post(f"{host.http.base_url}items/7/notes", content=b"hello", timeout=5)
    assert (response.status_code, response.content) == (201, b"hello")
    assert response.headers["x-item"] == "yes"


def test_unknown_route_wrong_method_and_failure_are_clear(host):
    missing = httpx.get(f"{host.http.base_url}nothing/here", timeout=5)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = httpx.delete(f"{host.http.base_url}items/42", timeout=5)
    assert wrong.status_code == 405 and "GET" in wrong.json()["error"]["message"]
    failed = httpx.get(f"{host.http.base_url}boom", timeout=5)
    assert failed.status_code == 500 and "boom" in failed.json()["error"]["message"]
    stats = host.stats()
    assert (stats["boom"].invocations, stats["boom"].failures) == (1, 1)
    assert stats["get_item"].invocations == 0


def test_a_coroutine_function_is_awaited_on_the_loop_a_sync_one_on_the_request_thread(host):
    on_loop = httpx.get(f"{host.http.base_url}threads/async", timeout=5)
    assert (on_loop.status_code, on_loop.text) == (200, "host-async-loop")
    on_thread = httpx.get(f"{host.http.base_url}threads/sync", timeout=5)
    assert on_thread.status_code == 200 and on_thread.text != "host-async-loop"
    failed = httpx.get(f"{host.http.base_url}boom-async", timeout=5)
    assert failed.status_code == 500 and "boom_async" in failed.json()["error"]["message"]
    stats = host.stats()
    assert (stats["async_thread"].successes, stats["boom_async"].failures) == (1, 1)


def test_http_triggers_are_not_served_unless_asked():
    sys.modules.pop(MODULE, None)
    local = LocalHost(importlib.import_module(MODULE), settings={}, host_json=None)
    assert not any(info.served for info in local.functions)


def raw_exchange(host, request: bytes, timeout: float = 5.0) -> bytes:
    """Send ``request`` as bytes and read until the server closes (a hang fails the test)."""
    with socket.create_connection(("127.0.0.1", host.http.port), timeout=timeout) as conn:
        conn.sendall(request)
        received = b""
        while chunk := conn.recv(65536):  # socket.timeout here: the server hung
            received += chunk
        return received


@pytest.mark.parametrize("length", [b"abc", b"-5", b"1e3", b" "])
def test_a_content_length_that_is_not_a_count_is_answered_400_and_closed(host, length):
    # Kestrel (behind the Functions host) answers 400 Bad Request to a Content-Length that is
    # not a non-negative integer; it neither waits for a body nor drops the connection silently.
    reply = raw_exchange(
        host,
        b"POST /api/items/7/notes HTTP/1.1\r\nHost: localhost\r\nContent-Length: "
        + length
        + b"\r\n\r\nhello",
    )
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "bad_content_length"
    assert host.stats()["add_note"].invocations == 0


def test_the_host_header_never_changes_the_route(host):
    # The Functions host routes on the request target; a Host header is only the URL's host.
    reply = raw_exchange(
        host,
        b"GET /api/items/42 HTTP/1.1\r\nHost: evil/api/boom?\r\nConnection: close\r\n\r\n",
    )
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert json.loads(body) == {"item": "42", "verbose": None}
    assert host.stats()["boom"].invocations == 0


@pytest.mark.parametrize(
    ("path", "item"),
    [
        ("items/a%20b", "a b"),
        ("items/o-%C3%A9t%C3%A9", "o-été"),
        ("items/50%25", "50%"),
        # %2F stays encoded (Kestrel does not decode it), so a value never spans two segments.
        ("items/a%2Fb", "a%2Fb"),
    ],
)
def test_route_parameters_are_percent_decoded_as_the_functions_host_does(host, path, item):
    response = httpx.get(f"{host.http.base_url}{path}", timeout=5)
    assert response.status_code == 200
    assert response.json()["item"] == item


def test_head_and_options_get_the_api_s_json_405_naming_the_methods(host):
    url = f"{host.http.base_url}items/42"
    options = httpx.options(url, timeout=5)
    assert options.status_code == 405 and options.headers["allow"] == "GET"
    assert options.json()["error"]["code"] == "method_not_allowed"
    head = httpx.head(url, timeout=5)
    assert head.status_code == 405 and head.headers["content-type"] == "application/json"
    assert head.content == b"", "a HEAD answer has no body"
    assert httpx.get(url, timeout=5).status_code == 200, "the connection's framing held"
    assert host.stats()["get_item"].invocations == 1


def test_a_method_no_function_serves_gets_a_json_501(host):
    reply = raw_exchange(
        host, b"BREW /api/items/42 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 501 ") and b"application/json" in head.lower()
    assert "BREW" in json.loads(body)["error"]["message"]


def test_a_too_long_url_gets_a_json_414(host):
    reply = raw_exchange(host, b"GET /api/items/" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 414 ") and b"application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "uri_too_long" and "shorten" in error["message"]


def tls_client_hello() -> bytes:
    """The first flight of a real TLS client (what `curl https://...` sends to the port)."""
    tls = ssl.create_default_context().wrap_bio(
        ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname="localhost"
    )
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def without_newlines(data: bytes) -> bytes:
    return data.replace(b"\n", b"")


def with_a_newline(data: bytes) -> bytes:
    return data if b"\n" in data else data[:60] + b"\n" + data[60:]


@pytest.mark.parametrize(
    ("request_bytes", "says"),
    [
        # A ClientHello holds random bytes: a line end in it or not, at random.
        (lambda: without_newlines(tls_client_hello()), "TLS handshake"),
        (lambda: with_a_newline(tls_client_hello()), "TLS handshake"),
        (lambda: b"\x00\x01binary\r\n\r\n", "byte 0x00"),
        (lambda: b"GET /api/items/42\r\n\r\n", "names no HTTP version"),
        (lambda: b"garbage\r\n\r\n", "Bad request syntax"),
        (lambda: b"GET /api/items/42 HTTP/1.1 extra\r\nHost: x\r\n\r\n", "version"),
        (lambda: b"GET /api/items/42 SPDY/3\r\nHost: x\r\n\r\n", "version"),
    ],
    ids=[
        "tls-no-newline",
        "tls-newline",
        "binary",
        "http-0.9",
        "one-word",
        "four-words",
        "not-http",
    ],
)
def test_a_malformed_request_gets_a_real_http_400_and_the_connection_closes(
    host, request_bytes, says
):
    """Issue 39: a TLS ClientHello sent to the HTTP port was answered with a JSON body and no
    status line (the library's HTTP/0.9 answer), or not at all when it held no line end."""
    reply = raw_exchange(host, request_bytes())
    head, _, body = reply.partition(b"\r\n\r\n")
    status, *header_lines = head.decode("iso-8859-1").split("\r\n")
    assert status == "HTTP/1.1 400 Bad Request", reply[:200]
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert error["code"] == "bad_request" and says in error["message"]
    assert host.stats()["get_item"].invocations == 0


def test_a_tls_client_is_refused_at_once_not_left_waiting(host):
    """Its handshake fails on the plain-HTTP answer (or the close), never on the timeout."""
    with socket.create_connection(("127.0.0.1", host.http.port), timeout=30) as conn:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            ssl.create_default_context().wrap_socket(conn, server_hostname="localhost")


def test_a_client_that_goes_away_is_logged_in_one_line(host, caplog, capfd):
    caplog.set_level(logging.INFO, logger="devstack.host.http")
    with socket.create_connection(("127.0.0.1", host.http.port), timeout=5) as conn:
        conn.sendall(b"GET /api/items/42 HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        # Close with a reset (linger 0), as a client that crashed or gave up does.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert wait_until(lambda: "went away" in caplog.text, timeout=30), capfd.readouterr().err
    (record,) = [r for r in caplog.records if "went away" in r.getMessage()]
    assert record.exc_info is None and "\n" not in record.getMessage()
    assert "Traceback" not in capfd.readouterr().err


ASGI_MODULE = "tests.integration.host_asgi_app.function_app"


@pytest.fixture
def asgi_host():
    sys.modules.pop(ASGI_MODULE, None)
    app = importlib.import_module(ASGI_MODULE)
    local = LocalHost(app, settings={"DEVHOST_PRINCIPAL_NAME": "ann"}, host_json=None, http_port=0)
    local.start()
    yield local
    local.stop(timeout=2)


def test_an_asgi_app_is_indexed_as_one_catch_all_http_function(asgi_host):
    """func.AsgiFunctionApp declares one HTTP function on "/{*route}": the host routes every
    path under /api/ to it, as the Azure host does, and the ASGI app routes from there."""
    (info,) = asgi_host.functions
    assert (info.name, info.trigger) == ("http_app_func", "httpTrigger")
    assert info.target == "route=/api/{*route} methods=GET,POST,DELETE,HEAD,PATCH,PUT,OPTIONS"
    got = httpx.get(f"{asgi_host.http.base_url}items/a%20b?verbose=yes", timeout=5)
    assert got.status_code == 200
    assert got.json() == {
        "item": "a b",
        "verbose": "yes",
        "path": "/api/items/a b",
        "caller": "ann",  # set by the host, as App Service Authentication would
        "thread": "host-async-loop",  # awaited on the host's loop, as the worker does
    }
    posted = httpx.post(f"{asgi_host.http.base_url}items/7/notes", content=b"hi", timeout=5)
    assert (posted.status_code, posted.json()) == (201, {"item": "7", "note": "hi"})
    missing = httpx.get(f"{asgi_host.http.base_url}nothing/here/at/all", timeout=5)
    assert missing.status_code == 404  # the ASGI app's answer: the host routed it there
    assert asgi_host.stats()["http_app_func"].invocations == 3


def test_the_asgi_app_starts_with_its_first_request_and_shuts_down_with_the_host(asgi_host):
    """Its lifespan, as a server drives it: startup before the first request is served, and
    shutdown on the same loop when the host stops."""
    events = sys.modules[ASGI_MODULE].lifespan_events
    assert events == []
    assert httpx.get(f"{asgi_host.http.base_url}items/1", timeout=5).status_code == 200
    assert events == ["startup"]
    assert asgi_host.stop(timeout=2)
    assert events == ["startup", "shutdown"]
