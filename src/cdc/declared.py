"""The views and search indexes a user declares for the Spark jobs (the ``spark`` section of cdc.yaml, or a
file it names: ``spark: {file: shop-spark.yaml}``), and their static check.

Each rebuilt table is queried under a stable name: ``<schema>_<table>`` (``public.orders`` is
``public_orders``). A view is Spark SQL over those names with its key columns; an index is Spark SQL
giving its documents, the id column, the text fields (tokenized, each with a boost), stored fields and
facets. ``check_declarations`` parses every query (sqlglot, Spark dialect) and resolves its tables and
columns against the captured tables' columns, so that ``cdc validate`` refuses a view that does not
parse, names an unknown table or column, or lacks its key, naming the view; the jobs check the same
with Spark's own analyzer before they read any data.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeclaredView(_Model):
    name: str = Field(description="the view's name: a Delta table at <warehouse>/views/<name>")
    sql: str = Field(
        description="Spark SQL over the rebuilt tables, each named <schema>_<table> (public.orders: public_orders)"
    )
    key: list[str] = Field(min_length=1, description="the view's key columns (one row per key)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError("must be a lower-case identifier (letters, digits, _), as it names a directory")
        return v


class DeclaredIndex(_Model):
    name: str = Field(
        description="the index's name: a tantivy index at <warehouse>/search/<name>; cdc search --index NAME"
    )
    sql: str = Field(description="Spark SQL giving one row per document, over the tables named <schema>_<table>")
    id: str = Field(description="the column that identifies a document")
    text: dict[str, float] = Field(
        min_length=1, description="the searched fields: column -> boost (1.0: plain); tokenized and stored"
    )
    stored: list[str] = Field(default_factory=list, description="further columns returned with each hit, not searched")
    facets: list[str] = Field(default_factory=list, description="columns matched exactly (query field:value)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError("must be a lower-case identifier (letters, digits, _), as it names a directory")
        return v

    @property
    def columns(self) -> list[str]:
        return [self.id, *self.text, *self.stored, *self.facets]


class SparkSection(_Model):
    file: str | None = Field(
        default=None,
        description="a YAML file of further views and indexes (its keys: views, indexes), read when the configuration "
        "is loaded; a relative path is relative to the configuration file's directory (from the environment: to the "
        "working directory)",
    )
    views: list[DeclaredView] = Field(default_factory=list, description="derived views the Spark jobs materialize")
    indexes: list[DeclaredIndex] = Field(default_factory=list, description="search indexes the Spark jobs build")

    @model_validator(mode="before")
    @classmethod
    def _include(cls, data: Any) -> Any:
        """The views and indexes of ``file`` join those written inline (``file`` itself is kept as given; a
        section validated again, e.g. from its own dump, does not get them twice)."""
        if not isinstance(data, dict) or not data.get("file"):
            return data
        included = read_declarations_file(Path(data["file"]))
        merged = dict(data)
        for kind, model in (("views", DeclaredView), ("indexes", DeclaredIndex)):
            inline = list(data.get(kind) or [])
            merged[kind] = inline + [d for d in included.get(kind) or [] if not _among(model, d, inline)]
        return merged

    @model_validator(mode="after")
    def _unique(self) -> SparkSection:
        for kind, names in (("views", [v.name for v in self.views]), ("indexes", [i.name for i in self.indexes])):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{kind}: {', '.join(dupes)} declared more than once")
        return self


def _among(model: type[_Model], raw: Any, declared: list[Any]) -> bool:
    """Whether ``raw`` (a declaration from a file) is already one of ``declared``, as validated models."""
    try:
        wanted = model.model_validate(raw)
        return any(wanted == (d if isinstance(d, model) else model.model_validate(d)) for d in declared)
    except ValueError:  # pydantic's ValidationError: the merged section reports it, at its place
        return False


def read_declarations_file(path: Path) -> dict[str, Any]:
    """The raw ``views`` and ``indexes`` of a declarations file (what ``spark: {file: ...}`` names); ValueError
    naming the file and the fix when it cannot be read, is not YAML, or holds other keys."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(
            f"cannot read the declarations file {path} named by spark.file ({e.strerror}). Fix: give a path that "
            "exists, "
            "absolute or relative to the configuration file's directory, or write the views under spark: itself"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"the declarations file {path} (spark.file) is not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict) or set(data) - {"views", "indexes"}:
        found = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
        raise ValueError(
            f"the declarations file {path} (spark.file) must be a mapping with the keys views and indexes (what "
            "the spark: section holds), "
            f"not {found}. Fix: put the declarations under views: and indexes: at its top level"
        )
    for kind in ("views", "indexes"):
        if not isinstance(data.get(kind) or [], list):
            raise ValueError(f"the declarations file {path} (spark.file): {kind} must be a list of declarations")
    return data


