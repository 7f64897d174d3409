"""The operations app's entry point: the operator API and the dashboard, on FastAPI, served
through the Python worker's ASGI support, and the retention purge's timer.

Deployed from the same package as the pattern app (function_app.py); the Function App chooses
this file with the worker's PYTHON_SCRIPT_FILE_NAME setting, so its instances import only the
operator surface and the housekeeping, and the pattern app's never do (docs/architecture.md,
Two apps). One HTTP function (`http_app_func`, route ``/{*route}``) hands every request under
``/api`` to the FastAPI app; its AuthLevel.FUNCTION makes the Functions host refuse a request
without a function or host key before any code here runs, and each request runs within its
time, as each trigger of the pattern app does within its own
(:func:`service.deadlines.http_request`: its Table calls end before Azure's front end gives up
on it). One timer function (`retention_purge`, retention/functions.py) archives and deletes the
finished orders past retention, with the same code and archive as ``POST /api/purge``.
Telemetry first, then the settings check (every app's and the retention purge's:
:class:`adapters.retention_settings.RetentionSettings`), as function_app.py does; the settings
checked make the process's composition root (:mod:`service.operations.composition`), which the
FastAPI app hands to its routes and :func:`serve` to the timer. Tests :func:`serve` an API of
their own, on a root of their own.
"""

from typing import Any

import azure.functions as func
from fastapi import FastAPI

from adapters import telemetry
from adapters.retention_settings import RetentionSettings
from dashboard.routes import router as dashboard
from operator_api.app import build, mounted
from retention import functions as retention
from service import deadlines
from service.operations.composition import OperationsRoot


def serve(api: FastAPI) -> func.AsgiFunctionApp:
    """``api`` behind one HTTP function that needs a key, each request within its time; and the
    retention timer, on the composition root ``api`` was built on."""
    served = mounted(api)

    async def bounded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await served(scope, receive, send)
        with deadlines.http_request():
            await served(scope, receive, send)

    app = func.AsgiFunctionApp(app=bounded, http_auth_level=func.AuthLevel.FUNCTION)
    app.register_functions(retention.blueprint(api.state.root))
    return app


telemetry.configure()
api = build(OperationsRoot(RetentionSettings.check_on_load()), dashboard)
app = serve(api)
