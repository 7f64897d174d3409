"""Azure Functions entry point (v2 programming model).

This module only creates the FunctionApp and registers the blueprints of the scheduler,
agent and supervisor packages. Blueprints are registered here as they land; no function is
defined in this file.
"""

import azure.functions as func

app = func.FunctionApp()

# Blueprints are registered here as they land, e.g.:
#   from scheduler.functions import bp as scheduler_bp
#   app.register_functions(scheduler_bp)
