"""The agents' HTTP to their remote services: one aiohttp session per worker, bounded per
service, traced per call.

Why aiohttp: measured on this machine against a local server that answers at once, client CPU
per POST with its answer read was 0.20-0.30 ms through a shared ``aiohttp.ClientSession`` (0.27
with this module's span and bounds), 0.36-0.49 ms through the project's own HTTP/1.1 pool behind
``httpx.AsyncClient`` (what the agents ran on before; deleted since), and 1.0-1.7 ms through
``httpx.AsyncClient`` however configured (its transport alone: httpcore and anyio);
docs/performance.md, "Issue 27". aiohttp parses with llhttp, keeps connections alive and
closes idle ones after 15 s, verifies TLS with the system's trust store (or the
``ssl_context`` given), and never sends a POST twice: it retries only an idempotent request on
a kept-alive connection the server had closed.

Per call (:meth:`RemoteHttp.post`):

- one deadline bounds the whole call: the wait for one of the service's connections, connecting,
  sending and reading the answer whole. It is the caller's ``timeout`` cut to the service's
  (:class:`adapters.settings.ServiceLimits`; from the settings, ``REMOTE_TIMEOUT_SECONDS``, 10 s);
  past it the call fails with :class:`CallTimedOut`;
- at most ``max_connections`` calls to one service are under way at once (from the settings,
  ``REMOTE_MAX_CONNECTIONS``, 32, for each service): a burst for one service cannot take every
  socket of the worker;
- the answer is read whole, at most ``max_answer_bytes`` (1 MiB, the remote client's bound):
  past it, or a ``Content-Length`` that says so, the connection is closed and the call fails
  with :class:`AnswerTooLarge`, so a hostile or broken service cannot make the worker buffer an
  unbounded answer;
- a CLIENT span per call under the current span, with the stable HTTP attributes the Azure
  Monitor exporter turns into a dependency row (method, ``url.full``, server, status; a 4xx or
  5xx, a timeout or a failed connection marks it an error, with ``error.type`` as the
  OpenTelemetry HTTP conventions ask of every failed call: the status code, else the class of
  what failed - ``CallTimedOut``, ``AnswerTooLarge``, or the connection's own error such as
  ``ClientConnectorError``, as OpenTelemetry's instrumentations name it), and its
  ``traceparent`` sent, so
  the service can join the trace. Written here rather than through OpenTelemetry's
  aiohttp-client instrumentation (``create_trace_config``), which does the same through
  aiohttp's trace signals for 0.1-0.15 ms more CPU per call, measured: half again what aiohttp
  itself costs;
- the proxy the environment names for the service (``HTTPS_PROXY``, ``NO_PROXY``), looked up
  once (:mod:`adapters.proxies`).

Every failure without an answer is a :class:`RemoteHttpError`: :class:`CallTimedOut`,
:class:`CallFailed` (refused, reset, closed early, malformed, TLS refused) or
:class:`AnswerTooLarge`; an answer of any status is returned as it came.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import aiohttp
from multidict import CIMultiDictProxy
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, StatusCode
from yarl import URL

from adapters.proxies import env_proxy
from adapters.settings import ServiceLimits, Settings

MAX_ANSWER_BYTES: Final = 1_048_576
"""The longest answer read, unless told otherwise (the remote client's ``max_response_bytes``)."""
KEEP_ALIVE_S: Final = 15.0
"""An idle connection is closed after this long (aiohttp's default)."""

_tracer = trace.get_tracer(__name__)


@dataclass(frozen=True)
class RemoteService:
    """One remote service: its base URL and how it is called."""

    name: str
    base_url: str
    limits: ServiceLimits = dataclasses.field(default_factory=ServiceLimits)

    def __post_init__(self) -> None:
        url = URL(self.base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"base_url must be an absolute http(s) URL, got {self.base_url!r}")


@dataclass(frozen=True)
class Answer:
    """A whole answer, of any status."""

    status: int
    headers: CIMultiDictProxy[str]
    body: bytes


class RemoteHttpError(Exception):
    """No whole answer: the message says what went wrong and for which call."""


class CallTimedOut(RemoteHttpError):
    """No whole answer within the call's timeout (the service may still act on the request)."""


class CallFailed(RemoteHttpError):
    """The connection failed: refused, reset, closed before the answer was whole, a malformed
    answer, or a certificate refused."""


class AnswerTooLarge(RemoteHttpError):
    """The answer is longer than the caller reads."""


class RemoteHttp:
    """The worker's HTTP to its remote services. Safe to share between the tasks of one event
    loop; opened on first use (it may be built before any loop runs), and again on a new loop
    (as :class:`adapters.tables.pipeline.Sender` is)."""

    def __init__(
        self,
        services: Iterable[RemoteService],
        *,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._services = {service.name: service for service in services}
        if max_answer_bytes < 1:
            raise ValueError("max_answer_bytes must be positive")
        self._max_answer_bytes = max_answer_bytes
        self._ssl = ssl_context
        self._proxies = {name: env_proxy(s.base_url) for name, s in self._services.items()}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._slots: dict[str, asyncio.Semaphore] = {}

    @classmethod
    def from_settings(cls, settings: Settings, **options: object) -> RemoteHttp:
        """The agents' services, their URLs and limits from the app settings."""
        services = (
            RemoteService(name, url, settings.remote_limits)
            for name, url in settings.service_urls.items()
        )
        return cls(services, **options)  # type: ignore[arg-type]

    def base_url(self, service: str) -> str:
        return self._services[service].base_url

    async def post(
        self,
        service: str,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout: float | None = None,
        max_answer_bytes: int | None = None,
    ) -> Answer:
        """POST ``body`` to ``path`` under ``service``'s base URL and read the whole answer,
        within ``timeout`` seconds at most (and the service's own bound), at most
        ``max_answer_bytes`` long (and the worker's bound). Raises KeyError for a service it was
        not given, :class:`RemoteHttpError` when no whole answer came."""
        target = self._services[service]
        limit = target.limits.timeout_s
        if timeout is not None:
            limit = min(timeout, limit)
        longest = min(max_answer_bytes or self._max_answer_bytes, self._max_answer_bytes)
        url = URL(f"{target.base_url.rstrip('/')}/{path.lstrip('/')}")
        session, slots = self._bound(service)
        with _tracer.start_as_current_span("POST", kind=SpanKind.CLIENT, attributes={
            "http.request.method": "POST", "url.full": str(url), "server.address": url.host or "",
            "server.port": url.port or 0,
        }) as span:  # fmt: skip
            sent = dict(headers)
            propagate.inject(sent)  # traceparent: this span's
            try:
                answer = await self._within(
                    limit, slots, session, service, url, body, sent, longest
                )
            except Exception as error:
                span.set_attribute("error.type", _error_type(error))
                raise
            span.set_attribute("http.response.status_code", answer.status)
            if answer.status >= 400:
                span.set_attribute("error.type", str(answer.status))
                span.set_status(StatusCode.ERROR)
            return answer

    async def _within(
        self,
        limit: float,
        slots: asyncio.Semaphore,
        session: aiohttp.ClientSession,
        service: str,
        url: URL,
        body: bytes,
        headers: Mapping[str, str],
        longest: int,
    ) -> Answer:
        """The exchange within ``limit`` seconds, a connection slot included; every failure
        without a whole answer as a :class:`RemoteHttpError`."""
        try:
            async with asyncio.timeout(limit):
                async with slots:
                    return await self._exchange(session, service, url, body, headers, longest)
        except TimeoutError:
            raise CallTimedOut(f"POST {url}: no whole answer within {limit:.3f} s") from None
        except aiohttp.ClientError as error:
            raise CallFailed(f"POST {url}: {_describe(error)}") from error

    async def _exchange(
        self,
        session: aiohttp.ClientSession,
        service: str,
        url: URL,
        body: bytes,
        headers: Mapping[str, str],
        longest: int,
    ) -> Answer:
        async with session.post(
            url, data=body, headers=headers, proxy=self._proxies[service]
        ) as response:
            declared = response.content_length
            if declared is not None and declared > longest:
                response.close()
                raise AnswerTooLarge(
                    f"POST {url}: the answer says {declared} bytes, over {longest}"
                )
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.content.iter_any():
                size += len(chunk)
                if size > longest:
                    response.close()
                    raise AnswerTooLarge(f"POST {url}: the answer exceeds {longest} bytes")
                chunks.append(chunk)
            return Answer(response.status, response.headers, b"".join(chunks))

    def _bound(self, service: str) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        """The session and the service's connection slots of the running loop."""
        loop = asyncio.get_running_loop()
        if self._session is None or loop is not self._loop:
            total = sum(s.limits.max_connections for s in self._services.values())
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=total,
                    keepalive_timeout=KEEP_ALIVE_S,
                    ssl=self._ssl if self._ssl is not None else True,
                ),
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=None),  # each call's own deadline rules
            )
            self._slots = {
                name: asyncio.Semaphore(s.limits.max_connections)
                for name, s in self._services.items()
            }
            self._loop = loop
        return self._session, self._slots[service]

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None and self._loop is asyncio.get_running_loop():
            await session.close()


def _error_type(error: Exception) -> str:
    """A failed call's ``error.type``: the class of what failed (a failed connection's own)."""
    if isinstance(error, CallFailed) and error.__cause__ is not None:
        return type(error.__cause__).__qualname__
    return type(error).__qualname__


def _describe(error: aiohttp.ClientError) -> str:
    if isinstance(error, aiohttp.ClientConnectorCertificateError):
        return f"certificate refused: {error.certificate_error}"
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return "the server closed the connection before answering in full"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
