"""Test helpers shared by tests/unit and tests/integration: fixture modules (loaded by tests/conftest.py as
``pytest_plugins``) and helper modules; no test module is imported by another."""
