"""The Spark decoding of column values against the connector's own serializer: what the serializer
writes for a value, the reader turns back into that value (no Kafka needed, only a SparkSession)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import random
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import functions as F

from cdc.event import ChangeEvent, Column, Op, PgType, TableSchema
from cdc.lsn import Lsn
from cdc.sink.json import JsonSerializer, JsonSettings
from cdc.values import Interval
from cdc_views import reader
from cdc_views.decode import decode, failed
from cdc_views.reader import envelopes
from cdc_views.tables import ColumnShape, Encoding, Kind

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::DeprecationWarning"),
]

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _numeric(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0xFFFF)) + 4


COLUMNS: list[tuple[Column, ColumnShape]] = [
    (Column("id", PgType(20, "int8"), key=True), ColumnShape("id", Kind.INT64, "int8")),
    (Column("n38", PgType(1700, "numeric"), _numeric(38, 0)), ColumnShape("n38", Kind.DECIMAL, "numeric", 38, 0)),
    (Column("n20", PgType(1700, "numeric"), _numeric(20, 5)), ColumnShape("n20", Kind.DECIMAL, "numeric", 20, 5)),
    (Column("n10", PgType(1700, "numeric"), _numeric(10, 2)), ColumnShape("n10", Kind.DECIMAL, "numeric", 10, 2)),
    (Column("nv", PgType(1700, "numeric")), ColumnShape("nv", Kind.DECIMAL_TEXT, "numeric")),
    (Column("d", PgType(1082, "date")), ColumnShape("d", Kind.DATE, "date")),
    (Column("ts3", PgType(1114, "timestamp"), 3), ColumnShape("ts3", Kind.TIMESTAMP, "timestamp", 3)),
    (Column("ts6", PgType(1114, "timestamp")), ColumnShape("ts6", Kind.TIMESTAMP, "timestamp", 6)),
    (Column("tz", PgType(1184, "timestamptz")), ColumnShape("tz", Kind.TIMESTAMPTZ, "timestamptz", 6)),
    (Column("t3", PgType(1083, "time"), 3), ColumnShape("t3", Kind.TIME, "time", 3)),
    (Column("iv", PgType(1186, "interval")), ColumnShape("iv", Kind.INTERVAL, "interval")),
    (Column("b", PgType(17, "bytea")), ColumnShape("b", Kind.BYTES, "bytea")),
    (Column("f4", PgType(700, "float4")), ColumnShape("f4", Kind.FLOAT, "float4")),
    (Column("f8", PgType(701, "float8")), ColumnShape("f8", Kind.FLOAT, "float8")),
    (Column("ok", PgType(16, "bool")), ColumnShape("ok", Kind.BOOL, "bool")),
    (
        Column("tags", PgType(1009, "_text", element=PgType(25, "text"))),
        ColumnShape("tags", Kind.ARRAY, "_text", element=ColumnShape("tags", Kind.TEXT, "text")),
    ),
]
TABLE = TableSchema("public", "t", tuple(c for c, _ in COLUMNS))


def _random_decimal(rng: random.Random, precision: int, scale: int) -> Decimal:
    unscaled = rng.randrange(-(10**precision) + 1, 10**precision)
    return Decimal(unscaled).scaleb(-scale)


def _rows(count: int) -> list[dict[str, Any]]:
    rng = random.Random(7)
    rows = []
    for i in range(count):
        rows.append(
            {
                "id": i,
                "n38": _random_decimal(rng, rng.randrange(1, 39), 0),
                "n20": _random_decimal(rng, rng.randrange(5, 21), 5),
                "n10": _random_decimal(rng, 10, 2) if i else Decimal("-0.01"),
                "nv": _random_decimal(rng, rng.randrange(1, 30), rng.randrange(0, 12)),
                "d": rng.randrange(-700_000, 2_900_000),
                "ts3": rng.randrange(-(10**16), 10**16) // 1000 * 1000,
                "ts6": rng.randrange(-(10**16), 10**16),
                "tz": rng.randrange(-(10**15), 10**16),
                "t3": rng.randrange(0, 86_400_000) * 1000,
                "iv": Interval(rng.randrange(-50, 50), rng.randrange(-40, 40), rng.randrange(-(10**11), 10**11)),
                "b": rng.randbytes(rng.randrange(0, 9)),
                "f4": [1.1, float("nan"), float("inf"), -2.5e-7][i % 4],
                "f8": [float("-inf"), 0.1 + 0.2, 1e300, -0.0][i % 4],
                "ok": i % 2 == 0,
                "tags": ["a", None, "c"] if i % 3 else [],
            }
        )
    return rows


def _expected(row: dict[str, Any]) -> dict[str, Any]:
    iv: Interval = row["iv"]
    return {
        **row,
        "d": dt.date(1970, 1, 1) + dt.timedelta(days=row["d"]),
        "ts3": EPOCH + dt.timedelta(microseconds=row["ts3"]),
        "ts6": EPOCH + dt.timedelta(microseconds=row["ts6"]),
        "tz": EPOCH + dt.timedelta(microseconds=row["tz"]),
        "iv": iv.months * 2_629_800_000_000 + iv.days * 86_400_000_000 + iv.microseconds,
        "nv": row["nv"].normalize(),
    }


def _encoded(rows: list[dict[str, Any]]) -> list[tuple[str | None, ...]]:
    serializer = JsonSerializer(JsonSettings(topic_prefix="p", database="db"), lambda _t: 1)
    out = []
    for i, row in enumerate(rows):
        event = ChangeEvent(Op.CREATE, TABLE, None, row, Lsn(100 + i), Lsn(100 + i), 1, 1, 0)
        value = serializer.records(event)[0].value
        assert value is not None
        after = json.loads(value)["after"]
        out.append(tuple(_as_text(after[column.name]) for column, _ in COLUMNS))
    return out


def _as_text(value: Any) -> str | None:
    """A JSON value as Spark's JSON parser hands it to a string field: strings as they are, others as JSON."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value)


