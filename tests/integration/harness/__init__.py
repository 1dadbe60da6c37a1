"""Helpers shared by the integration tests, one module per subject; conftest.py holds the fixtures
and the helpers every test file uses. No test file imports another."""
