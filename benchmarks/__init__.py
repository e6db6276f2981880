"""Benchmarks and long-running checks, run from the repository root as `python -m benchmarks.NAME`."""
