"""The operator dashboard: a browser UI served by the operations app (``/api/dashboard``).

The page and its assets are FastAPI routes (:mod:`dashboard.routes`) beside the operator API;
the page calls the operator API (``/api/orders``, ``/api/alerts``, ...) from the browser for
every read and action, and one summary of its own (:mod:`service.operations.summary`) for the
overview.
"""