def load_declarations(path: str | Path) -> SparkSection:
    """A declarations file on its own (the demo's): its views and indexes, validated; DeclarationError naming
    the file and every problem."""
    from pydantic import ValidationError

    try:
        return SparkSection.model_validate({"file": str(path)})
    except ValidationError as e:
        problems = [
            (f"{'.'.join(map(str, err['loc']))}: " if err["loc"] else "") + err["msg"].removeprefix("Value error, ")
            for err in e.errors()
        ]
        raise DeclarationError(f"the declarations in {path} are invalid:\n  " + "\n  ".join(problems)) from None


def sql_name(qualified: str) -> str:
    """The name a rebuilt table has in the declared queries: ``public.orders`` -> ``public_orders``."""
    schema, _, table = qualified.partition(".")
    return f"{schema}_{table}"


class DeclarationError(ValueError):
    """A declared view or index that cannot be built; the message names it and what is wrong."""


def check_declarations(section: SparkSection, columns: Mapping[str, Sequence[str]]) -> None:
    """Parse and resolve every declared query against ``columns`` (qualified table -> its columns);
    DeclarationError naming every view or index that does not parse, names an unknown table or column,
    or lacks its key (id, fields) columns."""
    import sqlglot
    from sqlglot.errors import OptimizeError, ParseError
    from sqlglot.optimizer.qualify import qualify

    schema: dict[str, object] = {sql_name(t): {c: "string" for c in cols} for t, cols in columns.items()}
    known = ", ".join(sorted(schema)) or "none"
    problems: list[str] = []
    declared: list[tuple[str, str, list[str]]] = [(f"view {v.name}", v.sql, v.key) for v in section.views]
    declared += [(f"index {i.name}", i.sql, i.columns) for i in section.indexes]
    for what, query, needed in declared:
        try:
            tree = sqlglot.parse_one(query, read="spark")
        except ParseError as e:
            problems.append(f"{what}: its SQL does not parse ({str(e).splitlines()[0]})")
            continue
        if not isinstance(tree, sqlglot.exp.Query):
            problems.append(f"{what}: its SQL is not a query (SELECT ...)")
            continue
        tables = sorted(
            {t.name for t in tree.find_all(sqlglot.exp.Table)} - {cte.alias for cte in tree.find_all(sqlglot.exp.CTE)}
        )
        unknown = [t for t in tables if t not in schema]
        if unknown:
            problems.append(f"{what}: unknown table(s) {', '.join(unknown)} (the captured tables are: {known})")
            continue
        try:
            qualify(tree, schema=schema, dialect="spark", validate_qualify_columns=True)
        except OptimizeError as e:
            problems.append(f"{what}: {str(e).splitlines()[0]}")
            continue
        missing = [c for c in needed if c not in tree.named_selects]
        if missing and "*" not in tree.named_selects:
            problems.append(f"{what}: its query does not give the column(s) {', '.join(missing)} it declares")
    if problems:
        raise DeclarationError("the declared Spark views and indexes cannot be built:\n  " + "\n  ".join(problems))


# --------------------------------------------------------------------------- key lineage


class KeyLineage(BaseModel):
    """A view whose rows of one key depend only on the row of the same key of one table (``table``), and on
    the other tables it reads (``reads``): when a micro-batch changed ``table`` alone, recomputing the view
    for the keys it touched is the same as recomputing the whole view."""

    model_config = ConfigDict(frozen=True)

    table: str  # qualified: schema.table
    columns: dict[str, str]  # the view's key column -> the table's key column


class NoKeyLineage(BaseModel):
    model_config = ConfigDict(frozen=True)

    reason: str


_NOT_ROW_BY_ROW: tuple[tuple[str, str], ...] = (  # node class -> why a key's rows may depend on other rows
    ("AggFunc", "an aggregate"),
    ("Window", "a window function"),
    ("Group", "GROUP BY"),
    ("Having", "HAVING"),
    ("Qualify", "QUALIFY"),
    ("Distinct", "DISTINCT"),
    ("Limit", "LIMIT"),
    ("Offset", "OFFSET"),
    ("Order", "ORDER BY"),
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
    ("Rand", "rand()"),
    ("Randn", "randn()"),
    ("Uuid", "uuid()"),
    ("CurrentTimestamp", "current_timestamp()"),
    ("CurrentDate", "current_date()"),
    ("CurrentTime", "current_time()"),
    ("Anonymous", "a function the checker does not know (it may be an aggregate or not deterministic)"),
)


