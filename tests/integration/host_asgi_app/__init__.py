"""A tiny ASGI app (FastAPI) behind func.AsgiFunctionApp, for the local host's HTTP tests."""