def test_every_value_the_serializer_writes_decodes_to_the_same_value(spark: Any) -> None:
    rows = _rows(400)
    encoded = spark.createDataFrame(_encoded(rows), ", ".join(f"{c.name} string" for c, _ in COLUMNS))
    decoded = (
        encoded.select(
            *[decode(F.col(s.name), s, Encoding()).alias(s.name) for _, s in COLUMNS],
            *[
                failed(F.col(s.name), decode(F.col(s.name), s, Encoding()), s).alias(f"failed_{s.name}")
                for _, s in COLUMNS
            ],
        )
        .select(
            "*",
            *[
                F.unix_micros(s.name).alias(f"us_{s.name}")
                for _, s in COLUMNS
                if s.kind in (Kind.TIMESTAMP, Kind.TIMESTAMPTZ)
            ],
        )
        .orderBy("id")
        .collect()
    )

    assert len(decoded) == len(rows)
    for got, row in zip(decoded, rows, strict=True):
        want = _expected(row)
        assert not any(got[f"failed_{s.name}"] for _, s in COLUMNS), got
        for name in ("id", "n38", "n20", "n10", "d", "t3", "iv", "ok", "tags"):
            assert got[name] == want[name], (name, got[name], want[name])
        assert Decimal(got["nv"]) == want["nv"]
        assert bytes(got["b"]) == row["b"]
        for name in ("ts3", "ts6", "tz"):
            assert got[f"us_{name}"] == row[name], name
        for name in ("f4", "f8"):
            assert repr(got[name]) == repr(row[name]) or (got[name] != got[name] and row[name] != row[name])


def test_values_that_do_not_convert_are_flagged_not_dropped(spark: Any) -> None:
    shapes = {s.name: s for _, s in COLUMNS}
    bad = {
        "n10": '{"x":1}',
        "d": "2147483647",
        "tz": "infinity",
        "id": "twelve",
        "b": "@@@",
        "ts6": "-9223372036832400000",
    }
    df = spark.createDataFrame([tuple(bad.values())], ", ".join(f"{n} string" for n in bad))
    flags = df.select(
        *[failed(F.col(n), decode(F.col(n), shapes[n], Encoding()), shapes[n]).alias(n) for n in bad]
    ).first()

    assert flags is not None
    assert all(flags[n] for n in bad), flags


