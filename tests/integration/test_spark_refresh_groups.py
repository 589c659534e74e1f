"""The continuous job refreshes an aggregate view by the groups a micro-batch touched (issue #39): a view keyed
by columns of one table that its query groups by is recomputed for the groups the batch's rows had before or
after it, when the batch changed that table alone; whole otherwise (another table it reads changed, or a
touched group's key is null), said in its log; equal to the same SQL over the database after each batch."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc import dev
from cdc.declared import DeclaredView, SparkSection
from cdc_views import jobs
from cdc_views.verify import verify
from tests.support.spark import CapturedDatabase, captured_database

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::DeprecationWarning"),
]

TABLES = ["public.customers", "public.orders"]
SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE orders (id int PRIMARY KEY, customer_id int, amount numeric(12,2) NOT NULL);
"""
SECTION = SparkSection(
    views=[
        DeclaredView(
            name="per_customer",
            sql="SELECT customer_id, count(*) AS orders, sum(amount) AS total FROM public_orders GROUP BY customer_id",
            key=["customer_id"],
        ),
        DeclaredView(
            name="named_totals",
            sql="""SELECT o.customer_id, c.name, sum(o.amount) AS total
                     FROM public_orders o LEFT JOIN public_customers c ON c.id = o.customer_id
                    WHERE o.customer_id IS NOT NULL GROUP BY o.customer_id, c.name""",
            key=["customer_id"],
        ),
    ]
)


class Recorder:
    """Stands in for the jobs' logger: keeps each event and its fields."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    warning = info

    def written(self) -> dict[str, dict[str, Any]]:
        """Each view's last ``view_written`` (or ``declared_unchanged``) fields."""
        out: dict[str, dict[str, Any]] = {}
        for event, fields in self.events:
            if event == "view_written":
                out[fields["view"]] = fields
            elif event == "declared_unchanged":
                out[fields["declared"].removeprefix("view ")] = fields
        return out


@pytest.fixture(scope="module")
def shop(services: dev.Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CapturedDatabase]:
    name = f"groups_{secrets.token_hex(3)}"
    with captured_database(services, tmp_path_factory.mktemp("groups"), name, [SCHEMA], TABLES) as db:
        db.run(
            [
                "INSERT INTO customers SELECT i, 'Customer ' || i FROM generate_series(1, 6) i",
                "INSERT INTO orders SELECT i, 1 + i % 5, i * 1.5 FROM generate_series(1, 40) i",
            ]
        )
        yield db


def _pass(spark: Any, cfg: jobs.JobConfig, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr(jobs, "log", recorder)
    query = jobs.start_continuous(spark, cfg, available_now=True)
    assert query.awaitTermination(600), "the continuous job did not take in what was there within 600 s"
    assert query.exception() is None
    return recorder


def _verified(spark: Any, shop: CapturedDatabase, cfg: jobs.JobConfig) -> None:
    report = verify(shop.dsn, cfg.warehouse, cfg.tables, spark=spark, declared_section=SECTION)
    assert report.ok, report.render()
    assert [c.name for c in report.checks][-2:] == ["view per_customer", "view named_totals"]


def test_an_aggregate_view_is_refreshed_by_the_groups_a_batch_touched(
    spark: Any, shop: CapturedDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = shop.job(tmp_path / "wh", declared=SECTION)
    first = _pass(spark, cfg, monkeypatch)
    planned = {f["declared"]: f["by_groups_of"] for e, f in first.events if e == "stream.refresh_planned"}
    assert planned == {"view per_customer": "public.orders", "view named_totals": "public.orders"}
    assert {v: f["mode"] for v, f in first.written().items()} == {"per_customer": "whole", "named_totals": "whole"}
    _verified(spark, shop, cfg)

    shop.run(  # orders alone: customer 1's and 2's groups (an order moves), 3's gone, 9's new
        [
            "UPDATE orders SET amount = amount + 100 WHERE id = 5",
            "UPDATE orders SET customer_id = 2 WHERE id = 10",
            "DELETE FROM orders WHERE customer_id = 4",
            "INSERT INTO orders VALUES (100, 9, 7.25)",
        ]
    )
    by_groups = _pass(spark, cfg, monkeypatch).written()
    assert {v: f["mode"] for v, f in by_groups.items()} == {"per_customer": "groups", "named_totals": "groups"}
    # the groups 1 (order 5 and 10's old customer), 2, 4 (now empty: its row deleted) and 9; not 3 or 5
    assert by_groups["per_customer"]["keys"] == 4
    _verified(spark, shop, cfg)

    shop.run(["UPDATE customers SET name = 'Ada' WHERE id = 2"])  # customers alone: one view reads them
    other = _pass(spark, cfg, monkeypatch).written()
    assert other["per_customer"]["mode"] == "unchanged"
    assert other["named_totals"]["mode"] == "whole"
    assert "public.customers, which it reads too" in other["named_totals"]["reason"]
    _verified(spark, shop, cfg)

    shop.run(["INSERT INTO orders VALUES (101, NULL, 1.00)"])  # a null group key: recomputed whole, and right
    nulls = _pass(spark, cfg, monkeypatch).written()
    assert {v: f["mode"] for v, f in nulls.items()} == {"per_customer": "whole", "named_totals": "whole"}
    assert "null in customer_id" in nulls["per_customer"]["reason"]
    _verified(spark, shop, cfg)
