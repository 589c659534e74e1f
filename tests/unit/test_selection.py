"""Table patterns: how name, glob and regex entries select the catalog's tables, and what is refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cdc.config import TableConfig
from cdc.selection import SelectionError, matches, select_tables, selects

CATALOG = [
    ("public", "customers"),
    ("public", "order_lines"),
    ("public", "orders"),
    ("public", "orders_archive"),
    ("sales", "orders"),
    ("sales", "refunds"),
]


def entry(**kw: object) -> TableConfig:
    return TableConfig.model_validate(kw)


def test_a_glob_without_a_schema_means_public_and_its_star_stays_within_the_table_name() -> None:
    e = entry(pattern="order*")
    assert e.pattern == "public.order*"
    assert matches(e, "public", "orders") and matches(e, "public", "order_lines")
    assert not matches(e, "sales", "orders")
    assert not matches(entry(pattern="public*"), "public", "orders")  # no dot: the whole glob is the table's


def test_glob_star_and_question_mark_do_not_cross_the_dot_and_classes_work() -> None:
    assert matches(entry(pattern="*.orders"), "sales", "orders")
    assert not matches(entry(pattern="pub*"), "public", "x")
    assert matches(entry(pattern="public.order?"), "public", "orders")
    assert not matches(entry(pattern="public.order?"), "public", "order_lines")
    assert matches(entry(pattern="[ps]*.orders"), "sales", "orders")
    assert not matches(entry(pattern="[!s]*.orders"), "sales", "orders")


def test_globs_and_regexes_are_case_sensitive_like_postgres_names() -> None:
    assert not matches(entry(pattern="public.Orders"), "public", "orders")
    assert not matches(entry(regex=r"public\.Orders"), "public", "orders")
    assert matches(entry(regex=r"(?i)public\.Orders"), "public", "orders")


def test_a_regex_must_match_the_whole_qualified_name_like_debeziums_include_list() -> None:
    e = entry(regex=r"public\.orders")
    assert matches(e, "public", "orders")
    assert not matches(e, "public", "orders_archive")  # anchored at the end
    assert not matches(entry(regex=r"orders"), "public", "orders")  # and at the start
    assert matches(entry(regex=r"(public|sales)\.orders(_\w+)?"), "public", "orders_archive")


def test_patterns_expand_to_concrete_tables_with_the_entrys_settings() -> None:
    sel = select_tables(
        [entry(name="public.customers"), entry(pattern="public.order*", exclude_columns=["note"], partitions=3)],
        CATALOG,
    )
    assert sel.names == ["public.customers", "public.order_lines", "public.orders", "public.orders_archive"]
    expanded = sel.tables[1]
    assert (expanded.name, expanded.pattern, expanded.regex) == ("public.order_lines", None, None)
    assert expanded.exclude_columns == ["note"] and expanded.partitions == 3
    assert sel.expanded == {"pattern 'public.order*'": ("public.order_lines", "public.orders", "public.orders_archive")}


def test_a_named_table_wins_over_a_pattern_that_also_matches_it() -> None:
    sel = select_tables([entry(pattern="*.orders", partitions=6), entry(name="sales.orders", key=["id"])], CATALOG)
    by_name = {t.name: t for t in sel.tables}
    assert by_name["sales.orders"].key == ["id"] and by_name["sales.orders"].partitions is None
    assert by_name["public.orders"].partitions == 6
    assert sel.named_over_pattern == {"pattern '*.orders'": ("sales.orders",)}


def test_two_patterns_with_equal_settings_may_overlap() -> None:
    sel = select_tables([entry(pattern="public.orders*"), entry(regex=r"public\.orders")], CATALOG)
    assert sel.names == ["public.orders", "public.orders_archive"]


def test_two_patterns_with_different_settings_on_one_table_are_an_error_naming_both_and_the_fix() -> None:
    with pytest.raises(SelectionError) as e:
        select_tables([entry(pattern="public.orders*"), entry(regex=r".*\.orders", partitions=2)], CATALOG)
    text = str(e.value)
    assert "table public.orders is matched by pattern 'public.orders*' and by regex '.*\\\\.orders'" in text
    assert "list public.orders by name" in text
    assert "public.orders_archive" not in text  # matched by one pattern only: no conflict


def test_a_pattern_matching_nothing_is_an_error_naming_it_and_the_fix() -> None:
    with pytest.raises(SelectionError, match=r"pattern 'public\.nothing_\*' matches no table.*allow_empty: true"):
        select_tables([entry(name="public.customers"), entry(pattern="public.nothing_*")], CATALOG)


def test_allow_empty_lets_a_pattern_match_nothing_and_reports_it() -> None:
    sel = select_tables([entry(name="public.customers"), entry(pattern="public.later_*", allow_empty=True)], CATALOG)
    assert sel.names == ["public.customers"]
    assert sel.empty == ("pattern 'public.later_*'",)


def test_nothing_at_all_to_capture_is_an_error() -> None:
    with pytest.raises(SelectionError, match="no table to capture"):
        select_tables([entry(pattern="public.later_*", allow_empty=True)], CATALOG)


def test_a_pattern_whose_tables_are_all_named_is_not_empty() -> None:
    sel = select_tables([entry(name="public.customers"), entry(pattern="public.cust*")], CATALOG)
    assert sel.names == ["public.customers"]
    assert sel.empty == ()


def test_a_matched_table_with_a_dot_in_its_name_is_refused_not_skipped() -> None:
    with pytest.raises(SelectionError, match=r"'public\.odd\.name', whose schema or name holds a dot"):
        select_tables([entry(regex=r"public\..*")], [("public", "odd.name"), ("public", "orders")])


def test_named_tables_need_no_catalog_and_keep_their_order() -> None:
    sel = select_tables([entry(name="public.b"), entry(name="a")], [])
    assert sel.names == ["public.b", "public.a"]


def test_selects_answers_without_a_catalog() -> None:
    entries = [entry(name="public.customers"), entry(pattern="sales.*")]
    assert selects(entries, "sales.anything") and selects(entries, "public.customers")
    assert not selects(entries, "public.orders")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "give exactly one of name, pattern, regex"),
        ({"name": "public.a", "pattern": "public.*"}, r"this entry has name, pattern"),
        ({"pattern": "a.b.c"}, "one dot"),
        ({"pattern": "public.[ab"}, "unbalanced"),
        ({"regex": "public\\.(orders"}, "not a valid regular expression"),
        ({"name": "public.a", "allow_empty": True}, "allow_empty applies to pattern and regex entries only"),
        ({"pattern": "public.*", "key": ["id"], "mask": {"id": "fixed"}}, "key columns cannot be excluded or masked"),
    ],
)
def test_bad_entries_are_refused_with_the_reason(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TableConfig.model_validate(fields)


def test_a_pattern_entry_is_not_a_table_until_expanded() -> None:
    with pytest.raises(ValueError, match="is a pattern, not a table: expand it first"):
        _ = entry(pattern="public.*").qualified
