"""Helpers shared by the tests (and by the benchmarks that reuse them: soak, fuzz, structured):
plain modules imported as ``tests.helpers.NAME``; pytest fixtures stay in tests/conftest.py."""
