"""The container tests use the service fixtures every test gets (tests/conftest.py loads them) and add
the `container` marker: `pytest -m container` runs only them, `-m 'not container'` leaves them out."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "container: runs the daemon's image with podman (built by make image)")
