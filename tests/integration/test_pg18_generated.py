"""PostgreSQL 18 publishes stored generated columns when the publication says so
(``publish_generated_columns = stored``): the snapshot copies them too, so that snapshot and stream
agree; without the option neither carries them."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest

from tests.support.connector import Connector, write_config

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("publish", [True, False])
def test_generated_columns_are_in_snapshot_and_stream_exactly_when_published(
    tmp_path, services, pg18_dsn, slot_name, publication_name, topic_prefix, consume_all, publish
):
    with psycopg.connect(pg18_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE items (id int PRIMARY KEY, price int, doubled int GENERATED ALWAYS AS (price * 2) STORED)"
        )
        conn.execute("INSERT INTO items (id, price) VALUES (1, 10), (2, 20)")
        option = " WITH (publish_generated_columns = stored)" if publish else ""
        conn.execute(f"CREATE PUBLICATION {publication_name} FOR TABLE items{option}")
    config = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": pg18_dsn, "slot": slot_name, "publication": publication_name},
        tables=["public.items"],
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix=topic_prefix,
    )
    daemon = Connector(config, tmp_path / "cdc.log").start()
    topic = f"{topic_prefix}.public.items"
    try:
        daemon.wait_streaming(pg18_dsn, slot_name)
        with psycopg.connect(pg18_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO items (id, price) VALUES (3, 30)")
        deadline = time.monotonic() + 60
        rows: dict[int, dict[str, Any]] = {}
        while len(rows) < 3:
            rows = {
                json.loads(m.value())["after"]["id"]: json.loads(m.value()) for m in consume_all([topic], timeout=30)
            }
            assert time.monotonic() < deadline, daemon.output()[-3000:]
            time.sleep(0.3)
    finally:
        assert daemon.stop() == 0
    assert [rows[i]["op"] for i in (1, 2, 3)] == ["r", "r", "c"]  # two snapshot reads, one streamed insert
    if publish:
        assert [rows[i]["after"] for i in (1, 2, 3)] == [
            {"id": 1, "price": 10, "doubled": 20},
            {"id": 2, "price": 20, "doubled": 40},
            {"id": 3, "price": 30, "doubled": 60},
        ]
    else:
        assert all(set(rows[i]["after"]) == {"id", "price"} for i in (1, 2, 3))
