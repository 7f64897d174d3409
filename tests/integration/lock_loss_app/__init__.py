"""The FunctionApp the lock-loss tests run (see function_app.py)."""