class OneTableSelect(BaseModel):
    """A declared query that reads one captured table first (``table``, aliased ``alias`` in ``tree``)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    tree: Any  # the qualified sqlglot Select
    table: str
    alias: str


def one_table_select(
    sql: str,
    tables: Mapping[str, Sequence[str]],
    not_allowed: Sequence[tuple[str, str]],
    check: Callable[[Any], str | None] | None = None,
) -> OneTableSelect | NoKeyLineage:
    """The checks key and group lineage share: ``sql`` resolves against ``tables`` (qualified table -> its
    columns) as a single SELECT (then ``check``, given the tree, may name why not), with no subquery and no
    node of ``not_allowed`` (sqlglot class name, what to call it), from one captured table read once, then
    only inner or LEFT joins. Anything else: ``NoKeyLineage`` with why."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import OptimizeError, ParseError
    from sqlglot.optimizer.qualify import qualify

    by_sql_name = {sql_name(t): t for t in tables}
    schema: dict[str, object] = {sql_name(t): {c: "string" for c in cols} for t, cols in tables.items()}
    try:
        tree = qualify(
            sqlglot.parse_one(sql, read="spark"), schema=schema, dialect="spark", validate_qualify_columns=True
        )
    except (ParseError, OptimizeError) as e:
        return NoKeyLineage(reason=f"its SQL does not resolve: {str(e).splitlines()[0]}")
    if not isinstance(tree, exp.Select):
        return NoKeyLineage(reason="it is not a single SELECT")
    why = check(tree) if check is not None else None
    if why is not None:
        return NoKeyLineage(reason=why)
    for node in tree.walk():
        if isinstance(node, exp.Select) and node is not tree:
            return NoKeyLineage(reason="it has a subquery")
        for name, what in not_allowed:
            if isinstance(node, getattr(exp, name)):
                return NoKeyLineage(reason=f"it has {what}")
    from_ = tree.find(exp.From)
    if from_ is None or not isinstance(from_.this, exp.Table):
        return NoKeyLineage(reason="it reads no table")
    base = from_.this
    joins = list(tree.args.get("joins") or [])
    if any(j.side not in ("", "LEFT") or not isinstance(j.this, exp.Table) for j in joins):
        return NoKeyLineage(reason="it has a RIGHT or FULL join (rows that come from another table)")
    if [t.name for t in tree.find_all(exp.Table)].count(base.name) > 1:
        return NoKeyLineage(reason=f"it reads {base.name} more than once")
    table = by_sql_name.get(base.name)
    if table is None:
        return NoKeyLineage(reason=f"{base.name} is not a captured table")
    return OneTableSelect(tree=tree, table=table, alias=base.alias_or_name)


def key_lineage(
    view: DeclaredView, tables: Mapping[str, Sequence[str]], keys: Mapping[str, Sequence[str]]
) -> KeyLineage | NoKeyLineage:
    """Whether ``view``'s rows of one key come from one table's row of the same key, and which.

    ``tables``: qualified table -> its columns; ``keys``: qualified table -> its key columns. Conservative:
    a single SELECT from one table (read once), then only inner or LEFT joins (so that table's rows are
    the ones kept), no aggregate, window, DISTINCT, LIMIT, subquery, set operation, generator or
    non-deterministic or unknown function; each of the view's key columns is one of that table's key
    columns, unchanged, and together they are all of them. Anything else: ``NoKeyLineage`` with why.
    """
    from sqlglot import exp

    found = one_table_select(view.sql, tables, _NOT_ROW_BY_ROW)
    if isinstance(found, NoKeyLineage):
        return found
    table, alias = found.table, found.alias
    columns: dict[str, str] = {}
    for key in view.key:
        select = next((s for s in found.tree.selects if s.alias_or_name == key), None)
        source = select.unalias() if select is not None else None
        if not (isinstance(source, exp.Column) and source.table == alias and source.name in keys.get(table, ())):
            return NoKeyLineage(reason=f"its key column {key} is not a key column of {table} taken unchanged")
        columns[key] = source.name
    if sorted(columns.values()) != sorted(keys.get(table, ())):
        return NoKeyLineage(reason=f"its key is not the whole key of {table} ({', '.join(keys.get(table, ()))})")
    return KeyLineage(table=table, columns=columns)


def tables_read(query: str, tables: Sequence[str]) -> list[str]:
    """The captured tables (qualified) a declared query reads; every one of ``tables`` when it cannot tell."""
    import sqlglot
    from sqlglot.errors import ParseError

    try:
        tree = sqlglot.parse_one(query, read="spark")
    except ParseError:
        return list(tables)
    names = {t.name for t in tree.find_all(sqlglot.exp.Table)}
    return [t for t in tables if sql_name(t) in names]
