"""Benchmarks: commands that measure, write machine-readable results, and never print an unmeasured number."""
