"""Helpers shared by the tests (and by the benchmarks that reuse them: soak, fuzz, structured):
plain modules imported as ``tests.helpers.NAME``.  Pytest fixtures live in the conftest.py
files: tests/conftest.py (models, engines, servers, frontend backends) and one per layer
folder where a fixture concerns that layer alone (tests/kernels/conftest.py)."""
