"""The views and search indexes the user declares (``spark:`` in cdc.yaml, ``cdc.declared``), built by the jobs.

Each rebuilt table is a temporary view named ``<schema>_<table>``; a declared view is its Spark SQL over
those, materialized as a Delta table at ``<warehouse>/views/<name>`` (MERGEd on its key, a row rewritten
only when its content changed); a declared index is its SQL's rows as tantivy documents at
``<warehouse>/search/<name>``: the id field, the text fields tokenized (each searched with its boost),
stored fields returned with a hit, facets matched exactly. The declaration itself is stored beside the
index (``<name>.json``) so that ``search`` knows the fields and boosts.

``check`` runs Spark's analyzer over every declared query with the tables' schemas and no data, so a
query that does not parse, names an unknown table or column, or lacks its key stops the job before
anything is read, naming the view.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog
import tantivy
from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import DataFrame, SparkSession

from cdc.declared import (
    DeclarationError,
    DeclaredIndex,
    KeyLineage,
    NoKeyLineage,
    SparkSection,
    one_table_select,
    sql_name,
)
from cdc_views.search import WRITER_HEAP_BYTES, write_index

log = structlog.get_logger("cdc_views.declared")


def view_path(warehouse: Path, name: str) -> Path:
    return warehouse / "views" / name


def index_path(warehouse: Path, name: str) -> Path:
    return warehouse / "search" / name


def register(frames: Mapping[str, DataFrame]) -> None:
    """Each table under its declared-query name (``public.accounts`` -> ``public_accounts``)."""
    for qualified, frame in frames.items():
        frame.createOrReplaceTempView(sql_name(qualified))


def check(spark: SparkSession, section: SparkSection, frames: Mapping[str, DataFrame]) -> None:
    """Analyze every declared query over ``frames`` (empty ones will do: nothing is read); DeclarationError
    naming each view or index that cannot be built."""
    register(frames)
    problems: list[str] = []
    declared: list[tuple[str, str, list[str]]] = [(f"view {v.name}", v.sql, v.key) for v in section.views]
    declared += [(f"index {i.name}", i.sql, i.columns) for i in section.indexes]
    for what, query, needed in declared:
        try:
            columns = spark.sql(query).columns
        except (AnalysisException, ParseException) as e:
            problems.append(f"{what}: {str(e).strip().splitlines()[0]}")
            continue
        missing = [c for c in needed if c not in columns]
        if missing:
            problems.append(f"{what}: its query does not give the column(s) {', '.join(missing)} it declares")
    if problems:
        raise DeclarationError("the declared Spark views and indexes cannot be built:\n  " + "\n  ".join(problems))


# --------------------------------------------------------------------------- group lineage

_NOT_PER_GROUP: tuple[tuple[str, str], ...] = (  # node class -> why a group's row may depend on other groups
    ("Window", "a window function"),
    ("Limit", "LIMIT"),
    ("Offset", "OFFSET"),
    ("Qualify", "QUALIFY"),
    ("Subquery", "a subquery"),
    ("SetOperation", "UNION/EXCEPT/INTERSECT"),
    ("With", "WITH"),
    ("Lateral", "LATERAL"),
    ("Pivot", "PIVOT"),
    ("TableSample", "TABLESAMPLE"),
    ("Values", "VALUES"),
    ("Exists", "EXISTS"),
    ("Explode", "a generator (explode)"),
    ("Posexplode", "a generator (posexplode)"),
    ("Unnest", "a generator"),
    ("Inline", "a generator (inline)"),
    ("Stack", "a generator (stack)"),
    ("Rollup", "ROLLUP"),
    ("Cube", "CUBE"),
    ("GroupingSets", "GROUPING SETS"),
    ("Rand", "rand()"),
    ("Randn", "randn()"),
    ("Uuid", "uuid()"),
    ("CurrentTimestamp", "current_timestamp()"),
    ("CurrentDate", "current_date()"),
    ("CurrentTime", "current_time()"),
    ("Anonymous", "a function the checker does not know (it may not be deterministic)"),
)


def group_lineage(sql: str, key: Sequence[str], tables: Mapping[str, Sequence[str]]) -> KeyLineage | NoKeyLineage:
    """Whether the view's row of one key is an aggregate over only the rows of one table (``table``) that hold
    the same values in ``columns`` (view key column -> that table's column), with the other tables it joins.

    Then, when a micro-batch changed ``table`` alone, recomputing the groups whose values the batch's rows had
    before or after is the same as recomputing the whole view. Conservative: one SELECT with GROUP BY (plain
    columns, no ROLLUP, CUBE or GROUPING SETS) from one table read once, then only inner or LEFT joins; each
    of the view's key columns is one of that table's columns taken unchanged and grouped by; no window,
    LIMIT, subquery, set operation, generator, non-deterministic or unknown function. ``tables``: qualified
    table -> its columns. Anything else: ``NoKeyLineage`` with why.
    """
    from sqlglot import exp

    def grouped_select(tree: Any) -> str | None:
        group = tree.args.get("group")
        if group is None or not group.expressions:
            return "it has an aggregate or DISTINCT without GROUP BY"
        if tree.args.get("distinct") is not None:
            return "it has SELECT DISTINCT"
        return None

    found = one_table_select(sql, tables, _NOT_PER_GROUP, grouped_select)
    if isinstance(found, NoKeyLineage):
        return found
    tree, table, alias = found.tree, found.table, found.alias
    group = tree.args["group"]
    grouped = {(c.table, c.name) for c in group.expressions if isinstance(c, exp.Column)}
    columns: dict[str, str] = {}
    for name in key:
        select = next((s for s in tree.selects if s.alias_or_name == name), None)
        source = select.unalias() if select is not None else None
        if not (isinstance(source, exp.Column) and source.table == alias and (alias, source.name) in grouped):
            return NoKeyLineage(
                reason=f"its key column {name} is not a column of {table} it groups by, taken unchanged"
            )
        columns[name] = source.name
    return KeyLineage(table=table, columns=columns)


def grouped_by_exactly(sql: str, columns: Iterable[str]) -> bool:
    """Whether the query's one SELECT groups by exactly ``columns`` (plain columns, each once, nothing else): its
    rows are then one per value of them. Conservative: False when it cannot tell."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import ParseError

    try:
        tree = sqlglot.parse_one(sql, read="spark")
    except ParseError:
        return False
    selects = list(tree.find_all(exp.Select))
    group = selects[0].args.get("group") if len(selects) == 1 else None
    if group is None or not group.expressions:
        return False
    names = [c.name for c in group.expressions if isinstance(c, exp.Column)]
    wanted = set(columns)
    return len(names) == len(group.expressions) == len(set(names)) == len(wanted) and set(names) == wanted


# --------------------------------------------------------------------------- indexes


def _schema(index: DeclaredIndex) -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("_id", stored=True, tokenizer_name="raw")
    for name in index.text:
        builder.add_text_field(name, stored=True)
    for name in index.facets:
        builder.add_text_field(name, stored=True, tokenizer_name="raw")
    for name in index.stored:
        if name not in index.text and name not in index.facets and name != index.id:
            builder.add_text_field(name, stored=True, index_option="basic", tokenizer_name="raw")
    return builder.build()


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return " ".join(_text(v) for v in value)
    return str(value)


def document_id(value: Any) -> str:
    """A document's id as the index holds it, from its id column's value."""
    return _text(value)


def _document(index: DeclaredIndex, row: Mapping[str, Any]) -> tantivy.Document:
    fields = {"_id": _text(row[index.id])}
    for name in (*index.text, *index.facets, *index.stored):
        if name != index.id:
            fields[name] = _text(row.get(name))
    return tantivy.Document(**fields)


def build_index(index: DeclaredIndex, rows: Iterable[Mapping[str, Any]], path: Path) -> int:
    """A new index of ``rows`` at ``path``, swapped into place (a reader never sees a half-built one)."""
    count = write_index(_schema(index), (_document(index, row) for row in rows), path, name=index.name)
    path.with_suffix(".json").write_text(index.model_dump_json())
    return count


def update_index(index: DeclaredIndex, rows: Iterable[Mapping[str, Any]], ids: Iterable[str], path: Path) -> int:
    """Delete the documents ``ids`` and add ``rows`` (the current version of those that still exist)."""
    if not (path.is_dir() and tantivy.Index.exists(str(path))):
        return build_index(index, rows, path)
    opened = tantivy.Index.open(str(path))
    writer = opened.writer(heap_size=WRITER_HEAP_BYTES, num_threads=1)
    for doc_id in ids:
        writer.delete_documents_by_term("_id", doc_id)
    added = 0
    for row in rows:
        writer.add_document(_document(index, row))
        added += 1
    writer.commit()
    writer.wait_merging_threads()
    return added


def default_index(warehouse: Path) -> Path:
    """The index ``search`` uses when none is named: the only one under ``<warehouse>/search``; LookupError
    listing them when there are several (or none)."""
    root = warehouse / "search"
    names = sorted(p.stem for p in root.glob("*.json") if (root / p.stem).is_dir()) if root.is_dir() else []
    if len(names) == 1:
        return index_path(warehouse, names[0])
    if not names:
        raise LookupError(
            f"no search index under {root}: declare one under spark.indexes (or in spark.file) and run the rebuild"
        )
    raise LookupError(f"several search indexes under {root} ({', '.join(names)}): name one with --index")


def _declaration(path: Path) -> DeclaredIndex:
    meta = path.with_suffix(".json")
    if not (path.is_dir() and tantivy.Index.exists(str(path)) and meta.exists()):
        raise LookupError(f"no search index at {path}: declare it under spark.indexes and run the rebuild")
    return DeclaredIndex.model_validate_json(meta.read_text())


def search(path: Path, query: str, limit: int = 10, fields: list[str] | None = None) -> list[dict[str, Any]]:
    """The best ``limit`` documents for ``query`` (tantivy's query language over the text fields, each
    with its declared boost; ``facet:value`` for a facet): ``[{id, score, <stored fields>}]``."""
    index = _declaration(path)
    opened = tantivy.Index.open(str(path))
    opened.reload()
    searcher = opened.searcher()
    try:
        parsed = opened.parse_query(query, list(index.text), field_boosts=dict(index.text))
    except ValueError as exc:
        raise ValueError(f"cannot parse search query {query!r}: {exc}") from exc
    shown = fields or [*index.text, *index.stored, *index.facets]
    hits = []
    for score, address in searcher.search(parsed, limit).hits:
        stored = searcher.doc(address).to_dict()
        hit: dict[str, Any] = {"id": (stored.get("_id") or [""])[0], "score": round(float(score), 4)}
        hit.update({f: (stored.get(f) or [""])[0] for f in shown if f != index.id})
        hits.append(hit)
    return hits


def documents(path: Path) -> list[dict[str, str]]:
    """Every document of an index as text fields (for verification)."""
    index = _declaration(path)
    opened = tantivy.Index.open(str(path))
    opened.reload()
    searcher = opened.searcher()
    total = searcher.num_docs
    if total == 0:
        return []
    out = []
    for _, address in searcher.search(tantivy.Query.all_query(), total).hits:
        stored = searcher.doc(address).to_dict()
        out.append(
            {f: (stored.get(f) or [""])[0] for f in ("_id", *index.text, *index.facets, *index.stored) if f != index.id}
        )
    return out


def expected_documents(index: DeclaredIndex, rows: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """What ``documents`` returns for an index built from ``rows`` (the same text conversion)."""
    out = []
    for row in rows:
        doc = {"_id": _text(row[index.id])}
        for name in (*index.text, *index.facets, *index.stored):
            if name != index.id:
                doc[name] = _text(row.get(name))
        out.append(doc)
    return out


def describe(section: SparkSection) -> dict[str, Any]:
    """For logs: what is declared."""
    return {"views": [v.name for v in section.views], "indexes": [i.name for i in section.indexes]}


__all__ = [
    "DeclarationError",
    "build_index",
    "check",
    "default_index",
    "describe",
    "document_id",
    "documents",
    "expected_documents",
    "index_path",
    "register",
    "search",
    "update_index",
    "view_path",
]
