"""HTTP triggers behind a local server, routed like the Functions host: `/api/<route>`.

Route templates use the host's syntax (`orders/{order_id}/resubmit`, optional `{x:int}`-style
constraints are matched as one path segment; `{*rest}` takes the rest of the path, as the one
route `func.AsgiFunctionApp` declares does, so an ASGI app such as the operations app's FastAPI
is driven as the Azure host drives it). Function keys are not checked locally, as with
`func start`; the Azure host enforces them (every operator function is AuthLevel.FUNCTION).

As the Functions host (ASP.NET Core behind Kestrel) does: routing uses the request target's
path only, never the Host header; route parameters are percent-decoded, except ``%2F``, which
stays encoded so that a parameter never spans two path segments; a Content-Length that is not
a non-negative integer is answered 400 and the connection closed (its body cannot be framed).
Every answer the server makes itself is the API's JSON error, never the standard library's
HTML page: HEAD and OPTIONS on a route that does not declare them get a 405 naming the methods
that are allowed, a method nothing serves 501, a request line over 64 KiB 414. Anything that is
not an HTTP/1.x request gets a real HTTP/1.1 400 (status line, headers, the JSON error) and the
connection closes, as Kestrel answers it: a request line that cannot be parsed, one without a
version (the standard library would serve it as HTTP/0.9, with no status line), and bytes that
cannot begin a request at all - a TLS handshake sent to this plain-HTTP port is refused at its
first byte, without waiting for a line end it may never send. A client that goes away
mid-request is logged in one line.

A coroutine function is awaited on the host's event loop, as the Python worker awaits it (the
request's thread waits for it); a sync function runs on the request's thread, as the worker runs
one on its thread pool.

App Service Authentication sets ``X-MS-CLIENT-PRINCIPAL-NAME`` (and drops any such header a
client sends) before the function runs; the operator API takes the caller's identity from it.
Locally the server does the same with ``principal``, a configured name (the host's
``DEVHOST_PRINCIPAL_NAME`` setting): a client cannot choose who it is here either.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import sys
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import azure.functions as func

from devstack.host.indexing import HttpTrigger, IndexedFunction
from devstack.host.invoke import Invoker
from devstack.host.stats import StatsCounter

log = logging.getLogger("devstack.host.http")

ROUTE_PREFIX = "/api/"
MAX_BODY_BYTES = 1024 * 1024
PRINCIPAL_HEADERS = (
    "X-MS-CLIENT-PRINCIPAL-NAME",
    "X-MS-CLIENT-PRINCIPAL-ID",
    "X-MS-CLIENT-PRINCIPAL-IDP",
    "X-MS-CLIENT-PRINCIPAL",
)
_REFUSALS = {
    HTTPStatus.REQUEST_URI_TOO_LONG: (
        "uri_too_long",
        "the request line is longer than 65,536 bytes: shorten the URL (send long values in "
        "a POST body)",
    ),
}
"""The API's code and message for what the standard library refuses before routing; any other
refusal is named after its status (``bad_request``) with the library's message."""
_METHOD_START = frozenset(
    b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)
"""The bytes an HTTP method (a token, RFC 9110) may begin with."""
_TLS_HANDSHAKE = 0x16
"""The first byte of a TLS record carrying a handshake (a ClientHello)."""
_HOST = re.compile(r"[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]{2,45}\](:[0-9]{1,5})?")
_ENCODED_SLASH = re.compile(r"%2[Ff]")


def decode_route_value(raw: str) -> str:
    """A route parameter as the Functions host hands it over: percent-decoded but ``%2F``."""
    return "%2F".join(unquote(part, errors="replace") for part in _ENCODED_SLASH.split(raw))


def content_length(values: list[str]) -> int | str:
    """The body length the Content-Length header(s) give, or what is wrong with them."""
    if not values:
        return 0
    distinct = {value.strip() for value in values}
    if len(distinct) > 1:
        return f"Content-Length is given {len(values)} times with different values"
    (value,) = distinct
    if not value.isascii() or not value.isdigit():
        return f"Content-Length must be a non-negative integer, got {value[:20]!r}"
    return int(value)


