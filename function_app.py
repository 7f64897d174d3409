"""Azure Functions entry point (v2 programming model): the FunctionApp and its blueprints.

Scheduler (Service Bus triggers on the orders, agent-responses and scheduler-commands queues),
one Agent per remote service (Service Bus triggers on their request queues), the Supervisor
(timer trigger), the retention purge (timer trigger) and the operator API (HTTP triggers,
function keys). Queue names, the Supervisor's schedule and connections are app settings
(`%NAME%`); the purge's schedule is the PURGE_SCHEDULE setting read at indexing
(retention/functions.py says why). Telemetry is configured first: export to
Application Insights when APPLICATIONINSIGHTS_CONNECTION_STRING is set, nothing otherwise.
Then the settings are checked, so a host with a wrong one fails to load the app, naming every
wrong setting, instead of failing (and dead-lettering) every message it receives.
"""

import azure.functions as func

from adapters import telemetry
from adapters.settings import Settings
from agent.functions import bp as agents
from dashboard.functions import bp as dashboard
from operator_api.functions import bp as operator_api
from retention.functions import bp as retention
from scheduler.functions import bp as scheduler
from supervisor.functions import bp as supervisor

telemetry.configure()
Settings.check_on_load()

app = func.FunctionApp()
for blueprint in (scheduler, agents, supervisor, retention, operator_api, dashboard):
    app.register_functions(blueprint)
