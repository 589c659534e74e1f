"""Fixture modules, listed once (as quix-streams' tests/conftest.py does): each test asks for fixtures by name."""

pytest_plugins = ["tests.support.services", "tests.support.pg18", "tests.support.roles"]
