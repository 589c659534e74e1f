"""The jobs' placeholder settings and which columns can hold one (no Spark session: pure logic)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import yaml

from cdc.config import Config

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[spark]')")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "spark"))

from cdc_views import cli
from cdc_views.tables import ColumnShape, Encoding, Kind, TableShape
from cdc_views.toast import Unresolved, UnresolvedPlaceholders, may_hold_placeholder, toastable_columns

DEBEZIUM = "__debezium_unavailable_value"


def test_only_varlena_columns_outside_the_key_can_hold_a_placeholder() -> None:
    table = TableShape(
        "public",
        "docs",
        (
            ColumnShape("id", Kind.TEXT, "text", toastable=True),  # a key column: never an unchanged value
            ColumnShape("body", Kind.TEXT, "text", toastable=True),
            ColumnShape("state", Kind.TEXT, "mood", toastable=False),  # an enum: 4 bytes, never TOASTed
            ColumnShape("uid", Kind.TEXT, "uuid", toastable=False),
            ColumnShape("n", Kind.INT32, "int4", toastable=False),
            ColumnShape("blob", Kind.BYTES, "bytea"),  # not read from a catalog: judged by kind
            ColumnShape("at", Kind.TIMESTAMPTZ, "timestamptz"),
        ),
        ("id",),
    )
    assert [c.name for c in toastable_columns(table)] == ["body", "blob"]
    assert not may_hold_placeholder(ColumnShape("at", Kind.TIMESTAMPTZ, "timestamptz"))
    assert ColumnShape("b", Kind.BYTES, "bytea", toastable=True) == ColumnShape("b", Kind.BYTES, "bytea")


def _args(*extra: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(
        [
            "rebuild",
            "--warehouse",
            "wh",
            "--dsn",
            "x",
            "--tables",
            "public.t",
            "--bootstrap",
            "k:9092",
            "--topic-prefix",
            "p",
            *extra,
        ]
    )


def test_the_placeholder_is_debeziums_unless_the_option_or_the_configuration_says_otherwise(tmp_path: Path) -> None:
    assert cli._encoding(cli._settings(_args())).unavailable_value == DEBEZIUM
    chosen = cli._settings(_args("--unavailable-value-placeholder", "<gone>"))
    assert cli._encoding(chosen) == Encoding(unavailable_value="<gone>")

    if "toast" not in Config.model_fields:
        pytest.skip("this connector has no toast section yet")
    config = tmp_path / "cdc.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "source": {"dsn": "postgresql://u@h/db", "slot": "s", "publication": "p"},
                "tables": ["public.t"],
                "kafka": {"bootstrap_servers": "k:9092"},
                "topic_prefix": "p",
                "toast": {"placeholder": "<toasted>"},
            }
        )
    )
    from_config = cli._settings(_args("--config", str(config)))
    assert cli._encoding(from_config).unavailable_value == "<toasted>"
    both = cli._settings(_args("--config", str(config), "--unavailable-value-placeholder", "<gone>"))
    assert cli._encoding(both).unavailable_value == "<gone>"


def test_the_error_names_table_key_column_partition_offset_and_the_fix() -> None:
    error = UnresolvedPlaceholders(
        "public.docs", "shop.public.docs", DEBEZIUM, 30, [Unresolved('{"id":7}', "body", 2, 41)]
    )
    text = str(error)
    assert "table public.docs (topic shop.public.docs): 30 column value(s)" in text
    assert "(first 1 listed): key {\"id\":7} column 'body' partition 2 offset 41" in text
    assert "toast.mode: fill" in text and "--on-bad-record skip" in text
