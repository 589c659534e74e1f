"""Which tables the ``tables`` entries capture: named tables, and pattern entries expanded against the catalog.

Pure logic: the catalog's candidate tables come in as ``(schema, table)`` pairs
(``cdc.catalog.candidate_tables`` reads them: ordinary and partitioned tables, no views, no
partitions, no system schemas). The rules, in order:

1. A named entry selects its table, whether or not it is a candidate (``describe_tables`` then says
   what is wrong with it, e.g. that it does not exist).
2. A ``pattern`` (glob) or ``regex`` entry selects every candidate it matches, except the tables
   named by a named entry: an explicit name wins, with its own settings.
3. When two pattern entries match the same table, they must have the same settings (key, columns,
   masks, topic settings); the first one listed is then used. Different settings are an error
   naming both entries and the table.
4. A pattern entry matching no table is an error naming the pattern, unless it sets
   ``allow_empty`` (the caller logs it).

Globs: ``schema.table``, each side matched on its own, so ``*`` and ``?`` never cross the dot;
``[abc]`` and ``[!abc]`` are character classes; no dot means the ``public`` schema. A regex must
match the whole ``schema.table`` (like Debezium's ``table.include.list``). Both are case-sensitive,
as PostgreSQL names are (``(?i)`` in a regex makes it insensitive).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cdc.config import TableConfig, check_glob

__all__ = ["Selection", "SelectionError", "check_glob", "matches", "select_tables", "selects"]

_SELECTOR_KEYS = {"name", "pattern", "regex", "allow_empty"}


class SelectionError(Exception):
    """The entries cannot be expanded as they are; the message names each entry, the tables and the fix."""


def _glob_regex(part: str) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(part))


def matches(entry: TableConfig, schema: str, table: str) -> bool:
    """Whether the entry selects ``schema.table``."""
    if entry.name is not None:
        return entry.name == f"{schema}.{table}"
    if entry.pattern is not None:
        schema_glob, _, table_glob = entry.pattern.partition(".")
        return bool(_glob_regex(schema_glob).match(schema) and _glob_regex(table_glob).match(table))
    assert entry.regex is not None
    return re.fullmatch(entry.regex, f"{schema}.{table}") is not None


def selects(entries: Iterable[TableConfig], qualified: str) -> bool:
    """Whether any entry selects the table ``schema.table`` (no catalog needed)."""
    schema, _, table = qualified.partition(".")
    return any(matches(e, schema, table) for e in entries)


def entry_for(entries: Sequence[TableConfig], schema: str, table: str) -> TableConfig | None:
    """The entry whose settings ``schema.table`` gets: its named entry, else the first pattern selecting it."""
    qualified = f"{schema}.{table}"
    named = [e for e in entries if e.name == qualified]
    if named:
        return named[0]
    return next((e for e in entries if e.name is None and matches(e, schema, table)), None)


def settings_of(entry: TableConfig) -> dict[str, Any]:
    """What an entry gives each table it selects: everything but how it selects them."""
    return entry.model_dump(exclude=_SELECTOR_KEYS)


@dataclass(frozen=True, slots=True)
class Selection:
    """The concrete tables, and for each pattern entry what it selected (for logs and ``cdc validate``)."""

    tables: tuple[TableConfig, ...]  # every entry named, in configuration order: named ones first
    expanded: dict[str, tuple[str, ...]]  # pattern selector -> the tables it gives its settings to
    named_over_pattern: dict[str, tuple[str, ...]]  # pattern selector -> matched tables a named entry took
    empty: tuple[str, ...]  # allow_empty patterns that matched nothing

    @property
    def names(self) -> list[str]:
        return [t.qualified for t in self.tables]


def select_tables(entries: Sequence[TableConfig], candidates: Iterable[tuple[str, str]]) -> Selection:
    """Expand the pattern entries over the candidate tables; SelectionError lists every problem."""
    named = [e for e in entries if e.name is not None]
    patterns = [e for e in entries if e.name is None]
    explicit = {e.qualified for e in named}
    expanded: dict[str, list[str]] = {p.selector: [] for p in patterns}
    shadowed: dict[str, list[str]] = {p.selector: [] for p in patterns}
    chosen: dict[str, TableConfig] = {}  # table -> the pattern entry giving it its settings
    matched: set[str] = set()  # pattern selectors that matched any candidate
    problems: list[str] = []
    for schema, table in sorted(set(candidates)):
        qualified = f"{schema}.{table}"
        hits = [p for p in patterns if matches(p, schema, table)]
        if not hits:
            continue
        matched.update(p.selector for p in hits)
        if qualified in explicit:
            for p in hits:
                shadowed[p.selector].append(qualified)
            continue
        if "." in schema or "." in table:
            problems.append(
                f"{hits[0].selector} matches the table {qualified!r}, whose schema or name holds a dot, which "
                "this connector cannot name. Fix: rename the table, or narrow the pattern so it does not match it."
            )
            continue
        differing = [p for p in hits[1:] if settings_of(p) != settings_of(hits[0])]
        if differing:
            problems.append(
                f"table {qualified} is matched by {hits[0].selector} and by "
                f"{', '.join(p.selector for p in differing)} with different settings. Fix: list {qualified} by "
                "name with the settings it should have (a named table wins over patterns), or narrow the patterns."
            )
            continue
        chosen[qualified] = hits[0]
        for p in hits:
            expanded[p.selector].append(qualified)
    empty = []
    for p in patterns:
        if p.selector in matched:
            continue
        if p.allow_empty:
            empty.append(p.selector)
        else:
            problems.append(
                f"tables: {p.selector} matches no table (ordinary or partitioned, outside the system schemas). "
                "Fix: correct the pattern, create the table first, or set 'allow_empty: true' on the entry to "
                "start without it (a table created later is picked up on SIGHUP or by table_rescan_interval_s)."
            )
    if problems:
        raise SelectionError("cannot expand the table patterns:\n  " + "\n  ".join(problems))
    tables = [*named]
    for qualified, entry in chosen.items():
        tables.append(
            entry.model_copy(update={"name": qualified, "pattern": None, "regex": None, "allow_empty": False})
        )
    if not tables:
        raise SelectionError(
            "tables: no table to capture: every pattern matched nothing and no table is named. "
            "Fix: create a matching table first, or name at least one table."
        )
    return Selection(
        tables=tuple(tables),
        expanded={k: tuple(v) for k, v in expanded.items()},
        named_over_pattern={k: tuple(v) for k, v in shadowed.items() if v},
        empty=tuple(empty),
    )
