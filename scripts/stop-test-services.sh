#!/usr/bin/env bash
# Stops the test services: the suite's PostgreSQL and Kafka (.cdc-dev/test, or CDC_TEST_STATE_DIR) and
# the PostgreSQL server of each major version in PG_VERSIONS (.cdc-dev/test-pg<v>) and the one with a
# synchronous standby setting (.cdc-dev/test-syncrep, test_snapshot_hazard.py). Called once, after
# the last test session that uses them (scripts/test.sh, scripts/test-versions.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PG_VERSIONS=${PG_VERSIONS:-} "${PYTHON:-.venv/bin/python}" - <<'PY'
import os
from pathlib import Path

import structlog

from cdc import dev
from cdc.dev import postgres

state = Path(os.environ.get("CDC_TEST_STATE_DIR") or ".cdc-dev/test").resolve()
for other in [state.with_name(f"{state.name}-pg{v}") for v in os.environ["PG_VERSIONS"].split()] + [
    state.with_name("test-syncrep")  # test_snapshot_hazard.py: beside the state directory, whatever its name
]:
    if other.exists():
        postgres.down(other, structlog.get_logger())
dev.down(state)
PY
