"""The container tests reuse the integration fixtures (real Postgres and Kafka) and add the
`container` marker: `pytest -m container` runs only them, `-m 'not container'` leaves them out."""

from __future__ import annotations

import pytest

from tests.integration.conftest import (  # noqa: F401  (fixtures, registered by being imported here)
    consume_all,
    dev_state_dir,
    kafka_admin,
    pg_dsn,
    publication_name,
    services,
    services_mode,
    slot_name,
    test_id,
    topic_prefix,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "container: runs the daemon's image with podman (built by make image)")
