"""The derived views over the shop tables, as pure DataFrame functions (tables in, view out).

The same functions build a view from rows read off the topics (batch), from warehouse tables
(streaming refreshes of the entities a micro-batch touched), and from the source database
(verification), so what is checked is the pipeline, not a second copy of the view's definition.

* ``orders_enriched``: one row per order, with its customer's name and e-mail, its lines
  counted and totalled (``sum(quantity * unit_price)``) and the titles of its products; key
  ``order_id``. Joins four topics.
* ``search_documents``: one document per order (customer, status, product titles and SKUs) and
  per product (SKU, title, tags, price, and the names of the customers who ordered it).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

CUSTOMERS = "public.customers"
PRODUCTS = "public.products"
ORDERS = "public.orders"
ORDER_LINES = "public.order_lines"
SHOP_TABLES = (CUSTOMERS, PRODUCTS, ORDERS, ORDER_LINES)
ORDERS_VIEW = "orders_enriched"
ORDERS_VIEW_KEY = ("order_id",)
JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"}  # to_json keeps microseconds


def has_shop_tables(tables: Mapping[str, object]) -> bool:
    return all(name in tables for name in SHOP_TABLES)


def _lines_with_products(tables: Mapping[str, DataFrame]) -> DataFrame:
    lines = tables[ORDER_LINES].select("order_id", "product_id", "quantity", "unit_price")
    products = tables[PRODUCTS].select(F.col("id").alias("product_id"), "title", "sku")
    return lines.join(products, "product_id", "left")


def orders_enriched(tables: Mapping[str, DataFrame]) -> DataFrame:
    """order_id, customer_id, customer_name, customer_email, status, placed_at, line_count,
    item_count, total_amount, product_titles (sorted, distinct)."""
    per_order = _lines_with_products(tables).groupBy("order_id").agg(
        F.count(F.lit(1)).alias("line_count"),
        F.sum("quantity").cast("long").alias("item_count"),
        F.sum(F.col("quantity") * F.col("unit_price")).alias("total_amount"),
        F.array_sort(F.collect_set("title")).alias("product_titles"),
    )
    customers = tables[CUSTOMERS].select(
        F.col("id").alias("customer_id"), F.col("name").alias("customer_name"), F.col("email").alias("customer_email")
    )
    orders = tables[ORDERS].select(F.col("id").alias("order_id"), "customer_id", "status", "placed_at")
    return (
        orders.join(customers, "customer_id", "left")
        .join(per_order, "order_id", "left")
        .select(
            "order_id",
            "customer_id",
            "customer_name",
            "customer_email",
            "status",
            "placed_at",
            F.coalesce("line_count", F.lit(0)).cast("long").alias("line_count"),
            F.coalesce("item_count", F.lit(0)).cast("long").alias("item_count"),
            F.coalesce("total_amount", F.lit(0).cast(per_order.schema["total_amount"].dataType)).alias("total_amount"),
            F.coalesce("product_titles", F.array().cast("array<string>")).alias("product_titles"),
        )
    )


def search_documents(tables: Mapping[str, DataFrame]) -> DataFrame:
    """doc_id ('order:1', 'product:3'), kind, title, body (the searchable text), data (JSON of the entity)."""
    lines = _lines_with_products(tables)
    orders = tables[ORDERS].select(F.col("id").alias("order_id"), "customer_id", "status")
    customers = tables[CUSTOMERS].select(F.col("id").alias("customer_id"), F.col("name").alias("customer_name"), "email")
    order_products = lines.groupBy("order_id").agg(
        F.array_sort(F.collect_set("title")).alias("products"),
        F.array_sort(F.collect_set("sku")).alias("skus"),
        F.sum(F.col("quantity") * F.col("unit_price")).cast("string").alias("total"),
    )
    order_docs = (
        orders.join(customers, "customer_id", "left")
        .join(order_products, "order_id", "left")
        .select(
            F.concat(F.lit("order:"), F.col("order_id").cast("string")).alias("doc_id"),
            F.lit("order").alias("kind"),
            F.concat(F.lit("Order "), F.col("order_id").cast("string"), F.lit(" for "), F.coalesce("customer_name", F.lit("?"))).alias("title"),
            F.concat_ws(" ", "customer_name", "email", "status", F.concat_ws(" ", "products"), F.concat_ws(" ", "skus")).alias("body"),
            F.to_json(F.struct("order_id", "customer_id", "customer_name", "status", "products", "total"), JSON_OPTIONS).alias("data"),
        )
    )  # fmt: skip
    buyers = (
        lines.join(orders, "order_id")
        .join(customers, "customer_id", "left")
        .groupBy("product_id")
        .agg(F.array_sort(F.collect_set("customer_name")).alias("ordered_by"))
    )
    products = tables[PRODUCTS].select(F.col("id").alias("product_id"), "sku", "title", "price", "tags")
    product_docs = products.join(buyers, "product_id", "left").select(
        F.concat(F.lit("product:"), F.col("product_id").cast("string")).alias("doc_id"),
        F.lit("product").alias("kind"),
        F.col("title"),
        F.concat_ws(" ", "sku", "title", F.concat_ws(" ", "tags"), F.concat_ws(" ", "ordered_by")).alias("body"),
        F.to_json(
            F.struct("product_id", "sku", "title", F.col("price").cast("string").alias("price"), "tags",
                     F.coalesce("ordered_by", F.array().cast("array<string>")).alias("ordered_by")),
            JSON_OPTIONS,
        ).alias("data"),
    )  # fmt: skip
    return order_docs.unionByName(product_docs)
