"""HTTP triggers behind a local server, routed like the Functions host: `/api/<route>`.

Route templates use the host's syntax (`orders/{order_id}/resubmit`, optional `{x:int}`-style
constraints are matched as one path segment). Function keys are not checked locally, as with
`func start`; the Azure host enforces them (every operator function is AuthLevel.FUNCTION).
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import azure.functions as func

from devstack.host.indexing import HttpTrigger, IndexedFunction
from devstack.host.invoke import Invoker
from devstack.host.stats import StatsCounter

log = logging.getLogger("devstack.host.http")

ROUTE_PREFIX = "/api/"
MAX_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Route:
    function: IndexedFunction
    pattern: re.Pattern[str]
    methods: frozenset[str]

    @classmethod
    def of(cls, function: IndexedFunction) -> Route:
        trigger = function.trigger
        assert isinstance(trigger, HttpTrigger)
        regex = ""
        for part in re.split(r"(\{[^}]+\})", trigger.route.strip("/")):
            if part.startswith("{") and part.endswith("}"):
                name = part[1:-1].split(":", 1)[0].rstrip("?")
                regex += f"(?P<{name}>[^/]+)"
            else:
                regex += re.escape(part)
        methods = frozenset(m.upper() for m in trigger.methods)
        return cls(function, re.compile(f"^{regex}/?$"), methods)


class HttpServer:
    def __init__(
        self,
        functions: list[IndexedFunction],
        invoker: Invoker,
        stats: dict[str, StatsCounter],
        *,
        host: str = "127.0.0.1",
        port: int = 7071,
    ) -> None:
        self.routes = [Route.of(f) for f in functions if isinstance(f.trigger, HttpTrigger)]
        self.invoker = invoker
        self.stats = stats
        self._server = ThreadingHTTPServer((host, port), self._handler_class())
        self._server.daemon_threads = True
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
        """Route one request; returns (status, headers, body)."""
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
            return self._invoke(route, match.groupdict(), method, url, headers, body)
        if allowed:
            return _error(
                405, "method_not_allowed", f"{method} is not allowed here; use {sorted(allowed)}"
            )
        return _error(404, "not_found", f"no function serves {path}")

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
        try:
            response = self.invoker.call(route.function, request)
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

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY_BYTES:
                    status, headers, body = _error(413, "too_large", "the body exceeds 1 MiB")
                else:
                    raw = self.rfile.read(length) if length else b""
                    host = self.headers.get("Host") or f"127.0.0.1:{server.port}"
                    status, headers, body = server.dispatch(
                        self.command, f"http://{host}{self.path}", dict(self.headers), raw
                    )
                self.send_response(status)
                for name, value in headers.items():
                    if name.lower() != "content-length":
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s " + format, self.address_string(), *args)

        return Handler


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
    import json

    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return status, {"Content-Type": "application/json"}, body
