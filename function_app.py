"""The pattern app's entry point (Azure Functions v2 programming model): its FunctionApp.

Scheduler (Service Bus triggers on the orders, agent-responses and scheduler-commands queues),
one Agent per remote service (Service Bus triggers on their request queues) and the Supervisor
(timer trigger): the pattern, nothing else. No HTTP trigger, and no housekeeping: the operator
API, the dashboard and the retention purge are the operations app's (operations_app.py),
deployed beside this one from the same package. Queue names, the Supervisor's schedule and
connections are app settings (`%NAME%`). Telemetry is configured first: export to
Application Insights when APPLICATIONINSIGHTS_CONNECTION_STRING is set, nothing otherwise.
Then the settings are checked (this app's: not the retention purge's), so a host with a wrong
one fails to load the app, naming every wrong setting, instead of failing (and dead-lettering)
every message it receives. The settings checked make the process's composition root
(:mod:`service.composition`: its Runtime, built on the first invocation), handed to every
blueprint; tests :func:`build` the app on a root of their own.
"""

import azure.functions as func

from adapters import telemetry
from adapters.settings import Settings
from agent import functions as agents
from scheduler import functions as scheduler
from service.composition import PatternRoot
from supervisor import functions as supervisor


def build(root: PatternRoot) -> func.FunctionApp:
    """The pattern app's functions, on ``root``."""
    app = func.FunctionApp()
    for entry in (scheduler, agents, supervisor):
        app.register_functions(entry.blueprint(root))
    return app


telemetry.configure()
app = build(PatternRoot(Settings.check_on_load()))