def test_values_ansi_sql_rejects_are_flagged_not_raised_and_never_truncated(spark: Any) -> None:
    """Spark 4 turns ANSI SQL on: a plain cast of such text would fail the whole job, naming no record.

    Each of these must come back flagged (the reader reports the record with its column), not raise,
    and not as the nearby value Spark 3's casts gave ("1.5" as an integer was 1)."""
    over_38_digits = base64.b64encode((2**127 - 1).to_bytes(16, "big")).decode()  # 1.7e38: 39 digits
    long_max = str(2**63 - 1)
    adaptive = {"id": "1.5", "n38": over_38_digits, "t3": long_max, "ts3": long_max, "ok": "maybe", "f8": "1.0.0"}
    iso = {"t3": "12:34", "d": "2024-13-45Z", "ts6": "2024-05-01T25:00:00Z"}
    shapes = {s.name: s for _, s in COLUMNS}
    for encoding, bad in ((Encoding(), adaptive), (Encoding(time_precision="iso"), iso)):
        df = spark.createDataFrame([tuple(bad.values())], ", ".join(f"{n} string" for n in bad))
        decoded = [decode(F.col(n), shapes[n], encoding) for n in bad]
        got = df.select(
            *[failed(F.col(n), d, shapes[n]).alias(f"failed_{n}") for n, d in zip(bad, decoded, strict=True)],
            *[d.alias(n) for n, d in zip(bad, decoded, strict=True)],
        ).first()

        assert got is not None
        assert all(got[f"failed_{n}"] for n in bad), (encoding, got)
        assert all(got[n] is None for n in bad), (encoding, got)


def test_position_headers_absent_fall_back_to_the_envelope_and_malformed_make_the_record_bad(spark: Any) -> None:
    """A record without the cdc.* headers takes its position from the envelope (ANSI: an absent header must
    not raise): its LSN, the commit LSN from ``source.sequence`` (the LSN when there is none, or it does not
    fit a long), and no ordinal (``kafka.position_headers: false``: placed by its LSN within its commit). One
    whose header is not an integer is a bad record naming the header, not a guessed position."""
    value = json.dumps({"op": "c", "after": {"id": 1}, "source": {"lsn": 300, "ts_ms": 1}}).encode()
    sequenced = json.dumps(
        {"op": "c", "after": {"id": 1}, "source": {"lsn": 300, "ts_ms": 1, "sequence": '["250","300"]'}}
    )
    too_big = json.dumps(
        {"op": "c", "after": {"id": 1}, "source": {"lsn": 300, "ts_ms": 1, "sequence": f'["{10**19}","300"]'}}
    )
    good = [("cdc.lsn", b"200"), ("cdc.commit_lsn", b"150"), ("cdc.ordinal", b"3")]
    raw = spark.createDataFrame(
        [
            (b'{"id":1}', value, "p.public.t", 0, 0, good),
            (b'{"id":2}', value, "p.public.t", 0, 1, []),
            (b'{"id":3}', value, "p.public.t", 0, 2, [("cdc.lsn", b"abc")]),
            (b'{"id":4}', sequenced.encode(), "p.public.t", 0, 3, []),
            (b'{"id":5}', too_big.encode(), "p.public.t", 0, 4, []),
        ],
        "key binary, value binary, topic string, partition int, offset long, headers "
        "array<struct<key:string,value:binary>>",
    )
    got = {r["offset"]: r for r in envelopes(raw, Encoding()).collect()}

    assert (got[0]["record"], got[0]["lsn"], got[0]["commit_lsn"], got[0]["ordinal"]) == ("row", 200, 150, 3)
    assert (got[1]["record"], got[1]["lsn"], got[1]["commit_lsn"], got[1]["ordinal"]) == ("row", 300, 300, None)
    assert (got[2]["record"], got[2]["reason"]) == ("bad", "header cdc.lsn is not an integer")
    assert (got[3]["record"], got[3]["lsn"], got[3]["commit_lsn"], got[3]["ordinal"]) == ("row", 300, 250, None)
    assert (got[4]["record"], got[4]["lsn"], got[4]["commit_lsn"], got[4]["ordinal"]) == ("row", 300, 300, None)


