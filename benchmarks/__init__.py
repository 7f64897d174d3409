"""Performance benchmarks; each prints one JSON document (see its module docstring)."""
