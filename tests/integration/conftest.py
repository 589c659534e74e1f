"""Fixtures the integration modules share by name (pytest finds them here; no test module imports another)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The session's SparkSession (tests.support.spark builds it; importing that module skips without pyspark)."""
    from tests.support.spark import test_session

    session = test_session()
    yield session
    session.stop()
