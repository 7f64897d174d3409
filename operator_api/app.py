"""The operations app's FastAPI application: the operator API's routes, the dashboard's beside
them, and the OpenAPI 3.1 document, FastAPI's (GET /api/openapi.json; Swagger UI is the
dashboard's, from vendored files), all under ``/api``, the Functions host's route prefix. The
routes find what they work with on the app's composition root, kept in its state."""

from __future__ import annotations

from typing import Any, Final

from fastapi import APIRouter, FastAPI, Request, Response
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Mount

from operator_api import routes
from operator_api.http import json_response
from service.operations import errors
from service.operations.composition import OperationsRoot

PREFIX: Final = "/api"
DESCRIPTION: Final = (
    "Watch and repair orders of the Scheduler Agent Supervisor app: list orders by state and "
    "filter, inspect and watch one, resubmit, restart or cancel it or many, read and "
    "acknowledge alerts, read, replay and purge dead letters, purge finished orders and read "
    "them back from the archive, check the app's health. Every call needs a function key."
)


class _OperatorAPI(FastAPI):
    def openapi(self) -> dict[str, Any]:
        """FastAPI's document (which it makes once, then keeps) less the 422 it adds to routes with
        parameters: this API refuses invalid input with 400, documented per route."""
        made = super().openapi()
        for item in made["paths"].values():
            for operation in item.values():
                operation["responses"].pop("422", None)
        for unused in ("HTTPValidationError", "ValidationError"):
            made["components"]["schemas"].pop(unused, None)
        return made


def build(root: OperationsRoot, *beside: APIRouter) -> FastAPI:
    """The operator API on ``root``, with the routers ``beside`` it (the dashboard's) left
    undocumented."""
    api = _OperatorAPI(
        title="Order processing operator API", version="1.0.0", description=DESCRIPTION,
        servers=[{"url": PREFIX}], root_path_in_servers=False,
        openapi_url=None, docs_url=None, redoc_url=None,
        # The Functions host records each request (its invocation span, made current by the
        # worker), and the actions trace into the order's trace: FastAPI's own spans, metrics
        # and logs of refused requests would only repeat them.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )  # fmt: skip
    api.state.root = root
    api.include_router(routes.router)
    for router in beside:
        api.include_router(router, include_in_schema=False)
    api.add_exception_handler(HTTPException, _unrouted)
    return api


def mounted(api: FastAPI) -> Starlette:
    """``api`` where the Functions host's requests reach it: under :data:`PREFIX`."""
    return Starlette(routes=[Mount(PREFIX, app=api)])


async def _unrouted(request: Request, error: Exception) -> Response:
    """No route for the path (404) or the method (405): the API's error, not FastAPI's."""
    assert isinstance(error, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "bad_request")
    unserved = errors.OperatorError(code, f"no function serves {request.method} {request.url.path}")
    return json_response(error.status_code, unserved.to_json(), error.headers)
