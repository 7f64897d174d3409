"""The operations app called as the Python worker calls it: its one HTTP function
(``http_app_func``, which ``func.AsgiFunctionApp`` registers) given a ``func.HttpRequest``, so a
request goes through the worker's ASGI bridge, FastAPI's routing and validation, and the routes.

Routes are named by their endpoint's name (``show_order``); the URL is FastAPI's for
that name, each path parameter percent-encoded as a client would send it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import azure.functions as func
from fastapi import FastAPI

import operations_app
from dashboard.routes import router as dashboard
from operator_api.app import build
from service.operations.composition import OperationsRoot
from service.runtime import Runtime

PRINCIPAL_HEADER = "X-MS-CLIENT-PRINCIPAL-NAME"


@dataclass(frozen=True)
class OperationsApp:
    api: FastAPI
    function: Callable[..., Awaitable[func.HttpResponse]]
    functions: func.AsgiFunctionApp
    """Kept with the app until :meth:`close`: collected with its ASGI app started, it would run
    the shutdown with ``asyncio.run``, which fails inside whichever test's loop runs then."""

    @property
    def root(self) -> OperationsRoot:
        """The composition root the routes find in the app's state."""
        root: OperationsRoot = self.api.state.root
        return root

    def url(self, name: str, route: dict[str, str] | None = None) -> str:
        encoded = {key: quote(str(value), safe="") for key, value in (route or {}).items()}
        return "http://localhost/api" + self.api.url_path_for(name, **encoded)

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
    ) -> func.HttpResponse:
        request = func.HttpRequest(method=method, url=url, body=body, headers=headers or {})
        return await self.function(req=request, context=None)

    def close(self) -> None:
        """The ASGI app's lifespan shutdown, as the worker sends it when it stops: after the
        tests that used the app, with no loop running."""
        if self.functions.startup_task_done:
            asyncio.run(self.functions.middleware.notify_shutdown())
            self.functions.startup_task_done = False


@contextmanager
def loaded() -> Iterator[OperationsApp]:
    """:func:`load`, closed after (a module's tests share one: :func:`serving` gives each test
    its root)."""
    app = load()
    try:
        yield app
    finally:
        app.close()


def load(root: OperationsRoot | None = None) -> OperationsApp:
    """The operations app as operations_app.py serves it, on ``root`` (None: a root of the
    environment's settings, for routes that read no state; :func:`serving` gives it another)."""
    api = build(root or OperationsRoot(), dashboard)
    functions = operations_app.serve(api)
    (function,) = [f for f in functions.get_functions() if f.get_function_name() == "http_app_func"]
    return OperationsApp(api, function.get_user_function(), functions)


class Around(OperationsRoot):
    """The operations app's composition root on a test's own Runtime (its clients on the test's
    event loop, or its store behind a fault proxy)."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__()  # no settings to read: the Runtime, built already, is the test's
        self._runtime = rt


@asynccontextmanager
async def serving(app: OperationsApp, rt: Runtime) -> AsyncIterator[OperationsApp]:
    """``app`` (one per test module: :func:`load`) on a composition root of this test's, around
    ``rt``; what the root opened is closed after (``rt`` too)."""
    root = Around(rt)
    app.api.state.root = root
    try:
        yield app
    finally:
        await root.close()


async def call(
    app: OperationsApp,
    name: str,
    *,
    params: dict[str, str] | None = None,
    route: dict[str, str] | None = None,
    body: bytes | dict | None = None,
    headers: dict[str, str] | None = None,
    caller: str | None = "ops@example.com",
) -> tuple[int, dict[str, Any]]:
    """Route ``name`` (POST with ``body``, else GET) as ``caller``: who App Service
    Authentication says is calling (None: nobody signed in). Every answer is JSON that a browser
    must never sniff as a page (answers echo stored text: alert details, bodies)."""
    raw = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
    headers = dict(headers or {})
    if caller is not None:
        headers.setdefault(PRINCIPAL_HEADER, caller)
    url = app.url(name, route) + (f"?{urlencode(params)}" if params else "")
    response = await app.request("POST" if body is not None else "GET", url, body=raw,
                                 headers=headers)  # fmt: skip
    assert response.mimetype == "application/json"
    assert response.headers.get("X-Content-Type-Options") == "nosniff"
    return response.status_code, json.loads(response.get_body())
