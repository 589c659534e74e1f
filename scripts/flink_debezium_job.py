"""A PyFlink job reading one of the daemon's topics with Flink's debezium-json format (run by flink_compat.py).

Usage: python flink_debezium_job.py BOOTSTRAP TOPIC CONNECTOR_JAR

Reads the topic from the earliest to the latest offset (bounded), applies Flink's changelog (+I, -U,
+U, -D) to a table keyed by id and prints the final rows, one JSON object per line, on stdout. A
record Flink cannot read fails the job: the exit status is 1 and the error is on stderr.
"""

from __future__ import annotations

import json
import sys
from decimal import Decimal

from pyflink.common import RowKind
from pyflink.table import EnvironmentSettings, TableEnvironment


def main(bootstrap: str, topic: str, jar: str) -> int:
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    config.set("pipeline.jars", f"file://{jar}")
    config.set("parallelism.default", "1")
    env.execute_sql(
        f"""
        CREATE TABLE src (
            id INT,
            name STRING,
            price DECIMAL(12, 2),
            qty INT
        ) WITH (
            'connector' = 'kafka',
            'topic' = '{topic}',
            'properties.bootstrap.servers' = '{bootstrap}',
            'properties.group.id' = 'flink-compat',
            'scan.startup.mode' = 'earliest-offset',
            'scan.bounded.mode' = 'latest-offset',
            'format' = 'debezium-json',
            'debezium-json.schema-include' = 'true'
        )
        """
    )
    rows: dict[int, dict[str, object]] = {}
    with env.execute_sql("SELECT id, name, price, qty FROM src").collect() as results:
        for row in results:
            kind = row.get_row_kind()
            values = {
                "id": row[0],
                "name": row[1],
                "price": str(row[2]) if isinstance(row[2], Decimal) else row[2],
                "qty": row[3],
            }
            if kind in (RowKind.INSERT, RowKind.UPDATE_AFTER):
                rows[row[0]] = values
            elif kind in (RowKind.DELETE, RowKind.UPDATE_BEFORE):
                rows.pop(row[0], None)
    for key in sorted(rows):
        print(json.dumps(rows[key]))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
