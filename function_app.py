"""Azure Functions entry point (v2 programming model): the FunctionApp and its blueprints.

Scheduler (Service Bus triggers on the orders, agent-responses and scheduler-commands queues),
one Agent per remote service (Service Bus triggers on their request queues), the Supervisor
(timer trigger), and the operator API (HTTP triggers, function keys). Queue names, the schedule
and connections are app settings (`%NAME%`).
"""

import azure.functions as func

from agent.functions import bp as agents
from operator_api.functions import bp as operator_api
from scheduler.functions import bp as scheduler
from supervisor.functions import bp as supervisor

app = func.FunctionApp()
app.register_functions(scheduler)
app.register_functions(agents)
app.register_functions(supervisor)
app.register_functions(operator_api)
