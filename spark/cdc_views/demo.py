"""The demo's Spark step: rebuild every table and the declared views and indexes from the topics the
connector filled, verify them against the database, and search one declared index."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import structlog

from cdc.declared import SparkSection
from cdc_views import declared
from cdc_views.jobs import JobConfig, rebuild
from cdc_views.reader import KafkaSource
from cdc_views.session import build_session
from cdc_views.tables import Encoding, read_shapes
from cdc_views.verify import verify

log = structlog.get_logger("cdc_views.demo")


def rebuild_and_verify(
    bootstrap: str,
    dsn: str,
    topic_prefix: str,
    tables: Sequence[str],
    workdir: Path | str,
    *,
    section: SparkSection,
    query: str,
    index: str | None = None,
    encoding: Encoding | None = None,
) -> str:
    """Rebuild the warehouse and the views and indexes of ``section`` under ``workdir/warehouse`` from
    offset 0, compare them with the database, run ``query`` on ``index`` (default: the first declared);
    a printable summary.

    The summary's last verification line says whether every view matches; it starts a local
    SparkSession (local[2]) and stops it before returning.
    """
    if not section.indexes:
        raise ValueError("the demo searches a declared index: the declarations have none (spark.indexes)")
    searched = index or section.indexes[0].name
    if searched not in [i.name for i in section.indexes]:
        raise ValueError(f"the demo searches index {searched}, which is not declared")
    spark = build_session("cdc-demo", quick_start=True)
    try:
        cfg = JobConfig(
            KafkaSource(bootstrap),
            topic_prefix,
            read_shapes(dsn, list(tables)),
            Path(workdir).resolve() / "warehouse",
            encoding or Encoding(),
            declared=section,
        )
        summary = rebuild(spark, cfg)
        report = verify(dsn, cfg.warehouse, cfg.tables, spark=spark, encoding=cfg.encoding, declared_section=section)
        hits = declared.search(declared.index_path(cfg.warehouse, searched), query, limit=5)
    finally:
        spark.stop()
    shown = next(i for i in section.indexes if i.name == searched)
    title = next(iter(shown.text))  # its first text field: what a hit is shown by
    lines = [
        f"=== Spark: views rebuilt from offset 0 in {summary['seconds']}s, under {cfg.warehouse} ===",
        *(f"  {name}: {value} keys written" for name, value in summary.items() if name.startswith(("table ", "view "))),
        *(f"  {name}: {value} documents" for name, value in summary.items() if name.startswith("index ")),
        "",
        "=== verification against the database ===",
        report.render(),
        "",
        f"=== search {query!r} in index {searched} ===",
        *(f"  {h['score']:6.2f}  {h['id']:<12} {h.get(title, '')}" for h in hits),
    ]
    if not hits:
        lines.append("  (no match)")
    return "\n".join(lines)
