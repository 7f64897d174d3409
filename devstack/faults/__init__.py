"""Faults the chaos run puts the local stack through beyond a kill (dev stack only): a storage
proxy that throttles and answers ambiguously, and skewed host clocks."""