@dataclass(frozen=True)
class Route:
    function: IndexedFunction
    pattern: re.Pattern[str]
    methods: frozenset[str]
    is_async: bool

    @classmethod
    def of(cls, function: IndexedFunction) -> Route:
        trigger = function.trigger
        assert isinstance(trigger, HttpTrigger)
        regex = ""
        for part in re.split(r"(\{[^}]+\})", trigger.route.strip("/")):
            if part.startswith("{") and part.endswith("}"):
                name = part[1:-1].split(":", 1)[0].rstrip("?")
                # {*rest} is a catch-all: the rest of the path, slashes and all (the one
                # route of func.AsgiFunctionApp, "/{*route}", takes every request).
                segment = ".*" if name.startswith("*") else "[^/]+"
                regex += f"(?P<{name.lstrip('*')}>{segment})"
            else:
                regex += re.escape(part)
        methods = frozenset(m.upper() for m in trigger.methods)
        is_async = inspect.iscoroutinefunction(function.user_function)
        return cls(function, re.compile(f"^{regex}/?$"), methods, is_async)


class HttpServer:
    def __init__(
        self,
        functions: list[IndexedFunction],
        invoker: Invoker,
        stats: dict[str, StatsCounter],
        *,
        host: str = "127.0.0.1",
        port: int = 7071,
        principal: str | None = None,
    ) -> None:
        self.principal = principal
        self.routes = [Route.of(f) for f in functions if isinstance(f.trigger, HttpTrigger)]
        self.invoker = invoker
        self.stats = stats
        self._server = _Server((host, port), self._handler_class())
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="host-http", daemon=True
        )

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://{self._server.server_address[0]}:{self.port}{ROUTE_PREFIX}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def dispatch(self, method: str, url: str, headers: dict[str, str], body: bytes) -> Any:
        """Route one request by ``url``'s path; returns (status, headers, body)."""
        path = urlsplit(url).path
        if not path.startswith(ROUTE_PREFIX):
            return _error(404, "not_found", f"no function serves {path} (routes start /api/)")
        relative = path[len(ROUTE_PREFIX) :]
        allowed: set[str] = set()
        for route in self.routes:
            match = route.pattern.match(relative)
            if match is None:
                continue
            if route.methods and method not in route.methods:
                allowed |= route.methods
                continue
            params = {name: decode_route_value(value) for name, value in match.groupdict().items()}
            return self._invoke(route, params, method, url, self._authenticated(headers), body)
        if allowed:
            status, headers, body = _error(
                405, "method_not_allowed", f"{method} is not allowed here; use {sorted(allowed)}"
            )
            return status, {**headers, "Allow": ", ".join(sorted(allowed))}, body
        return _error(404, "not_found", f"no function serves {path}")

    def _authenticated(self, headers: dict[str, str]) -> dict[str, str]:
        """``headers`` as App Service Authentication passes them on: identity set by it only."""
        dropped = {name.lower() for name in PRINCIPAL_HEADERS}
        kept = {k: v for k, v in headers.items() if k.lower() not in dropped}
        if self.principal:
            kept[PRINCIPAL_HEADERS[0]] = self.principal
        return kept

    def _invoke(self, route: Route, params: dict[str, str], method, url, headers, body) -> Any:
        request = func.HttpRequest(
            method=method,
            url=url,
            headers=headers,
            params=dict(parse_qsl(urlsplit(url).query)),
            route_params=params,
            body=body,
        )
        stats = self.stats[route.function.name]
        stats.add(invocations=1)
        trace = {name.lower(): value for name, value in headers.items()}  # its trace context
        try:
            response = self._call(route, request, trace)
        except Exception:
            stats.add(failures=1)
            log.exception("%s failed", route.function.name)
            return _error(500, "internal_error", f"{route.function.name} raised; see the log")
        stats.add(successes=1)
        if not isinstance(response, func.HttpResponse):
            return _error(500, "internal_error", f"{route.function.name} returned no HttpResponse")
        out_headers = dict(response.headers)
        if response.mimetype and "content-type" not in {k.lower() for k in out_headers}:
            out_headers["Content-Type"] = response.mimetype
        return response.status_code, out_headers, response.get_body() or b""

    def _call(self, route: Route, request: func.HttpRequest, trace: dict[str, str]) -> Any:
        if route.is_async:
            awaited = self.invoker.call_async(route.function, request, trace=trace)
            return self.invoker.run(awaited, timeout=None)
        return self.invoker.call(route.function, request, trace=trace)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # What a refusal is written as until the request line names a version: the
            # library's default, HTTP/0.9, would answer with a bare body.
            default_request_version = "HTTP/1.1"

            def handle_one_request(self) -> None:
                first = self.rfile.peek(1)[:1]
                if first and first[0] not in _METHOD_START:
                    self._refuse_at_once(first[0])
                    return
                super().handle_one_request()

            def _refuse_at_once(self, first: int) -> None:
                """Bytes no request begins with: answer, then close, without reading a line."""
                self.raw_requestline, self.requestline, self.command = b"", "", ""
                self.request_version = self.default_request_version
                if first == _TLS_HANDSHAKE:
                    why = "this is a TLS handshake, and this port speaks plain HTTP: use http://"
                else:
                    why = f"the request starts with byte 0x{first:02x}, which no HTTP method does"
                self.send_error(HTTPStatus.BAD_REQUEST, f"not an HTTP/1.1 request: {why}")

            def parse_request(self) -> bool:
                words = self.raw_requestline.split()
                if len(words) == 2:
                    # "GET /path": HTTP/0.9, which the library would serve without a status
                    # line or headers (and after waiting for headers it never gets).
                    self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
                    self.command, self.request_version = None, self.default_request_version
                    self.send_error(
                        HTTPStatus.BAD_REQUEST,
                        f"the request line {self.requestline[:80]!r} names no HTTP version: "
                        "send '<METHOD> <target> HTTP/1.1'",
                    )
                    return False
                return super().parse_request()

            def _serve(self) -> None:
                length = content_length(self.headers.get_all("Content-Length") or [])
                if isinstance(length, str):
                    # The body cannot be framed: answer, then close (no read, no hang).
                    self.close_connection = True
                    status, headers, body = _error(400, "bad_content_length", length)
                    headers["Connection"] = "close"
                elif length > MAX_BODY_BYTES:
                    self.close_connection = True
                    status, headers, body = _error(413, "too_large", "the body exceeds 1 MiB")
                    headers["Connection"] = "close"
                else:
                    raw = self.rfile.read(length) if length else b""
                    target = urlsplit(self.path)  # origin-form, or absolute-form (its path)
                    path = target.path + (f"?{target.query}" if target.query else "")
                    # The Host header names the URL the function sees, never the route.
                    host = self.headers.get("Host", "")
                    if not _HOST.fullmatch(host):
                        host = f"127.0.0.1:{server.port}"
                    status, headers, body = server.dispatch(
                        self.command, f"http://{host}{path}", dict(self.headers), raw
                    )
                self._answer(status, headers, body)

            def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    if name.lower() != "content-length":
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":  # its answer has the headers of one, no body
                    self.wfile.write(body)

            # HEAD and OPTIONS are routed like any method: a function that declares them gets
            # them, and elsewhere the answer is the API's 405 naming the methods allowed.
            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _serve

            def send_error(
                self, code: int, message: str | None = None, explain: str | None = None
            ) -> None:
                """What the standard library refuses before routing (a method no function
                serves, a request line or header too long, a malformed request line), as the
                API's JSON error instead of the library's HTML page; the connection closes."""
                self.log_error("code %d, message %s", code, message)
                status = HTTPStatus(code)
                name, text = _REFUSALS.get(status, (_snake(status.phrase), message or explain))
                _, headers, body = _error(status, name, text or status.description)
                self.close_connection = True
                self._answer(status, {**headers, "Connection": "close"}, body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s " + format, self.address_string(), *args)

        return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that resets or closes mid-request is routine: one line, no traceback."""
        error = sys.exception()
        if isinstance(error, ConnectionError):
            log.info("client %s went away: %s", client_address[0], error)
            return
        log.exception("request from %s failed", client_address[0])


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return status, {"Content-Type": "application/json"}, body


def _snake(phrase: str) -> str:
    return re.sub(r"[^a-z]+", "_", phrase.lower()).strip("_")
