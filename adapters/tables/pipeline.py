"""What each Table request passes through: azure-core's async pipeline, with a short list of
policies, over aiohttp (azure-core's ``AioHttpTransport``).

The policies, in order, and why each is there (azure-data-tables builds the same pipeline with
more in it; these keep its semantics, not its code):

1. The request id, ``x-ms-client-request-id``, is set by the client as it builds the request
   (:mod:`adapters.tables.client`), so its retries carry the same one (what Azure support asks
   for first, and what the service logs beside its own request id). azure-core's
   ``RequestIdPolicy`` would make a ``uuid1`` per request: 60 µs of the 0.47 ms a point read
   cost through this pipeline, measured; a ``uuid4`` costs 7.
2. The ``User-Agent`` (:func:`user_agent`: ``azsdk-python-<MONIKER> Python/... (platform)``, as
   ``UserAgentPolicy`` writes it, with ``AZURE_HTTP_USER_AGENT`` appended when set) is set by
   the client too, made once per service: the policy reads the environment on every request.
3. ``ProxyPolicy``, only when the environment names a proxy for the endpoint
   (``HTTPS_PROXY``/``HTTP_PROXY``, less ``NO_PROXY``): read once, when the service is built,
   rather than by aiohttp on every request (``trust_env``), which scans the environment twice.
4. azure-core's ``AsyncRetryPolicy``, as azure-data-tables'
   ``AsyncTablesRetryPolicy`` configures it (that class adds only retries to a secondary
   region, which the app does not use): a failed answer is retried when it is 408, 429, 500,
   502, 503 or 504, or carries ``Retry-After``; a POST or PATCH only on 500, 503 or 504 or with
   ``Retry-After``; after a transport error only GET, HEAD, PUT, DELETE, OPTIONS and TRACE, so a
   POST (an insert, a transaction) or a MERGE that timed out or lost its connection is never
   sent again. The wait is the server's (``Retry-After``, ``retry-after-ms``,
   ``x-ms-retry-after-ms``), else 0, 1.6, 3.2, 6.4 ... s, at most 120 s. The same totals (10
   retries; 3 after connection errors, 3 after read errors) but one: the SDK retries a failed
   status 3 times, which gives up on ``ServerBusy`` after 4.8 s (measured against a server that
   answers 503), and the app then turns throttling into message redeliveries. Here a status is
   retried :data:`STATUS_RETRIES` times, which rides out 49.6 s of throttling without
   ``Retry-After`` (docs/performance.md, "The Table client on azure-core").
5. :class:`RequestHook`: each attempt reported to the request hook as a :class:`Sent` (the
   app's request counts, ``adapters.op_counts``).
6. ``DistributedTracingPolicy``: a client span per attempt and ``traceparent`` on it, when the
   Azure SDKs trace (the Azure Monitor distro's azure-sdk instrumentation, or azure-core's
   ``tracing_implementation`` setting); nothing otherwise.
7. Authorization, per attempt, with a fresh ``x-ms-date``: :class:`SharedKeyPolicy` (connection
   strings: Azurite) or :class:`BearerTokenPolicy` (an ``azure.identity.aio`` credential).
8. :class:`AttemptRecord`, last, so that it sees exactly what each attempt met on the wire:
   whether any attempt of the call may have reached the service and been applied
   (:func:`may_have_applied`), which tells a write whose outcome is unknown from one refused.

**A write whose outcome is unknown** raises :class:`OutcomeUnknown`: some attempt may have been
applied and no answer says whether it was (the answer was lost to a reset, a disconnect, a
timeout or the invocation's deadline, or was a 5xx). Only the caller can settle it, by reading
(:mod:`adapters.store`). A request is known not to have been sent only when no connection was
made for it (aiohttp's ``ClientConnectorError``: refused, DNS, TLS, proxy; or its connect
timeout), or when the deadline had passed before it was sent: aiohttp reports a reset after the
request went out as a connection error too (``ServerDisconnectedError``, ``ClientOSError``),
which azure-core raises as ``ServiceRequestError``, so that type alone says nothing. aiohttp
also sends a PUT or DELETE again by itself after such an error, unseen by any policy: for those
any connection error may follow a send, and a 412 to a conditional one is no proof that ours
did not land (the stores read it back).

**Every call ends by the invocation's deadline** (:mod:`adapters.deadline`), its retries and
their waits included: :meth:`Sender.send` runs it under ``asyncio.timeout``. A read cut there
raises ``ServiceResponseTimeoutError``; a write, :class:`OutcomeUnknown`; a call started with no
time left is not sent (``ServiceRequestTimeoutError``).

Left out, each for a reason: ``ContentDecodePolicy`` (the client reads its JSON itself),
redirects (the Table service does not redirect), ``HttpLoggingPolicy`` and
``NetworkTraceLoggingPolicy`` (a log line per request was most of the app's log volume before;
failures surface through the errors).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp
from aiohttp.client import IDEMPOTENT_METHODS
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.core.pipeline import AsyncPipeline, PipelineRequest, PipelineResponse
from azure.core.pipeline.policies import (
    AsyncBearerTokenCredentialPolicy,
    AsyncHTTPPolicy,
    AsyncRetryPolicy,
    DistributedTracingPolicy,
    ProxyPolicy,
    SansIOHTTPPolicy,
    UserAgentPolicy,
)
from azure.core.pipeline.transport import AioHttpTransport, AsyncHttpResponse, HttpRequest
from azure.data.tables import TableTransactionError
from yarl import URL

from adapters import deadline
from adapters.proxies import env_proxy
from adapters.tables.auth import STORAGE_SCOPE, SharedKey

MONIKER: Final = "orders-tables/1.0"
"""This client in the User-Agent, where the SDK puts ``data-tables/<version>``."""
TOTAL_RETRIES: Final = 10
CONNECT_RETRIES: Final = 3
READ_RETRIES: Final = 3
STATUS_RETRIES: Final = 6
BACKOFF_FACTOR_S: Final = 0.8
BACKOFF_MAX_S: Final = 120
CONNECT_TIMEOUT_S: Final = 5.0
READ_TIMEOUT_S: Final = 30.0
"""The longest wait for the next bytes of an answer (aiohttp's ``sock_read``)."""
KEEP_ALIVE_S: Final = 15.0
"""An idle connection is closed after this long (aiohttp's default), well before the service
drops it, so a request seldom meets a connection the server has closed."""

Hook = Callable[["Sent"], None]


@dataclass(frozen=True)
class Sent:
    """One HTTP attempt, as the request hook sees it."""

    method: str
    url: str
    batch_urls: tuple[str, ...] = field(default=())
    """The operations' URLs, for a transaction."""


BATCH_URLS: Final = "batch_urls"
"""The option (``pipeline.run(..., batch_urls=...)``) that names a transaction's operations."""


class RequestHook(SansIOHTTPPolicy):
    """Reports every attempt (retries included) to ``hook``."""

    def __init__(self, hook: Hook) -> None:
        self._hook = hook

    def on_request(self, request: PipelineRequest) -> None:
        context = request.context
        if BATCH_URLS not in context:  # the first attempt: the option is taken once
            context[BATCH_URLS] = tuple(context.options.pop(BATCH_URLS, ()))
        sent = request.http_request
        self._hook(Sent(sent.method, sent.url, context[BATCH_URLS]))


RESENT_BY_AIOHTTP: Final = IDEMPOTENT_METHODS
"""Sent again by aiohttp itself, once, when the connection fails (:class:`AttemptRecord`)."""
READS: Final = frozenset({"GET", "HEAD"})
"""What is no write: a call of these that fails has no outcome to settle."""
ATTEMPTS: Final = "table_attempts"
"""The option (``pipeline.run(..., table_attempts=...)``) that carries a call's record."""


class OutcomeUnknown(ServiceResponseError):
    """A write that may have been applied though no answer says so: read to know.

    Some attempt of it reached the service, or may have, and its answer was lost (a reset, a
    disconnect, a timeout, the invocation's deadline) or was a server error that the retries did
    not get past. The error that ended the call is ``inner_exception`` (and ``__cause__``)."""


@dataclass(slots=True)
class Attempts:
    """What the attempts of one call met (:class:`AttemptRecord`)."""

    maybe_applied: bool = False
    """An attempt may have been applied without an answer saying so."""


def may_have_applied(error: BaseException) -> bool:
    """Whether a write that failed with ``error`` may have been applied.

    No only for an answer that refused it (a 4xx, or a transaction's failed operation: the
    service applies a change set whole or not at all), for a call that raised before any
    request (an argument refused, the credential failing to give a token) and for a request
    known never to have left (:func:`never_sent`). Yes for everything else: an answer lost after
    the request went out (or may have), a 5xx or a 408, a call cut by the deadline or cancelled
    mid-way."""
    if isinstance(error, OutcomeUnknown):
        return True
    if isinstance(error, ClientAuthenticationError | TableTransactionError):
        return False  # a 401 or no token; a change set refused whole, whatever the status
    if isinstance(error, HttpResponseError):
        return error.status_code is None or _status_may_have_applied(error.status_code)
    if isinstance(error, ServiceRequestError):
        return not never_sent(error)
    return isinstance(error, ServiceResponseError | TimeoutError | asyncio.CancelledError)


def never_sent(error: ServiceRequestError) -> bool:
    """Whether no byte of the request can have reached the service: no connection was made for
    it (aiohttp's ``ClientConnectorError``: refused, DNS, TLS, a proxy; or its connect timeout),
    or azure-core or the deadline stopped it before it was sent (``ServiceRequestTimeoutError``
    with no cause). aiohttp raises both only while connecting, before the request is written
    (but see :class:`AttemptRecord` for what it sends again by itself)."""
    cause = error.inner_exception
    if isinstance(error, ServiceRequestTimeoutError) and cause is None:
        return True
    return isinstance(cause, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError)


def _status_may_have_applied(status: int) -> bool:
    """A server error or a server-side timeout: the service may have applied the write first."""
    return status >= 500 or status == 408


class AttemptRecord(AsyncHTTPPolicy):
    """Notes, for each attempt of a call, whether it may have been applied (:class:`Attempts`,
    given as the ``table_attempts`` option). The last policy: it sees only the transport.

    For a method aiohttp sends again by itself (PUT, DELETE: its ``IDEMPOTENT_METHODS``) after a
    connection error, any connection error may follow a first send that nobody saw: the error
    the attempt raises is the resend's."""

    async def send(self, request: PipelineRequest) -> PipelineResponse:
        context = request.context
        if ATTEMPTS not in context:  # the first attempt: the option is taken once
            context[ATTEMPTS] = context.options.pop(ATTEMPTS, None) or Attempts()
        record: Attempts = context[ATTEMPTS]
        try:
            response = await self.next.send(request)
        except BaseException as error:
            resent = request.http_request.method in RESENT_BY_AIOHTTP
            record.maybe_applied |= may_have_applied(error) or (
                resent and isinstance(error, ServiceRequestError)
            )
            raise
        record.maybe_applied |= _status_may_have_applied(response.http_response.status_code)
        return response


def _dated(request: HttpRequest) -> None:
    """``x-ms-date``, now (the text made once a second)."""
    request.headers["x-ms-date"] = _http_date(int(time.time()))


@functools.lru_cache(maxsize=1)
def _http_date(second: int) -> str:
    return formatdate(second, usegmt=True)


class SharedKeyPolicy(SansIOHTTPPolicy):
    """Shared Key for the Table service (:class:`adapters.tables.auth.SharedKey`), signed over
    the path as aiohttp sends it: yarl decodes what a path may hold unencoded (``%27`` is sent
    as ``'``), and the service signs what it receives."""

    def __init__(self, key: SharedKey) -> None:
        self._key = key

    def on_request(self, request: PipelineRequest) -> None:
        sent = request.http_request
        _dated(sent)
        url = URL(sent.url)
        path = url.raw_path + (f"?{url.raw_query_string}" if url.raw_query_string else "")
        sent.headers["Authorization"] = self._key.authorization(sent.method, path, sent.headers)


class BearerTokenPolicy(AsyncBearerTokenCredentialPolicy):
    """Entra tokens from an async credential (``azure.identity.aio``): fetched, cached and
    renewed by azure-core's policy on the event loop, never by a sync call on it. A 401 is
    answered as the SDKs answer it: a CAE claims challenge (``error="insufficient_claims"``)
    by a token carrying those claims (azure-core), another Bearer challenge that names an
    authorization server by a token from that tenant (azure-data-tables); then the request is
    sent once more. A sync credential is refused: its ``get_token`` would block the loop."""

    def __init__(self, credential: Any) -> None:
        if not inspect.iscoroutinefunction(getattr(credential, "get_token", None)):
            raise TypeError(
                "the Table client needs an async credential (azure.identity.aio, e.g. "
                "ManagedIdentityCredential): a sync get_token would block the event loop"
            )
        super().__init__(credential, STORAGE_SCOPE)

    async def on_request(self, request: PipelineRequest) -> None:
        _dated(request.http_request)
        await super().on_request(request)

    async def on_challenge(self, request: PipelineRequest, response: PipelineResponse) -> bool:
        if await super().on_challenge(request, response):
            return True
        tenant = challenge_tenant(response.http_response.headers.get("WWW-Authenticate"))
        if tenant is None:
            return False
        await self.authorize_request(request, *self._scopes, tenant_id=tenant)
        return True


_AUTHORIZATION_URI = re.compile(
    r"""\bauthorization(?:_uri)?\s*=\s*"?https://[^/\s",]+/([^/\s",]+)""", re.IGNORECASE
)


def challenge_tenant(challenge: str | None) -> str | None:
    """The tenant a Bearer challenge's ``authorization_uri`` names
    (``https://login.microsoftonline.com/<tenant>/oauth2/authorize``), or None."""
    if not challenge or not challenge.lstrip().lower().startswith("bearer"):
        return None
    found = _AUTHORIZATION_URI.search(challenge)
    return found[1] if found else None


def user_agent() -> str:
    """This client's ``User-Agent``, as azure-core's ``UserAgentPolicy`` writes it."""
    return UserAgentPolicy(sdk_moniker=MONIKER).user_agent


def policies(endpoint: str, credential: SharedKey | Any, request_hook: Hook | None) -> list[Any]:
    """The policies every request of a service goes through, in order (module docstring)."""
    auth = (
        SharedKeyPolicy(credential)
        if isinstance(credential, SharedKey)
        else BearerTokenPolicy(credential)
    )
    proxy = env_proxy(endpoint)
    return [
        *([ProxyPolicy(proxies={urlsplit(endpoint).scheme: proxy})] if proxy else []),
        AsyncRetryPolicy(  # the Tables SDK's totals and backoff but one (module docstring)
            retry_total=TOTAL_RETRIES,
            retry_connect=CONNECT_RETRIES,
            retry_read=READ_RETRIES,
            retry_status=STATUS_RETRIES,
            retry_backoff_factor=BACKOFF_FACTOR_S,
            retry_backoff_max=BACKOFF_MAX_S,
        ),
        *([RequestHook(request_hook)] if request_hook is not None else []),
        DistributedTracingPolicy(),
        auth,
        AttemptRecord(),
    ]


class Sender:
    """The pipeline of one service: its policies, and a transport on the running event loop.

    An aiohttp session belongs to the loop it was opened on, and is opened on the first request
    (a service may be built before any loop runs); used from another loop (each test has its
    own), the service opens another and leaves the previous one, which cannot be closed from
    here, to be collected with its loop (aiohttp then warns of an unclosed session).
    """

    def __init__(
        self,
        policies: Sequence[Any],
        *,
        max_connections: int = 64,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        read_timeout: float = READ_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._policies = list(policies)
        self._hooked = any(isinstance(policy, RequestHook) for policy in self._policies)
        self._max_connections = max_connections
        self._timeouts = {"connection_timeout": connect_timeout, "read_timeout": read_timeout}
        self._ssl = ssl_context
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pipeline: AsyncPipeline | None = None

    async def send(self, request: HttpRequest, batch_urls: Sequence[str] = ()) -> AsyncHttpResponse:
        """The answer, its body read, whatever its status, by the invocation's deadline (module
        docstring). When no answer came: azure-core's errors (``ServiceRequestError``,
        ``ServiceResponseError`` and their timeouts), or :class:`OutcomeUnknown` for a write
        that may have been applied. ``batch_urls``: a transaction's operations, for the request
        hook."""
        attempts = Attempts()
        options: dict[str, Any] = {ATTEMPTS: attempts}
        if batch_urls and self._hooked:
            options[BATCH_URLS] = batch_urls
        try:
            left = deadline.remaining()
            if left is None:
                return (await self._bound().run(request, **options)).http_response
            return await self._within(left, request, options)
        except AzureError as error:
            if attempts.maybe_applied and request.method not in READS:
                raise OutcomeUnknown(
                    f"{request.method} {_path(request)}: no answer ({error}); it may have been "
                    "applied: read to know",
                    error=error,
                ) from error
            raise

    async def _within(
        self, left: float, request: HttpRequest, options: dict[str, Any]
    ) -> AsyncHttpResponse:
        if left <= 0:
            raise ServiceRequestTimeoutError(
                f"{request.method} {_path(request)} not sent: the invocation's deadline passed"
            )
        bound = asyncio.timeout(left)
        try:
            async with bound:
                return (await self._bound().run(request, **options)).http_response
        except TimeoutError:
            if not bound.expired():
                raise
            cut = (
                f"{request.method} {_path(request)} cut at the invocation's deadline, "
                f"{left:.3g} s after it started"
            )
            if options[ATTEMPTS].maybe_applied:
                raise ServiceResponseTimeoutError(cut) from None
            raise ServiceRequestTimeoutError(f"{cut}, before it was sent") from None

    def _bound(self) -> AsyncPipeline:
        loop = asyncio.get_running_loop()
        if self._pipeline is None or loop is not self._loop:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._max_connections,
                    keepalive_timeout=KEEP_ALIVE_S,
                    ssl=self._ssl if self._ssl is not None else True,
                ),
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("Accept-Encoding",),  # the service answers uncompressed
            )
            transport = AioHttpTransport(session=session, session_owner=True, **self._timeouts)
            self._pipeline, self._loop = AsyncPipeline(transport, self._policies), loop
        return self._pipeline

    async def close(self) -> None:
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None and self._loop is asyncio.get_running_loop():
            await pipeline.__aexit__()


def _path(request: HttpRequest) -> str:
    """The request's path, for errors (the query may hold a filter's values)."""
    return urlsplit(request.url).path