def test_reduce_records_is_latest_of_every_kept_envelope_whether_or_not_kept_records_share_a_key(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``reduce_records`` skips ``latest``'s aggregate when no two records ``compacted`` kept share its group,
    and runs it when some do (a key's text in two partitions, a partition's truncate markers under two key
    shapes): both give what ``latest`` of the kept envelopes gives, its reference."""

    def envelope(op: str, after: dict[str, Any] | None, lsn: int) -> bytes:
        return json.dumps({"op": op, "after": after, "source": {"lsn": lsn, "ts_ms": 1}}).encode()

    topic = "p.public.t"
    one_partition_per_key = [
        (b'{"id":1}', envelope("c", {"id": 1, "v": "a"}, 100), topic, 0, 0, []),
        (b'{"id":1}', envelope("u", {"id": 1, "v": "b"}, 110), topic, 0, 1, []),
        (b'{"id":2}', envelope("c", {"id": 2, "v": "a"}, 120), topic, 1, 0, []),
        (b'{"id":2}', envelope("d", None, 130), topic, 1, 1, []),
        (b'{"id":2}', None, topic, 1, 2, []),  # the tombstone
        (b'{"id":3}', b"{not json", topic, 2, 0, []),
        (b'{"id":4}', b"{not json", topic, 2, 1, []),  # bad, and the last of its key
        (b'{"id":3}', envelope("c", {"id": 3, "v": "a"}, 140), topic, 2, 2, [("cdc.lsn", b"140")]),
        (b'{"id":null}', envelope("t", None, 150), topic, 0, 2, []),
        (None, envelope("c", {"id": 5, "v": "a"}, 160), topic, 2, 3, []),  # no key: bad, on its own
    ]
    shared = [
        *one_partition_per_key,
        (b'{"id":1}', envelope("u", {"id": 1, "v": "c"}, 170), topic, 1, 3, []),  # id 1 in partition 1 too
        (b'{"__cdc_truncate_partition":0}', envelope("t", None, 180), topic, 0, 3, []),  # a marker's old shape
    ]
    schema = (
        "key binary, value binary, topic string, partition int, offset long, "
        "headers array<struct<key:string,value:binary>>"
    )
    calls: list[int] = []
    for records, aggregated in ((one_partition_per_key, False), (shared, True)):
        raw = spark.createDataFrame(records, schema)
        expected = sorted(
            (r.asDict() for r in reader.latest(envelopes(reader.compacted(raw), Encoding())).collect()),
            key=lambda r: (r["partition"], r["offset"]),
        )
        original = reader.latest

        def counted(env: Any, original: Any = original) -> Any:
            calls.append(1)
            return original(env)

        monkeypatch.setattr(reader, "latest", counted)
        reduced, _ = reader.reduce_records(raw, Encoding())
        monkeypatch.setattr(reader, "latest", original)
        try:
            got = sorted((r.asDict() for r in reduced.collect()), key=lambda r: (r["partition"], r["offset"]))
        finally:
            reduced.unpersist()

        assert got == expected
        assert len(calls) == int(aggregated)
        calls.clear()
    assert {r["record"] for r in expected} >= {"row", "delete", "truncate", "bad"}


def test_latest_of_kept_leaves_nothing_cached_when_its_check_fails(spark: Any) -> None:
    """A failure inside ``latest_of_kept``'s check job reaches the caller, who has no frame to unpersist: the
    envelopes it persisted are released before the error goes on."""
    env = spark.createDataFrame(
        [("p.public.t", 0, 0, "row", '{"id":1}')], "topic string, partition int, offset long, record string, key string"
    ).withColumn("key", F.raise_error(F.lit("the check's job failed")).cast("string"))
    with pytest.raises(Exception, match="the check's job failed"):
        reader.latest_of_kept(env)
    assert not env.is_cached
    assert env.storageLevel.useMemory is False and env.storageLevel.useDisk is False
