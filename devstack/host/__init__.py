"""A small local Functions host for this app's own functions.

It imports the app module, indexes ``app.get_functions()`` the way the Azure host does, and
drives each function: Service Bus queue triggers in peek-lock (complete on return, abandon on
exception, lock renewed while running), timer triggers on their NCRONTAB schedule, HTTP triggers
behind a local server (when given a port). Coroutine functions are awaited on one event loop,
sync functions run on threads, as the Python worker runs them. Run it with
``python -m devstack.host``.
"""

from devstack.host.host import FunctionInfo, LocalHost
from devstack.host.settings import HostConfigError, load_settings
from devstack.host.stats import FunctionStats

__all__ = ["FunctionInfo", "FunctionStats", "HostConfigError", "LocalHost", "load_settings"]
