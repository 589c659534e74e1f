"""``group_lineage``: which aggregate views the continuous job may refresh by the groups a batch touched. It
says yes only when the view's key is columns of one table that the query groups by, taken unchanged (so a
view row is an aggregate over that table's rows holding its key's values, with what they join); anything
that makes a group's row depend on other groups, or on chance, is a no with its reason."""

from __future__ import annotations

import pytest

from cdc.declared import KeyLineage, NoKeyLineage
from cdc_views.declared import group_lineage, grouped_by_exactly

COLUMNS = {
    "public.orders": ["id", "customer_id", "status", "amount"],
    "public.customers": ["id", "name", "region"],
}


@pytest.mark.parametrize(
    ("sql", "key", "columns"),
    [
        (
            "SELECT customer_id, count(*) AS orders, sum(amount) AS total FROM public_orders GROUP BY customer_id",
            ["customer_id"],
            {"customer_id": "customer_id"},
        ),
        (
            "SELECT o.customer_id AS customer, o.status, count(DISTINCT o.id) AS n FROM public_orders o "
            "WHERE o.amount > 0 GROUP BY o.customer_id, o.status HAVING count(*) > 1",
            ["customer", "status"],
            {"customer": "customer_id", "status": "status"},
        ),
        (  # the key is a part of the grouping (name follows from customer_id): still one group per key value
            "SELECT o.customer_id, c.name, sum(o.amount) AS total FROM public_orders o "
            "LEFT JOIN public_customers c ON c.id = o.customer_id GROUP BY o.customer_id, c.name",
            ["customer_id"],
            {"customer_id": "customer_id"},
        ),
        (
            "SELECT customer_id, max(amount) AS top FROM public_orders GROUP BY 1",
            ["customer_id"],
            {"customer_id": "customer_id"},
        ),
    ],
)
def test_an_aggregate_keyed_by_columns_of_its_first_table_it_groups_by_has_group_lineage(
    sql: str, key: list[str], columns: dict[str, str]
) -> None:
    assert group_lineage(sql, key, COLUMNS) == KeyLineage(table="public.orders", columns=columns)


@pytest.mark.parametrize(
    ("sql", "key", "reason"),
    [
        ("SELECT count(*) AS n, 1 AS one FROM public_orders", ["one"], "without GROUP BY"),
        (
            "SELECT upper(status) AS s, count(*) AS n FROM public_orders GROUP BY upper(status)",
            ["s"],
            "is not a column of public.orders it groups by",
        ),
        (
            "SELECT c.region, count(*) AS n FROM public_orders o JOIN public_customers c ON c.id = o.customer_id "
            "GROUP BY c.region",
            ["region"],
            "is not a column of public.orders it groups by",
        ),
        (
            "SELECT customer_id, count(*) AS n FROM public_orders GROUP BY ROLLUP(customer_id)",
            ["customer_id"],
            "ROLLUP",
        ),
        (
            "SELECT customer_id, sum(amount) AS total, rank() OVER (ORDER BY sum(amount)) AS r FROM public_orders "
            "GROUP BY customer_id",
            ["customer_id"],
            "a window function",
        ),
        (
            "SELECT customer_id, count(*) AS n FROM public_orders WHERE amount > (SELECT avg(amount) FROM "
            "public_orders) GROUP BY customer_id",
            ["customer_id"],
            "a subquery",
        ),
        (
            "SELECT customer_id, count(*) AS n FROM public_orders GROUP BY customer_id LIMIT 10",
            ["customer_id"],
            "LIMIT",
        ),
        (
            "SELECT o.customer_id, count(*) AS n FROM public_orders o RIGHT JOIN public_customers c "
            "ON c.id = o.customer_id GROUP BY o.customer_id",
            ["customer_id"],
            "RIGHT or FULL join",
        ),
        (
            "SELECT customer_id, sum(amount * rand()) AS n FROM public_orders GROUP BY customer_id",
            ["customer_id"],
            "rand()",
        ),
        ("SELECT id, status FROM public_orders", ["id"], "without GROUP BY"),
        ("SELECT nothing FROM public_orders GROUP BY nothing", ["nothing"], "does not resolve"),
    ],
)
def test_anything_else_is_recomputed_whole_and_says_why(sql: str, key: list[str], reason: str) -> None:
    found = group_lineage(sql, key, COLUMNS)
    assert isinstance(found, NoKeyLineage)
    assert reason in found.reason


@pytest.mark.parametrize(
    ("sql", "columns", "unique"),
    [
        ("SELECT customer_id, count(*) AS n FROM public_orders GROUP BY customer_id", ["customer_id"], True),
        (
            "SELECT o.customer_id AS customer, o.status, count(*) AS n FROM public_orders o "
            "GROUP BY o.status, o.customer_id HAVING count(*) > 1",
            ["customer_id", "status"],
            True,
        ),
        (  # a further column grouped by: several rows may share the key
            "SELECT o.customer_id, c.name, sum(o.amount) AS total FROM public_orders o "
            "LEFT JOIN public_customers c ON c.id = o.customer_id GROUP BY o.customer_id, c.name",
            ["customer_id"],
            False,
        ),
        (  # the same name from two tables
            "SELECT o.id, count(*) AS n FROM public_orders o JOIN public_customers c ON c.id = o.customer_id "
            "GROUP BY o.id, c.id",
            ["id"],
            False,
        ),
        ("SELECT customer_id, max(amount) AS top FROM public_orders GROUP BY 1", ["customer_id"], False),
        ("SELECT customer_id, amount FROM public_orders", ["customer_id"], False),
        ("SELECT customer_id FROM (SELECT * FROM public_orders) GROUP BY customer_id", ["customer_id"], False),
        ("SELECT FROM WHERE", ["customer_id"], False),
    ],
)
def test_grouped_by_exactly_its_key_says_whether_a_view_has_one_row_per_key(
    sql: str, columns: list[str], unique: bool
) -> None:
    assert grouped_by_exactly(sql, columns) is unique
