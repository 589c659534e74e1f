"""`source.slot_failover` unset: the slot the daemon creates is a failover slot exactly where the server
can keep one (PostgreSQL 17+, a primary). `make test-versions` runs this on 16, 17 and 18."""

from __future__ import annotations

import psycopg
import pytest

from tests.support.connector import Connector, write_config

pytestmark = pytest.mark.integration


def test_the_slot_the_daemon_creates_is_a_failover_slot_from_17_on(
    tmp_path, services, pg_dsn, slot_name, publication_name, topic_prefix
):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        version = conn.info.server_version
    path = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": pg_dsn, "slot": slot_name, "publication": publication_name},
        tables=["public.items"],
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix=topic_prefix,
    )
    daemon = Connector(path, tmp_path / "cdc.log").start()
    try:
        daemon.wait_streaming(pg_dsn, slot_name)
        created = [e for e in daemon.log_events() if e.get("event") == "slot_created"]
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            columns = {
                r[0]
                for r in conn.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = 'pg_replication_slots'::regclass AND attnum > 0"
                )
            }
            failover = (
                conn.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (slot_name,)).fetchone()
                if "failover" in columns
                else None
            )
    finally:
        assert daemon.stop() == 0
    assert len(created) == 1
    if version >= 170000:
        assert failover == (True,)
        assert created[0]["failover"] is True
    else:
        assert "failover" not in columns  # no failover slots before 17: nothing to set
        assert not created[0].get("failover")
