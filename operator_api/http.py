"""How the operator API answers and refuses: JSON never cached and never sniffed (an answer may
quote stored text from outside); every refusal ``{"error": {"code", "message"}}`` with its status
(:mod:`service.operations.errors`), never FastAPI's 422. Who acts is the caller App Service
Authentication names (the local host: ``DEVHOST_PRINCIPAL_NAME``), never a body's ``operator``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader, APIKeyQuery
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from adapters import deadline
from service.operations import errors
from service.operations.composition import OperationsRoot
from service.operations.context import OperatorContext
from service.operations.models import ErrorBody

log = logging.getLogger("operator_api.http")

MAX_BODY_BYTES: Final = 16 * 1024
PRINCIPAL_HEADER: Final = "X-MS-CLIENT-PRINCIPAL-NAME"
TOO_LARGE: Final = errors.TooLarge("body_too_large", f"the body is over {MAX_BODY_BYTES} bytes")
INTERNAL: Final = errors.ServerFault("internal", "the request failed on our side; it is logged")
OUT_OF_TIME: Final = errors.ServerFault("out_of_time", "the request ran out of time: try again")
UNREADABLE: Final = errors.InvalidRequest("invalid_json", "the body is not UTF-8 JSON, or too deep")
ERRORS: Final = {
    400: "Invalid input: the message says what to fix",
    401: "Missing or wrong function key (answered by the Functions host)",
    404: "Unknown order, alert or queue (or an order not in the archive)",
    409: "The action does not apply to the order or alert as it is now",
    413: "Request body too large",
    500: "A fault on the server side (logged)",
    503: "Busy: the same request may succeed in a moment",
}
Answer = tuple[type[BaseModel] | None, str]
"""A success: the model of its body (None: JSON of no declared shape) and what it means."""


def json_response(status: int, body: Any, extra: Mapping[str, str] | None = None) -> Response:
    headers = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", **(extra or {})}
    return JSONResponse(body, status_code=status, headers=headers)


def refusal(error: errors.OperatorError) -> Response:
    return json_response(error.status, error.to_json())


class OperatorRoute(APIRoute):
    """A route whose every refusal is the API's error: an :class:`OperatorError` raised anywhere
    (a use case, a parameter's validator), a request FastAPI finds invalid or cannot read (400),
    a body over :data:`MAX_BODY_BYTES` (413, before it is parsed), a fault (500)."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handle = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                if len(await request.body()) > MAX_BODY_BYTES:
                    return refusal(TOO_LARGE)
                return await handle(request)
            except RequestValidationError as invalid:
                return refusal(_invalid(invalid.errors()))
            except errors.OperatorError as refused:
                return refusal(refused)
            except HTTPException:  # FastAPI's, for a body it cannot decode (not UTF-8, too deep)
                return refusal(UNREADABLE)
            except Exception:
                log.exception("operator API request %s %s failed", request.method, self.path)
                left = deadline.remaining()
                return refusal(OUT_OF_TIME if left is not None and left <= 0 else INTERNAL)

        return answer


router = APIRouter(
    route_class=OperatorRoute,
    strict_content_type=False,  # a body without a Content-Type is read as JSON, as before
    # The function key the Functions host checks before a request gets here: described only.
    dependencies=[
        Security(APIKeyHeader(name="x-functions-key", scheme_name="functionKeyHeader",
                              auto_error=False)),
        Security(APIKeyQuery(name="code", scheme_name="functionKeyQuery", auto_error=False)),
    ],
)  # fmt: skip


def route(method: str, path: str, tag: str, summary: str, answer: Answer,
          refusals: tuple[int, ...] = (), also: Mapping[int, Answer] | None = None,
          ) -> Callable[[Callable[..., Any]], Any]:  # fmt: skip
    """Registers the function for ``method`` on ``/api/<path>`` and describes it: its name is the
    operation's id (camelCased), its docstring the operation's description; ``answer`` is its
    200 (model, meaning), ``also`` its other successes, ``refusals`` their statuses (the host's
    401 and a fault's 500 are added; a route that lists none describes none)."""
    responses: dict[int | str, Any] = {s: {"model": m, "description": d}
                                       for s, (m, d) in (also or {}).items()}  # fmt: skip
    if refusals:
        responses |= {s: {"model": ErrorBody, "description": ERRORS[s]} for s in (*refusals, 500)}
        responses[401] = {"description": ERRORS[401]}

    def register(endpoint: Callable[..., Any]) -> Any:
        first, *words = endpoint.__name__.split("_")
        return router.api_route(
            f"/{path}", methods=[method], operation_id=first + "".join(map(str.title, words)),
            tags=[tag], summary=summary, description=" ".join((endpoint.__doc__ or "").split()),
            response_model=answer[0], response_description=answer[1], responses=responses,
        )(endpoint)  # fmt: skip

    return register


def root(request: Request) -> OperationsRoot:
    """The app's composition root, which :func:`operator_api.app.build` keeps in its state
    (declared, not ``cast``: tests/infra's analysis of what each route does follows it)."""
    built: OperationsRoot = request.app.state.root
    return built


async def context(request: Request) -> OperatorContext:
    """The operator context the requests share (the composition root's)."""
    return await root(request).context()


Context = Annotated[OperatorContext, Depends(context)]


def operator(request: Request) -> str:
    """Who acts: the caller the platform authenticated (never the body's ``operator``)."""
    principal = (request.headers.get(PRINCIPAL_HEADER) or "").strip()
    if not principal:
        raise errors.Unauthenticated(
            "not_signed_in",
            "no signed-in caller: operator actions record who acted, taken from App Service "
            f"Authentication ({PRINCIPAL_HEADER}); enable it on the Function App (see "
            "docs/deploy.md), or locally set DEVHOST_PRINCIPAL_NAME for the local host",
        )
    return principal


Actor = Annotated[str, Depends(operator)]


def _invalid(found: Any) -> errors.InvalidRequest:
    """What FastAPI found wrong with a request, said the way the API says it."""
    where, kind = tuple(found[0]["loc"]), found[0]["type"]
    if where[0] != "body":
        problem = "is required" if kind == "missing" else found[0]["msg"]
        return errors.InvalidRequest(
            "invalid_request", f"{where[0]} parameter {where[-1]!r} {problem}"
        )
    if kind == "json_invalid":
        why = found[0].get("ctx", {}).get("error", "")
        return errors.InvalidRequest("invalid_json", f"the body is not valid JSON: {why}")
    if where == ("body",) and kind != "missing":
        return errors.InvalidRequest("invalid_json", "the body must be a JSON object")
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in found[:5]
    )
    return errors.InvalidRequest("invalid_request", f"the body is invalid: {problems}")
