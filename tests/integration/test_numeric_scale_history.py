"""The schema history (``<prefix>.__cdc_schema``) read the way a consumer reads it, with no Spark: every
record of a table whose numeric scale changed three times, in each of the three ways a change reaches
the daemon, decodes to exactly the database's value with the scale the history says is in force at the
record's position.

The three ways (``cdc.pipeline.history``'s docstring): an ALTER while the daemon streams, followed by a
change (a Relation message announces it); an ALTER while no daemon runs (the start-up compares the
catalog with the version in force); an ALTER followed by no change before a snapshot reads the table
(the DBLog chunk carries rows of the new type before any Relation message says so).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from cdc.schema_history import History, decode, topic_for
from cdc.sink.position import record_position
from tests.support.connector import Connector, write_config

pytestmark = pytest.mark.integration

TABLE = "public.ledger"


def owner(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def expected(row_id: int) -> Decimal:
    """Every row's amount, whatever its column's type: the scale changes, the value never does."""
    return Decimal(row_id) + Decimal("0.25")


def insert(dsn: str, first: int, last: int) -> None:
    owner(dsn, f"INSERT INTO ledger SELECT i, i + 0.25 FROM generate_series({first}, {last}) i")


def amounts_read_with_the_history(consume_all: Any, prefix: str) -> dict[int, list[tuple[int, Decimal]]]:
    """Per row id, each record's amount (with the scale in force at its position) and that scale."""
    history = History.of(v for m in consume_all(topic_for(prefix)) if (v := decode(m.key(), m.value())) is not None)
    read: dict[int, list[tuple[int, Decimal]]] = {}
    for message in consume_all(f"{prefix}.{TABLE}"):
        if message.value() is None:
            continue
        value = json.loads(message.value())
        after = value["after"]
        if after is None:
            continue
        # no position headers (kafka.position_headers defaults to off): the envelope's commit LSN and LSN
        where = record_position(message.headers(), message.value())
        assert where.commit_lsn is not None and where.lsn is not None, value["source"]
        position = (where.commit_lsn, where.lsn)
        version = history.in_force_for(TABLE, where.commit_lsn, where.ordinal, where.lsn)
        assert version is not None, f"no schema version of {TABLE} at {position}"
        scale = version.scales()["amount"]
        unscaled = int.from_bytes(base64.b64decode(after["amount"]), "big", signed=True)
        read.setdefault(after["id"], []).append((scale, Decimal(unscaled).scaleb(-scale)))
    return read


def wait_for(what: str, check: Any, daemon: Connector, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert daemon.proc is not None and daemon.proc.poll() is None, f"the daemon exited:\n{daemon.output()[-5000:]}"
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout}s:\n{daemon.output()[-5000:]}"
        time.sleep(0.3)


@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
def test_each_record_reads_exactly_with_the_scale_in_force_after_three_kinds_of_type_change(
    mode, tmp_path, services, pg_dsn, slot_name, publication_name, topic_prefix, consume_all
):
    owner(
        pg_dsn,
        "CREATE TABLE ledger (id int PRIMARY KEY, amount numeric(10,2))",
        f"CREATE PUBLICATION {publication_name} FOR TABLE ledger",
    )
    insert(pg_dsn, 1, 5)
    config = write_config(
        tmp_path / "cdc.yaml",
        source={"dsn": pg_dsn, "slot": slot_name, "publication": publication_name},
        tables=[TABLE],
        kafka={"bootstrap_servers": services.kafka_bootstrap},
        topic_prefix=topic_prefix,
        delivery={"mode": mode},
        snapshot={"signal_table": "public.cdc_signal", "signal_poll_s": 0.3},
    )

    def ids_in_topic() -> set[int]:
        return {i for i, records in amounts_read_with_the_history(consume_all, topic_prefix).items() if records}

    daemon = Connector(config, tmp_path / "first.log").start()
    try:
        daemon.wait_streaming(pg_dsn, slot_name)
        insert(pg_dsn, 6, 7)  # streamed at scale 2
        wait_for("rows 1-7", lambda: ids_in_topic() >= set(range(1, 8)), daemon)
    finally:
        assert daemon.stop() == 0, daemon.output()[-4000:]

    # 1. While no daemon runs: scale 4, and rows written at it.
    owner(pg_dsn, "ALTER TABLE ledger ALTER COLUMN amount TYPE numeric(14,4)")
    insert(pg_dsn, 8, 9)
    daemon = Connector(config, tmp_path / "second.log").start()
    try:
        daemon.wait_streaming(pg_dsn, slot_name)
        wait_for("rows 8-9", lambda: ids_in_topic() >= {8, 9}, daemon)
        # 2. While it streams, followed by a change: scale 3 (smaller: a reader that took the newest
        # scale for older records would read ten times too much, not too little).
        owner(pg_dsn, "ALTER TABLE ledger ALTER COLUMN amount TYPE numeric(14,3)")
        insert(pg_dsn, 10, 11)
        wait_for("rows 10-11", lambda: ids_in_topic() >= {10, 11}, daemon)
        # 3. Followed by no change before a snapshot reads every row: scale 5.
        owner(pg_dsn, "ALTER TABLE ledger ALTER COLUMN amount TYPE numeric(16,5)")
        done = subprocess.run(
            [sys.executable, "-m", "cdc.cli", "snapshot", "--config", str(config), TABLE],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        wait_for(
            "the snapshot job's end",
            lambda: any(e.get("event") == "snapshot_job_done" and e.get("table") == TABLE for e in daemon.log_events()),
            daemon,
            timeout=90,
        )
        insert(pg_dsn, 12, 12)
        wait_for("row 12", lambda: 12 in ids_in_topic(), daemon)
    finally:
        assert daemon.stop() == 0, daemon.output()[-4000:]

    read = amounts_read_with_the_history(consume_all, topic_prefix)
    assert set(read) == set(range(1, 13))
    wrong = [(i, scale, amount) for i, records in read.items() for scale, amount in records if amount != expected(i)]
    assert not wrong, f"records read with the wrong scale (id, scale, amount): {wrong[:10]}"
    scales = {scale for records in read.values() for scale, _ in records}
    assert scales == {2, 3, 4, 5}, scales
    # Which scale each way gave: the rows as they were first written, and every row again in the snapshot.
    first = {i: records[0][0] for i, records in read.items()}
    assert first == {**dict.fromkeys(range(1, 8), 2), 8: 4, 9: 4, 10: 3, 11: 3, 12: 5}
    assert all(records[-1][0] == 5 for records in read.values())
