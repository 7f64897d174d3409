"""The operations app's entry point: the operator API and the dashboard, on FastAPI, served
through the Python worker's ASGI support.

Deployed from the same package as the pattern app (function_app.py); the Function App chooses
this file with the worker's PYTHON_SCRIPT_FILE_NAME setting, so its instances import only the
operator surface, and the pattern app's never do (docs/architecture.md, Two apps). One HTTP
function (`http_app_func`, route ``/{*route}``) hands every request under ``/api`` to the
FastAPI app; its AuthLevel.FUNCTION makes the Functions host refuse a request without a
function or host key before any code here runs. Telemetry first, then the settings check, as
function_app.py does.
"""

import azure.functions as func

from adapters import telemetry
from adapters.settings import Settings
from dashboard.routes import router as dashboard
from operator_api.app import build, mounted

telemetry.configure()
Settings.check_on_load()

api = build(dashboard)
app = func.AsgiFunctionApp(app=mounted(api), http_auth_level=func.AuthLevel.FUNCTION)
