"""Bad input at start-up: a clear message naming problem and fix, a non-zero exit, nothing half-created."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import structlog

from cdc.dev import postgres as dev_postgres
from tests.support.connector import Connector, drop_slots, nothing_created, run_once, write_config

pytestmark = pytest.mark.integration


@pytest.fixture
def base(tmp_path, services, pg_dsn, slot_name, publication_name, topic_prefix):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
        conn.execute("CREATE TABLE nokey (a int, b text)")

    def make(**over: Any) -> Path:
        sections: dict[str, Any] = {
            "source": {"dsn": pg_dsn, "slot": slot_name, "publication": publication_name},
            "tables": ["public.customers"],
            "kafka": {"bootstrap_servers": services.kafka_bootstrap},
            "topic_prefix": topic_prefix,
        }
        sections.update(over)
        return write_config(tmp_path / "cdc.yaml", **sections)

    return make


def test_a_table_that_does_not_exist_is_named_and_nothing_is_created(
    tmp_path, base, pg_dsn, slot_name, publication_name, topic_prefix, kafka_admin
):
    code, out = run_once(tmp_path, base(tables=["public.customers", "public.missing"]))
    assert code == 1
    assert "table public.missing does not exist in database" in out
    assert "remove it from 'tables'" in out
    nothing_created(pg_dsn, slot_name, publication_name, kafka_admin, topic_prefix)
    # The next start, with the configuration fixed, works.
    c = Connector(base(), tmp_path / "ok.log").start()
    c.wait_streaming(pg_dsn, slot_name)
    assert c.stop() == 0


def test_a_table_without_a_key_is_refused_with_the_fix(
    tmp_path, base, pg_dsn, slot_name, publication_name, topic_prefix, kafka_admin
):
    code, out = run_once(tmp_path, base(tables=["public.nokey"]))
    assert code == 1
    assert "has no primary key" in out and "REPLICA IDENTITY FULL" in out
    nothing_created(pg_dsn, slot_name, publication_name, kafka_admin, topic_prefix)


def test_a_role_without_replication_is_told_to_grant_it(
    tmp_path, base, pg_dsn, slot_name, publication_name, topic_prefix, kafka_admin
):
    role = f"norepl_{slot_name[-8:]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT SELECT ON customers TO {role}")
    try:
        dsn = psycopg.conninfo.make_conninfo(pg_dsn, user=role)
        code, out = run_once(tmp_path, base(source={"dsn": dsn, "slot": slot_name, "publication": publication_name}))
        assert code == 1
        assert f"role {role} lacks the REPLICATION attribute" in out
        assert f"ALTER ROLE {role} REPLICATION" in out
        nothing_created(pg_dsn, slot_name, publication_name, kafka_admin, topic_prefix)
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def test_an_unreachable_broker_is_named_and_no_slot_is_left(
    tmp_path, base, pg_dsn, slot_name, publication_name, topic_prefix
):
    code, out = run_once(tmp_path, base(kafka={"bootstrap_servers": "127.0.0.1:1"}))
    assert code == 1
    assert "cannot reach Kafka at 127.0.0.1:1" in out and "kafka.bootstrap_servers" in out
    nothing_created(pg_dsn, slot_name, publication_name, None, topic_prefix)


def test_malformed_yaml_exits_2_with_a_message(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("source:\n  dsn: [unclosed\n")
    proc = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "run", "--config", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "is not valid YAML" in proc.stderr


def test_validate_explains_errors_with_the_key_path(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "source:\n  dsn: postgresql://x@h/db\n  slot: s\ntables: [public.t]\nkafka: {bootstrap_servers: a:1, "
        "partitons: 3}\ntopic_prefix: p\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "validate", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "source.publication: required key is missing" in proc.stderr
    assert "kafka.partitons: unknown key" in proc.stderr


def test_a_server_without_logical_wal_level_is_refused_with_the_fix(tmp_path, services, kafka_admin):
    state = tmp_path / "pg-replica"
    log = structlog.get_logger("test")
    dsn = dev_postgres.up(state, log, settings={"wal_level": "replica"})
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE customers (id int PRIMARY KEY)")
        config = write_config(
            tmp_path / "cdc.yaml",
            source={"dsn": dsn, "slot": "s_walcheck", "publication": "p_walcheck"},
            tables=["public.customers"],
            kafka={"bootstrap_servers": services.kafka_bootstrap},
            topic_prefix="walcheck",
        )
        code, out = run_once(tmp_path, config)
        assert code == 1
        assert "wal_level=replica" in out and "ALTER SYSTEM SET wal_level = logical" in out
        nothing_created(dsn, "s_walcheck", "p_walcheck", kafka_admin, "walcheck")
    finally:
        dev_postgres.down(state, log)


def test_a_pre_created_publication_the_role_may_not_alter_is_named_with_the_fix_before_any_topic(
    tmp_path, base, pg_dsn, slot_name, publication_name, topic_prefix, kafka_admin
):
    role = f"least_{slot_name[-8:]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        conn.execute(f"CREATE ROLE {role} LOGIN REPLICATION")
        conn.execute(f"GRANT SELECT ON customers, orders TO {role}")
        conn.execute(f"CREATE PUBLICATION {publication_name} FOR TABLE customers")
    try:
        dsn = psycopg.conninfo.make_conninfo(pg_dsn, user=role)
        cfg = base(
            source={"dsn": dsn, "slot": slot_name, "publication": publication_name},
            tables=["public.customers", "public.orders"],
        )
        code, out = run_once(tmp_path, cfg)
        assert code == 1
        assert f"ALTER PUBLICATION {publication_name} ADD TABLE public.orders;" in out
        assert not [t for t in kafka_admin.list_topics(timeout=10).topics if t.startswith(topic_prefix + ".")]
        # With exactly the published table, the least-privilege role streams.
        ok = base(source={"dsn": dsn, "slot": slot_name, "publication": publication_name})
        c = Connector(ok, tmp_path / "ok.log").start()
        c.wait_streaming(pg_dsn, slot_name)
        assert c.stop() == 0
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP PUBLICATION IF EXISTS {publication_name}")
            drop_slots(conn, conn.info.dbname)  # waits out the stopped daemon's walsender
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


# --------------------------------------------------------------------------- cdc validate = cdc run's checks

VALIDATE_CASES: dict[str, dict[str, Any]] = {
    "misspelt table": {"tables": ["public.custmers"]},
    "no primary key and no key": {"tables": ["public.nokey"]},
    "key column that does not exist": {"tables": [{"name": "public.customers", "key": ["customer_no"]}]},
    "partition named instead of its table": {"tables": ["public.shipments_2025"]},
    "unreachable broker": {"kafka": {"bootstrap_servers": "127.0.0.1:1"}},
}


@pytest.mark.parametrize("case", sorted(VALIDATE_CASES))
def test_validate_refuses_what_run_refuses_with_the_same_message(
    tmp_path, base, pg_dsn, slot_name, publication_name, topic_prefix, kafka_admin, case
):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE shipments (id int, day date, PRIMARY KEY (id, day)) PARTITION BY RANGE (day)")
        conn.execute(
            "CREATE TABLE shipments_2025 PARTITION OF shipments FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')"
        )
    config = base(**VALIDATE_CASES[case])
    validate = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "validate", str(config)], capture_output=True, text=True, timeout=120
    )
    assert validate.returncode == 1, validate.stdout + validate.stderr
    nothing_created(pg_dsn, slot_name, publication_name, None, topic_prefix)
    code, _ = run_once(tmp_path, config)
    assert code == 1
    [fatal] = [e["error"] for e in Connector(config, tmp_path / "cdc.log").log_events() if e.get("event") == "fatal"]
    assert fatal.strip() in validate.stderr, f"cdc run said:\n{fatal}\ncdc validate said:\n{validate.stderr}"
    nothing_created(pg_dsn, slot_name, publication_name, None, topic_prefix)


def test_validate_passes_a_good_configuration_and_offline_checks_only_the_file(tmp_path, base, pg_dsn, slot_name):
    config = base()
    good = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "validate", str(config)], capture_output=True, text=True, timeout=120
    )
    assert good.returncode == 0, good.stderr
    assert "1 tables ready to capture" in good.stdout and "reachable" in good.stdout
    offline = base(source={"dsn": "host=127.0.0.1 port=1 dbname=x", "slot": slot_name, "publication": "p"})
    proc = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "validate", "--offline", str(offline)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "were not checked" in proc.stdout, proc.stderr


# --------------------------------------------------------------------------- every printed fix works


def printed_fixes(out: str) -> list[str]:
    """The SQL statements a start-up error tells the owner to run, as printed."""
    return re.findall(r"((?:CREATE|ALTER) PUBLICATION [^;]+;)", out)


@pytest.mark.parametrize(
    "situation", ["missing publication", "publication without via root", "publication missing a table"]
)
def test_every_printed_fix_runs_as_printed_and_the_daemon_then_streams(
    tmp_path, services, pg_dsn, least_role, slot_name, publication_name, topic_prefix, consume_all, situation
):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE shipments (id int, day date, PRIMARY KEY (id, day)) PARTITION BY RANGE (day)")
        conn.execute(
            "CREATE TABLE shipments_2025 PARTITION OF shipments FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')"
        )
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
        if situation == "publication without via root":
            conn.execute(f"CREATE PUBLICATION {publication_name} FOR TABLE shipments, customers")
        elif situation == "publication missing a table":
            conn.execute(
                f"CREATE PUBLICATION {publication_name} FOR TABLE shipments WITH (publish_via_partition_root = true)"
            )
    role_dsn = least_role(["public.shipments", "public.shipments_2025", "public.customers"])
    config = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": role_dsn, "slot": slot_name, "publication": publication_name},
        tables=["public.shipments", "public.customers"],
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix=topic_prefix,
    )
    code, out = run_once(tmp_path, config)
    assert code == 1
    fixes = printed_fixes(out)
    assert fixes, out
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # as the owner, exactly as printed
        for statement in fixes:
            conn.execute(statement.encode().decode("unicode_escape") if "\\" in statement else statement)
    c = Connector(config, tmp_path / "fixed.log").start()
    try:
        c.wait_streaming(pg_dsn, slot_name)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO shipments VALUES (1, '2025-03-01')")
            conn.execute("INSERT INTO customers VALUES (1, 'ada')")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = consume_all([f"{topic_prefix}.public.shipments", f"{topic_prefix}.public.customers"], timeout=30)
            if len(got) >= 2:
                break
            time.sleep(0.5)
        assert sorted(m.topic() for m in got) == [
            f"{topic_prefix}.public.customers",
            f"{topic_prefix}.public.shipments",
        ]
    finally:
        assert c.stop() == 0, c.output()[-4000:]


def test_validate_refuses_declared_spark_views_that_cannot_be_built_naming_each(tmp_path, base):
    config = base(
        spark={
            "views": [
                {"name": "ok", "sql": "SELECT id, name FROM public_customers", "key": ["id"]},
                {"name": "typo", "sql": "SELECT id, nmae FROM public_customers", "key": ["id"]},
                {"name": "nokey", "sql": "SELECT id FROM public_customers", "key": ["customer_id"]},
                {"name": "unknown", "sql": "SELECT * FROM public_orders", "key": ["id"]},
                {"name": "broken", "sql": "SELECT id FROM (", "key": ["id"]},
            ],
            "indexes": [
                {"name": "people", "sql": "SELECT id, name FROM public_customers", "id": "id", "text": {"nme": 1.0}}
            ],
        }
    )
    proc = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "validate", str(config)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stdout
    err = proc.stderr
    assert "view typo: Column 'nmae' could not be resolved" in err
    assert "view nokey: its query does not give the column(s) customer_id" in err
    assert "view unknown: unknown table(s) public_orders (the captured tables are: public_customers)" in err
    assert "view broken: its SQL does not parse" in err
    assert "index people: its query does not give the column(s) nme" in err
    assert "view ok" not in err


def test_validate_names_each_table_whose_unchanged_toasted_values_are_not_sent_with_the_mode_and_the_alternative(
    tmp_path, base, pg_dsn
):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, body text, n int)")
        conn.execute("CREATE TABLE full_docs (id int PRIMARY KEY, body text)")
        conn.execute("ALTER TABLE full_docs REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE counters (id int PRIMARY KEY, n int)")  # nothing TOASTable
    config = base(
        tables=[
            "public.customers",
            {"name": "public.docs", "toast": "placeholder"},
            "public.full_docs",
            "public.counters",
        ]
    )
    proc = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "validate", str(config)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "unchanged TOAST" in line]
    assert len(lines) == 2, proc.stdout  # not full_docs (FULL carries the values), not counters
    customers, docs = sorted(lines)
    assert (
        "public.customers: REPLICA IDENTITY DEFAULT, TOASTable columns name" in customers and "toast: fill" in customers
    )
    assert "public.docs: REPLICA IDENTITY DEFAULT, TOASTable columns body;" in docs and "toast: placeholder" in docs
    assert all("ALTER TABLE public." in line and "REPLICA IDENTITY FULL;" in line and "WAL" in line for line in lines)
