"""cdc.snapshot.plan: chunks from a stored plan, and the SQL each chunk reads with."""

from __future__ import annotations

from cdc.decoder.types import BUILTIN_TYPES
from cdc.event import Column, TableSchema
from cdc.snapshot.plan import Chunk, Chunking, KeyRange, SnapshotTable, TablePlan, chunk_select

BY_NAME = {t.name: t for t in BUILTIN_TYPES.values()}
SCHEMA = TableSchema(
    "public",
    "orders",
    (
        Column("tenant", BY_NAME["text"], key=True),
        Column("id", BY_NAME["int8"], key=True),
        Column("note", BY_NAME["text"]),
    ),
    42,
)
KEYED = SnapshotTable("public.orders", 42, SCHEMA, ("tenant", "id"), ("text", "bigint"), False)
KEYLESS = SnapshotTable("public.orders", 42, SCHEMA, (), (), False)


def test_key_chunks_cover_the_whole_key_space_between_their_boundaries() -> None:
    plan = TablePlan("public.orders", 42, Chunking.KEY, (("a", "10"), ("b", "5")), 0, 3, 3000)
    assert [c.keys for c in plan.chunks()] == [
        KeyRange(None, ("a", "10")),
        KeyRange(("a", "10"), ("b", "5")),
        KeyRange(("b", "5"), None),
    ]


def test_ctid_chunks_are_page_ranges_and_the_last_one_is_open_ended() -> None:
    plan = TablePlan("public.orders", 42, Chunking.CTID, (), 100, 3, 3000)
    assert [c.pages for c in plan.chunks()] == [(0, 100), (100, 200), (200, None)]


def test_a_plan_survives_its_json_form() -> None:
    plan = TablePlan("public.orders", 42, Chunking.KEY, (("a'b", "1"),), 0, 2, 10)
    assert TablePlan.from_json(plan.to_json()) == plan


def test_a_key_chunk_reads_between_its_bounds_with_row_comparisons_cast_to_the_key_types() -> None:
    query = chunk_select(KEYED, Chunk("public.orders", 1, KeyRange(("a'b", "10"), ("c", "5")))).as_string(None)
    assert query == (
        'COPY (SELECT "tenant", "id", "note" FROM "public"."orders" WHERE ("tenant", "id") > '
        "('a''b'::text, '10'::bigint) AND (\"tenant\", \"id\") <= ('c'::text, '5'::bigint)) TO STDOUT"
    )


def test_an_unbounded_chunk_reads_the_whole_table() -> None:
    query = chunk_select(KEYED, Chunk("public.orders", 0, KeyRange(None, None))).as_string(None)
    assert query.endswith('FROM "public"."orders" WHERE TRUE) TO STDOUT')


def test_a_dblog_chunk_reads_in_key_order_with_a_limit() -> None:
    query = chunk_select(KEYED, Chunk("public.orders", 0, KeyRange(("a", "1"), None)), limit=500).as_string(None)
    assert query.endswith('ORDER BY "tenant", "id" LIMIT 500) TO STDOUT')


def test_a_ctid_chunk_reads_its_pages() -> None:
    middle = chunk_select(KEYLESS, Chunk("public.orders", 1, None, (100, 200))).as_string(None)
    assert "WHERE ctid >= '(100,0)'::tid AND ctid < '(200,0)'::tid" in middle
    last = chunk_select(KEYLESS, Chunk("public.orders", 2, None, (200, None))).as_string(None)
    assert "WHERE ctid >= '(200,0)'::tid)" in last
