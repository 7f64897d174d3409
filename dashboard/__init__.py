"""The operator dashboard: a browser UI served by the function app itself (``/api/dashboard``).

The page and its assets are HTTP-triggered functions (:mod:`dashboard.functions`); the page
calls the operator API (``/api/orders``, ``/api/alerts``, ...) from the browser for every
read and action, and one summary of its own (:mod:`service.operations.summary`) for the overview.
"""
