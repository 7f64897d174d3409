"""How an httpx request travels over the project's HTTP/1.1 connection pools, and its answer back:
the per-request work of the agents' transport (core.http_transport).

Why: against the local fake services, a POST through ``httpx.Client`` with its own transport
(httpcore) cost about 0.40 ms of CPU (async: 0.90 ms, of which httpcore and anyio 0.71 ms); the
HTTP/1.1 pools of :mod:`core.http11` do the same exchange for about half of that. The
agents keep httpx's client API (``rt.http.stream(...)``, ``httpx.Timeout``, httpx errors, and
``httpx.MockTransport`` in tests); only what carries a request changes.

:class:`core.http_transport.PooledAsyncTransport` keeps one
:class:`~core.http11.ConnectionPool` per origin (scheme, host, port), created on first use, at
most :data:`MAX_ORIGINS` (the oldest is closed past that; agents have three). Per request:

- the target is ``request.url.raw_path`` (path and query, as encoded);
- the headers are httpx's but Host, Content-Length and Transfer-Encoding, which the pool sets
  itself (the body is read whole and sent with its length);
- ``request.extensions["timeout"]``: ``connect`` bounds connecting, ``read`` the whole exchange
  and the wait for a free connection; a timeout httpx leaves unset (None) is the pool's own
  (5 s, 30 s);
- the answer is buffered whole, at most ``max_body_bytes`` (default :data:`MAX_BODY_BYTES`): a
  longer one fails with ``httpx.ReadError`` and its connection is closed, so a hostile server
  cannot make the process buffer an unbounded answer. The remote client's own bound
  (``policy.max_response_bytes``, 1 MiB by default) stays the one that normally applies;
- the pool's :class:`~core.http11.TransportError` becomes the httpx error httpx's
  own transport would raise (:data:`ERRORS`): ``ConnectError``/``ConnectTimeout``,
  ``PoolTimeout``, ``ReadTimeout``, ``RemoteProtocolError`` (closed early, malformed),
  ``LocalProtocolError``, ``ReadError``. A kept-alive connection the server closed as it was
  taken (``reused``) is retried once on a new connection when the request may be replayed (an
  idempotent method, or an ``Idempotency-Key``), as the Table client does.

Proxies: httpx 0.28 mounts proxy transports from ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``
only when no ``transport=`` is given (``allow_env_proxies = trust_env and transport is None``
in ``httpx/_client.py``), and these pools do not speak to proxies. So the Runtime uses this
transport only when :func:`proxied_by_env` is False; behind a proxy it keeps httpx's own
transport, which honours the proxy (and ``NO_PROXY``) as before.
"""

from __future__ import annotations

import urllib.request
from typing import Final

import httpx

from core.http11 import Answer, Failure, TransportError

MAX_BODY_BYTES: Final = 16 * 1024 * 1024
"""The longest answer a transport buffers, unless told otherwise."""
MAX_ORIGINS: Final = 16
"""Pools kept at once; the oldest is closed past that."""

ERRORS: Final[dict[Failure, type[httpx.TransportError]]] = {
    "connect": httpx.ConnectError,
    "connect_timeout": httpx.ConnectTimeout,
    "pool_timeout": httpx.PoolTimeout,
    "timeout": httpx.ReadTimeout,
    "closed": httpx.RemoteProtocolError,
    "protocol": httpx.RemoteProtocolError,
    "send": httpx.LocalProtocolError,
    "too_large": httpx.ReadError,
    "pool_closed": httpx.ConnectError,
    "io": httpx.ReadError,
}
"""The httpx error each kind of pool failure becomes."""

_NOT_SENT: Final = frozenset({b"host", b"content-length", b"transfer-encoding"})
_REPLAYABLE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
_HTTP11: Final = b"HTTP/1.1"

Origin = tuple[str, bytes, int | None]


def proxied_by_env() -> bool:
    """Whether the environment names an HTTP(S) proxy that httpx would use (the variables
    httpx reads: ``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, any case)."""
    proxies = urllib.request.getproxies()
    return any(proxies.get(scheme) for scheme in ("http", "https", "all"))


def origin_key(url: httpx.URL) -> Origin:
    if url.scheme not in ("http", "https"):
        raise httpx.UnsupportedProtocol(f"not an http(s) URL: {url.scheme!r}")
    return url.scheme, url.raw_host, url.port


def origin_text(url: httpx.URL) -> str:
    """``scheme://host[:port]`` (IPv6 hosts bracketed), as the pools take it."""
    return f"{url.scheme}://{url.netloc.decode('ascii')}"


def fields(request: httpx.Request) -> list[tuple[str, str]]:
    """The request's headers but those the pool sets itself, in order, repeats kept."""
    return [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in request.headers.raw
        if name.lower() not in _NOT_SENT
    ]


def timeouts(request: httpx.Request) -> tuple[float | None, float | None]:
    """(connect, read) of the request's ``timeout`` extension; None: the pool's own."""
    given = request.extensions.get("timeout") or {}
    return given.get("connect"), given.get("read")


def replayable(request: httpx.Request) -> bool:
    return request.method in _REPLAYABLE_METHODS or "idempotency-key" in request.headers


def httpx_error(error: TransportError, request: httpx.Request) -> httpx.TransportError:
    return ERRORS.get(error.kind, httpx.ReadError)(str(error), request=request)


def response(answer: Answer, request: httpx.Request) -> httpx.Response:
    """The answer as httpx's transports give one: the client decodes (Content-Encoding) and
    reads the body from the stream."""
    return httpx.Response(
        answer.status_code,
        headers=list(answer.headers.items()),
        stream=httpx.ByteStream(answer.content),
        request=request,
        extensions={
            "http_version": _HTTP11,
            "reason_phrase": answer.reason_phrase.encode("latin-1"),
        },
    )
