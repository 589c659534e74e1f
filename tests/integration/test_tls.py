"""TLS for real: a PostgreSQL that accepts only TLS connections, the broker's SSL listener, throw-away certificates.

The Postgres server is an extra local instance (about three seconds to make and start) whose
pg_hba.conf rejects every connection without TLS; the broker is the session's, whose SSL
listener uses the dev CA (``cdc.dev.kafka``). Certificates come from ``cdc.dev.tls`` (openssl).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import structlog

from cdc.dev import postgres as dev_postgres
from cdc.dev import tls
from tests.support.connector import Connector, write_config

pytestmark = pytest.mark.integration

SECRET = "tls-k3y-pa55-never-logged"

HBA = """\
local all all trust
hostnossl all all 0.0.0.0/0 reject
hostssl all all 127.0.0.1/32 trust
hostssl all all ::1/128 trust
"""


@pytest.fixture(scope="module")
def tls_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, tls.Tls]]:
    """(DSN of a superuser over verify-full TLS, the server's TLS files); plain connections are rejected."""
    if not tls.available():
        pytest.fail("openssl is needed to make the test certificates (apt-get install openssl)")
    state = tmp_path_factory.mktemp("pg-tls")
    log = structlog.get_logger("test")
    files = tls.ensure(dev_postgres.root_dir(state) / "tls")  # chowned to the server's user by up()
    dsn = dev_postgres.up(
        state,
        log,
        settings={"ssl": "on", "ssl_cert_file": f"'{files.server_cert}'", "ssl_key_file": f"'{files.server_key}'"},
    )
    try:
        (dev_postgres.data_dir(state) / "pg_hba.conf").write_text(HBA)
        port = psycopg.conninfo.conninfo_to_dict(dsn)["port"]
        secure = (
            f"host=localhost port={port} dbname=postgres user=postgres sslmode=verify-full sslrootcert={files.ca_cert}"
        )
        with psycopg.connect(secure, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        yield secure, files
    finally:
        dev_postgres.down(state, log)


def test_a_plain_connection_is_rejected_by_the_tls_server(tls_postgres):
    secure, _ = tls_postgres
    plain = psycopg.conninfo.make_conninfo(secure, sslmode="disable", sslrootcert="")
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(plain, connect_timeout=5).close()


def test_the_connector_streams_over_verify_full_tls_and_produces_over_kafka_ssl(
    tmp_path, services, services_mode, tls_postgres, topic_prefix, consume_all
):
    if services_mode == "docker":
        pytest.skip("the Kafka container of a Docker session has no SSL listener; run with CDC_TEST_SERVICES=local")
    if services.kafka_ssl_bootstrap is None:
        pytest.fail("the session broker has no SSL listener (cdc.dev.kafka starts one when openssl is installed)")
    secure, files = tls_postgres
    with psycopg.connect(secure, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS items")
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO items VALUES (1, 'snapshot')")
    slot = f"s_{topic_prefix[-6:]}"
    cfg = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": secure, "slot": slot, "publication": f"p_{topic_prefix[-6:]}"},
        tables=["public.items"],
        kafka={
            "bootstrap_servers": services.kafka_ssl_bootstrap,
            "producer": {"security.protocol": "SSL", "ssl.ca.location": services.kafka_ssl_ca_location},
        },
        topic_prefix=topic_prefix,
        status_interval_s=1.0,
    )
    # Secrets given the documented way, through the environment: they must never show up in any output.
    env = {
        "CDC_SOURCE__PASSWORD": SECRET,
        "CDC_KAFKA__PRODUCER": json.dumps({"ssl.key.password": SECRET, "sasl.password": SECRET}),
    }
    c = Connector(cfg, tmp_path / "cdc.log", env=env).start()
    try:
        c.wait_streaming(secure, slot)
        with psycopg.connect(secure, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (2, 'streamed')")
            walsender_tls = conn.execute(
                "SELECT s.ssl FROM pg_stat_replication r JOIN pg_stat_ssl s ON s.pid = r.pid WHERE "
                "r.application_name <> ''"
            ).fetchall()
        assert walsender_tls == [(True,)]  # the replication connection is encrypted too
        topic = f"{topic_prefix}.public.items"
        deadline = time.monotonic() + 30
        rows: list[Any] = []
        while time.monotonic() < deadline and len(rows) < 2:
            rows = [json.loads(m.value()) for m in consume_all([topic], timeout=10.0)]
            time.sleep(0.3)
        assert sorted((r["op"], r["after"]["name"]) for r in rows) == [("c", "streamed"), ("r", "snapshot")]
    finally:
        assert c.stop() == 0
    status = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "status", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert status.returncode == 0, status.stderr
    assert "public.items" in status.stdout and "records 2" in status.stdout  # read over SSL too
    for text in (c.output(), status.stdout + status.stderr):
        assert SECRET not in text
    with psycopg.connect(secure, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def test_a_wrong_ca_is_refused_naming_the_setting_and_nothing_is_created(tmp_path, services, tls_postgres, kafka_admin):
    secure, _ = tls_postgres
    other_ca = tls.ensure(tmp_path / "other-ca", common_name="someone else")
    cfg = write_config(
        tmp_path / "cdc.yaml",
        source={
            "dsn": psycopg.conninfo.make_conninfo(secure, sslrootcert=str(other_ca.ca_cert)),
            "slot": "s_wrongca",
            "publication": "p_wrongca",
        },
        tables=["public.items"],
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix="wrongca",
    )
    c = Connector(cfg, tmp_path / "cdc.log").start()
    assert c.wait_exit(60) == 1
    fatal = [e for e in c.log_events() if e.get("event") == "fatal"]
    assert fatal, c.output()
    assert "certificate verify failed" in fatal[0]["error"]
    assert "check the TLS settings in source.dsn: sslrootcert must name the CA" in fatal[0]["error"]
    with psycopg.connect(secure, autocommit=True) as conn:
        assert conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 's_wrongca'").fetchone() is None
    assert not [t for t in kafka_admin.list_topics(timeout=10).topics if t.startswith("wrongca.")]
