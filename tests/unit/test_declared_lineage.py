"""``key_lineage``: which declared views the continuous job may refresh by the keys a batch touched. It says
yes only when a key's rows come from one table's row of the same key (projections, filters, inner and left
joins); anything that makes a row depend on other rows of that table, or on chance, is a no with its reason."""

from __future__ import annotations

import pytest

from cdc.declared import DeclaredView, KeyLineage, NoKeyLineage, key_lineage, tables_read

COLUMNS = {
    "public.members": ["id", "name"],
    "public.loans": ["isbn", "member", "days"],
    "public.books": ["isbn", "title", "author_id"],
}
KEYS = {"public.members": ["id"], "public.loans": ["isbn", "member"], "public.books": ["isbn"]}


def lineage(sql: str, key: list[str]) -> KeyLineage | NoKeyLineage:
    return key_lineage(DeclaredView(name="v", sql=sql, key=key), COLUMNS, KEYS)


@pytest.mark.parametrize(
    ("sql", "key", "table", "columns"),
    [
        (
            "SELECT l.isbn, l.member, l.days, b.title FROM public_loans l LEFT JOIN public_books b ON b.isbn = l.isbn",
            ["isbn", "member"],
            "public.loans",
            {"isbn": "isbn", "member": "member"},
        ),
        (
            "SELECT * FROM public_loans WHERE days > 3",
            ["member", "isbn"],
            "public.loans",
            {"member": "member", "isbn": "isbn"},
        ),
        (
            "SELECT b.isbn AS book, upper(b.title) AS title, m.name FROM public_books b JOIN public_members m ON "
            "m.id = b.author_id",
            ["book"],
            "public.books",
            {"book": "isbn"},
        ),
        (
            "SELECT b.isbn FROM public_books b LEFT SEMI JOIN public_loans l ON l.isbn = b.isbn",
            ["isbn"],
            "public.books",
            {"isbn": "isbn"},
        ),
    ],
)
def test_a_row_by_row_view_keyed_by_its_first_tables_key_has_key_lineage(
    sql: str, key: list[str], table: str, columns: dict[str, str]
) -> None:
    assert lineage(sql, key) == KeyLineage(table=table, columns=columns)


@pytest.mark.parametrize(
    ("sql", "key", "reason"),
    [
        (
            "SELECT m.id, count(l.isbn) AS n FROM public_members m LEFT JOIN public_loans l ON l.member = m.id "
            "GROUP BY m.id",
            ["id"],
            "GROUP BY",
        ),
        ("SELECT count(*) AS n, 1 AS id FROM public_members", ["id"], "an aggregate"),
        ("SELECT b.isbn, rank() OVER (ORDER BY b.title) AS r FROM public_books b", ["isbn"], "a window function"),
        ("SELECT DISTINCT b.isbn FROM public_books b", ["isbn"], "DISTINCT"),
        (
            "SELECT b.isbn FROM public_books b WHERE b.author_id IN (SELECT id FROM public_members)",
            ["isbn"],
            "a subquery",
        ),
        ("SELECT isbn FROM public_books UNION ALL SELECT isbn FROM public_loans", ["isbn"], "a single SELECT"),
        ("WITH x AS (SELECT isbn FROM public_books) SELECT isbn FROM x", ["isbn"], "WITH"),
        ("SELECT b.isbn, rand() AS r FROM public_books b", ["isbn"], "rand()"),
        ("SELECT b.isbn, my_udf(b.title) AS t FROM public_books b", ["isbn"], "a function the checker does not know"),
        ("SELECT b.isbn FROM public_books b ORDER BY b.title LIMIT 3", ["isbn"], "LIMIT"),
        (
            "SELECT b.isbn FROM public_loans l RIGHT JOIN public_books b ON b.isbn = l.isbn",
            ["isbn"],
            "RIGHT or FULL join",
        ),
        (
            "SELECT l.isbn, l.member FROM public_loans l JOIN public_loans o ON o.isbn = l.isbn",
            ["isbn", "member"],
            "reads public_loans more than once",
        ),
        (
            "SELECT l.isbn, l.days AS member FROM public_loans l",
            ["isbn", "member"],
            "its key column member is not a key column of public.loans taken unchanged",
        ),
        ("SELECT l.isbn, l.member FROM public_loans l", ["isbn"], "not the whole key of public.loans (isbn, member)"),
        (
            "SELECT concat(b.isbn, '') AS isbn FROM public_books b",
            ["isbn"],
            "not a key column of public.books taken unchanged",
        ),
        (
            "SELECT b.isbn, m.id FROM public_members m JOIN public_books b ON m.id = b.author_id",
            ["isbn"],
            "not a key column of public.members",
        ),
        ("SELECT nope FROM public_books", ["nope"], "does not resolve"),
    ],
)
def test_anything_else_is_refreshed_whole_and_says_why(sql: str, key: list[str], reason: str) -> None:
    answer = lineage(sql, key)

    assert isinstance(answer, NoKeyLineage)
    assert reason in answer.reason


def test_the_tables_a_query_reads_are_its_tables_not_its_ctes() -> None:
    sql = "WITH x AS (SELECT isbn FROM public_books) SELECT * FROM x JOIN public_members m ON m.id = 1"
    assert tables_read(sql, list(COLUMNS)) == ["public.members", "public.books"]
    assert tables_read("SELECT (", list(COLUMNS)) == list(COLUMNS)  # cannot tell: every table
