"""Views and search indexes declared in cdc.yaml (``spark:``), on a schema that is not the demo's (a
library: authors, books with numeric prices and text[] tags, loans with a composite key), in JSON and
Avro: rebuilt from offset 0 and verified equal to the same SQL over the database; the continuous job
keeps them equal through inserts, updates, deletes, a key change and a truncate, by the keys a batch
touched where a view's key lineage allows it and whole otherwise (said in its log); a bad declaration
stops the job before it reads anything, naming the view."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc import dev
from cdc.declared import DeclarationError, DeclaredIndex, DeclaredView, SparkSection
from cdc_views import declared, jobs
from cdc_views.reader import KafkaSource
from cdc_views.tables import Encoding
from cdc_views.verify import verify
from tests.support.spark import (
    CapturedDatabase,
    captured_database,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::DeprecationWarning"),
]

TABLES = ["public.authors", "public.books", "public.loans"]
SCHEMA = """
CREATE TABLE authors (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE books (isbn text PRIMARY KEY, author_id int, title text NOT NULL, price numeric(12,2),
                    tags text[] NOT NULL DEFAULT '{}', format text NOT NULL DEFAULT 'paper');
CREATE TABLE loans (isbn text NOT NULL, member int NOT NULL, days int NOT NULL, PRIMARY KEY (isbn, member));
"""
WORKLOAD = [
    "INSERT INTO authors SELECT i, 'Author ' || i FROM generate_series(1, 12) i",
    "INSERT INTO books SELECT 'isbn-' || i, 1 + i % 12, 'Book number ' || i, i * 3.25, ARRAY['t' || (i % 4)], "
    "CASE WHEN i % 3 = 0 THEN 'ebook' ELSE 'paper' END FROM generate_series(1, 40) i",
    "UPDATE books SET title = 'Structure and Interpretation of Computer Programs' WHERE isbn = 'isbn-7'",
    "INSERT INTO loans SELECT 'isbn-' || (1 + i % 40), i % 9, i FROM generate_series(1, 60) i ON CONFLICT DO NOTHING",
    "DELETE FROM loans WHERE days % 7 = 0",
]
MORE = [
    "INSERT INTO authors VALUES (13, 'Ada Lovelace')",
    "INSERT INTO books VALUES ('isbn-99', 13, 'Notes on the Analytical Engine', 12.50, '{history}', 'ebook')",
    "UPDATE authors SET name = 'Grace Hopper' WHERE id = 2",
    "UPDATE books SET price = price + 0.01 WHERE author_id = 3",
    "DELETE FROM books WHERE isbn = 'isbn-12'",
    "UPDATE books SET isbn = 'isbn-4000' WHERE isbn = 'isbn-4'",  # a key change
    "TRUNCATE loans",
    "INSERT INTO loans VALUES ('isbn-99', 1, 3), ('isbn-5', 2, 14)",
]
SECTION = SparkSection(
    views=[
        DeclaredView(
            name="author_stats",
            sql="""SELECT a.id AS author_id, a.name, count(b.isbn) AS books, coalesce(sum(b.price), 0) AS stock_value
                     FROM public_authors a LEFT JOIN public_books b ON b.author_id = a.id GROUP BY a.id, a.name""",
            key=["author_id"],
        ),
        DeclaredView(
            name="loans_by_book",
            sql="""SELECT l.isbn, l.member, l.days, b.title
                     FROM public_loans l LEFT JOIN public_books b ON b.isbn = l.isbn""",
            key=["isbn", "member"],
        ),
    ],
    indexes=[
        DeclaredIndex(
            name="books",
            sql="""SELECT b.isbn, b.title, a.name AS author, b.tags, b.format, CAST(b.price AS string) AS price
                     FROM public_books b LEFT JOIN public_authors a ON a.id = b.author_id""",
            id="isbn",
            text={"title": 2.0, "author": 1.0},
            stored=["price", "tags"],
            facets=["format"],
        )
    ],
)


class Library(CapturedDatabase):
    """The library's database: its jobs read the connector's format and the declared section."""

    def job(self, warehouse: Path, **overrides: Any) -> jobs.JobConfig:
        extra: dict[str, Any] = {
            "encoding": Encoding(format="avro" if self.registry_url else "json"),
            "declared": SECTION,
        }
        if self.registry_url:
            from cdc.sink.registry import RegistrySettings

            extra["registry"] = RegistrySettings(url=self.registry_url)
        extra.update(overrides)
        return super().job(warehouse, **extra)


@pytest.fixture(scope="module", params=["json", "avro"])
def library(
    request: pytest.FixtureRequest, services: dev.Endpoints, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Library]:
    fmt = request.param
    extra: dict[str, Any] = {}
    if fmt == "avro":
        extra = {"format": "avro", "schema_registry": {"url": services.schema_registry_url}}
    work = tmp_path_factory.mktemp("library")
    name = f"lib_{fmt}_{secrets.token_hex(3)}"
    with captured_database(services, work, name, [SCHEMA], TABLES, kafka={"partitions": 2}, **extra) as db:
        library = Library(db.dsn, db.name, db.bootstrap, db.tables, db.registry_url, db.config)
        library.run(WORKLOAD)
        yield library


def _verified(spark: Any, library: Library, cfg: jobs.JobConfig) -> None:
    report = verify(
        library.dsn, cfg.warehouse, cfg.tables, spark=spark, encoding=cfg.encoding, declared_section=SECTION
    )
    assert report.ok, report.render()
    names = [c.name for c in report.checks]
    assert names == [f"table {t}" for t in TABLES] + ["view author_stats", "view loans_by_book", "index books"]


# JSON: the continuous job over these topics runs in the refresh test below, which catches up from offset 0,
# refreshes by keys and whole, and takes MORE in (one catch-up and one verify fewer than a test of its own).
@pytest.mark.parametrize("library", ["json"], indirect=True)
def test_declared_views_and_index_rebuilt_from_offset_0(spark: Any, library: Library, tmp_path: Path) -> None:
    rebuilt = library.job(tmp_path / "rebuilt")
    summary = jobs.rebuild(spark, rebuilt)
    assert summary["view author_stats"] == 12 and summary["index books"] == 40
    _verified(spark, library, rebuilt)
    hits = declared.search(declared.index_path(rebuilt.warehouse, "books"), "Interpretation")
    assert [h["id"] for h in hits] == ["isbn-7"]
    assert {
        h["id"] for h in declared.search(declared.index_path(rebuilt.warehouse, "books"), "format:ebook", limit=100)
    } == {f"isbn-{i}" for i in range(3, 41, 3)}


# Avro: its batch rebuild of declared views runs in test_spark_avro.py; here the continuous job decodes Avro.
@pytest.mark.parametrize("library", ["avro"], indirect=True)
def test_declared_views_and_index_kept_by_the_continuous_job_from_avro_topics(
    spark: Any, library: Library, tmp_path: Path
) -> None:
    streamed = library.job(tmp_path / "streamed")
    jobs.start_continuous(spark, streamed, available_now=True).awaitTermination(300)
    _verified(spark, library, streamed)
    _more_kept(spark, library, streamed)


def _more_kept(spark: Any, library: Library, streamed: jobs.JobConfig) -> None:
    """MORE (inserts, updates, a delete, a key change, a truncate) taken in by the continuous job."""
    library.run(MORE)
    query = jobs.start_continuous(spark, streamed, available_now=True)
    query.awaitTermination(300)
    assert query.exception() is None
    _verified(spark, library, streamed)
    assert declared.search(declared.index_path(streamed.warehouse, "books"), "Lovelace")[0]["id"] == "isbn-99"


def test_a_bad_declaration_stops_the_job_before_it_reads_anything_naming_the_view(
    spark: Any, library: Library, tmp_path: Path
) -> None:
    bad = SparkSection(
        views=[
            DeclaredView(name="typo", sql="SELECT id, nmae FROM public_authors", key=["id"]),
            DeclaredView(name="nokey", sql="SELECT id FROM public_authors", key=["author_id"]),
            DeclaredView(name="unknown", sql="SELECT * FROM public_members", key=["id"]),
        ]
    )
    cfg = library.job(tmp_path / "wh", declared=bad)
    cfg = jobs.JobConfig(
        KafkaSource(library.bootstrap), "no_such_prefix", cfg.tables, cfg.warehouse, cfg.encoding, declared=bad
    )
    with pytest.raises(DeclarationError) as refused:  # no topic exists under this prefix: nothing was read
        jobs.rebuild(spark, cfg)
    message = str(refused.value)
    assert "view typo:" in message and "nmae" in message
    assert "view nokey: its query does not give the column(s) author_id" in message
    assert "view unknown:" in message and "public_members" in message


class Recorder:
    """Stands in for the jobs' logger: keeps each event and its fields."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    warning = info

    def modes(self) -> dict[str, str]:
        """What each view and index was, in the last micro-batch that wrote any: keys, whole or unchanged."""
        out: dict[str, str] = {}
        for event, fields in self.events:
            if event in ("view_written", "index_written", "declared_unchanged"):
                what = fields.get("declared") or (
                    f"view {fields['view']}" if "view" in fields else f"index {fields['index']}"
                )
                out[what] = fields["mode"]
        return out


# JSON only: which refresh a batch gets is decided after decoding, over the warehouse's rows, the same for
# every format; Avro's decoding in the continuous job is covered by the Avro test above.
@pytest.mark.parametrize("library", ["json"], indirect=True)
def test_the_continuous_job_refreshes_by_keys_where_the_key_lineage_allows_and_whole_otherwise(
    spark: Any, library: Library, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    library.run(
        ["INSERT INTO loans VALUES ('isbn-3', 5, 9), ('isbn-2', 5, 9), ('isbn-4', 5, 9) ON CONFLICT DO NOTHING"]
    )
    streamed = library.job(tmp_path / "streamed")
    first = Recorder()
    monkeypatch.setattr(jobs, "log", first)
    jobs.start_continuous(spark, streamed, available_now=True).awaitTermination(300)
    planned = {f["declared"]: f["by_keys_of"] for e, f in first.events if e == "stream.refresh_planned"}
    assert planned == {"view author_stats": None, "view loans_by_book": "public.loans", "index books": "public.books"}
    assert first.modes() == {"view author_stats": "whole", "view loans_by_book": "whole", "index books": "whole"}
    _verified(spark, library, streamed)

    loans_only = Recorder()  # a batch that changes loans alone: loans_by_book by keys, the others untouched
    monkeypatch.setattr(jobs, "log", loans_only)
    library.run(
        [
            "INSERT INTO loans VALUES ('isbn-5', 7, 2) ON CONFLICT DO NOTHING",
            "UPDATE loans SET days = days + 100 WHERE member = 1",
            "DELETE FROM loans WHERE isbn = 'isbn-3' AND member = 5",
            "UPDATE loans SET member = 6 WHERE isbn = 'isbn-2' AND member = 5",  # a key change
        ]
    )
    query = jobs.start_continuous(spark, streamed, available_now=True)
    query.awaitTermination(300)
    assert query.exception() is None
    assert loans_only.modes() == {
        "view author_stats": "unchanged",
        "view loans_by_book": "keys",
        "index books": "unchanged",
    }
    keyed = next(f for e, f in loans_only.events if e == "view_written" and f["view"] == "loans_by_book")
    assert keyed["keys"] >= 4 and "public.loans" in keyed["reason"]  # (isbn-3, 5) and (isbn-2, 5) gone, ...
    _verified(spark, library, streamed)

    books_only = Recorder()  # books alone: the index by keys; loans_by_book and author_stats read books whole
    monkeypatch.setattr(jobs, "log", books_only)
    library.run(
        [
            "UPDATE books SET title = 'The Art of Computer Programming' WHERE isbn = 'isbn-5'",
            "INSERT INTO books VALUES ('isbn-77', 1, 'Concrete Mathematics', 40.00, '{math}', 'paper')",
            "DELETE FROM books WHERE isbn = 'isbn-8'",
        ]
    )
    query = jobs.start_continuous(spark, streamed, available_now=True)
    query.awaitTermination(300)
    assert query.exception() is None
    assert books_only.modes() == {"view author_stats": "whole", "view loans_by_book": "whole", "index books": "keys"}
    _verified(spark, library, streamed)
    hits = declared.search(declared.index_path(streamed.warehouse, "books"), "Concrete")
    assert [h["id"] for h in hits] == ["isbn-77"]

    # A loan is deleted and a warehouse-only rebuild merges that before the stream sees it: the stream's next
    # batch (loans alone) cannot find the deleted row's old values, so loans_by_book is recomputed whole.
    library.run(["DELETE FROM loans WHERE isbn = 'isbn-4' AND member = 5"])
    jobs.rebuild(spark, streamed, ["warehouse"])
    behind = Recorder()
    monkeypatch.setattr(jobs, "log", behind)
    library.run(["INSERT INTO loans VALUES ('isbn-9', 3, 1) ON CONFLICT DO NOTHING"])
    query = jobs.start_continuous(spark, streamed, available_now=True)
    query.awaitTermination(300)
    assert query.exception() is None
    assert behind.modes() == {
        "view author_stats": "unchanged",
        "view loans_by_book": "whole",
        "index books": "unchanged",
    }
    whole = next(f for e, f in behind.events if e == "view_written" and f["view"] == "loans_by_book")
    assert "its tables changed since it was refreshed" in whole["reason"]
    _verified(spark, library, streamed)

    _more_kept(spark, library, streamed)  # and the rest of the changes, the truncate of loans among them
