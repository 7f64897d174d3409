"""A tiny FunctionApp the local host tests run (see function_app.py)."""
