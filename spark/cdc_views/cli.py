"""Command line of the jobs: ``python -m cdc_views COMMAND`` or ``spark-submit spark/<job>.py``.

Commands:
    rebuild   the batch job: views rebuilt from every topic's offset 0 (``--views`` picks some)
    stream    the continuous job (``--available-now`` processes what is there, then stops)
    verify    compare the views with the source database; exit 1 on differences
    search    query a declared search index
    jars      fetch the Spark job jars into the cache (what scripts/fetch-spark-jars.sh runs)

Where the topics are, which tables, and how values were written come from the connector's own
configuration (``--config cdc.yaml``: kafka.bootstrap_servers, topic_prefix, tables and their keys,
source.dsn with its password, format, the json or avro section, schema_registry), or from the
individual options, which win. Format avro (``--format avro --registry URL``) reads the
Confluent wire format with the writer schemas from the registry (see ``cdc_views.avro``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import structlog

from cdc_views.jars import FetchFailed, JarsMissing

log = structlog.get_logger("cdc_views.cli")


def _config_defaults(path: str | None) -> dict[str, Any]:
    """Settings from the connector's YAML configuration (validated by the connector's own model)."""
    if path is None:
        return {}
    from cdc.config import load_config

    cfg = load_config(path)
    if any(t.name is None for t in cfg.tables):  # pattern entries: the tables they select in the database now
        import psycopg

        from cdc.catalog import StartupError, expand_config

        try:
            with psycopg.connect(cfg.source.conninfo(application_name="cdc-views"), autocommit=True) as conn:
                cfg = expand_config(conn, cfg)[0]
        except (psycopg.Error, StartupError) as e:
            raise SystemExit(f"error: cannot expand the table patterns of {path}: {str(e).strip()}") from None
    values = cfg.avro_format if cfg.format == "avro" else cfg.json_format
    return {
        "bootstrap": cfg.kafka.bootstrap_servers,
        "kafka_settings": {
            k: str(v) for k, v in cfg.kafka.producer.items() if k.startswith(("security.", "sasl.", "ssl."))
        },
        "topic_prefix": cfg.topic_prefix,
        "tables": [t.name for t in cfg.tables],
        "keys": {t.name: list(t.key) for t in cfg.tables if t.key},
        "dsn": cfg.source.conninfo(),
        "format": cfg.format,
        "registry": cfg.schema_registry,
        "decimal_handling": values.decimal_handling,
        "time_precision": values.time_precision,
        "interval_handling": values.interval_handling,
        "schemas_enable": cfg.json_format.schemas_enable if cfg.format == "json" else False,
        "declared": cfg.spark,
        # the connector's toast.placeholder (a connector without the toast section writes Debezium's)
        "unavailable_value": getattr(getattr(cfg, "toast", None), "placeholder", None),
    }


def _common(p: argparse.ArgumentParser, *, kafka: bool = True) -> None:
    p.add_argument("--config", help="the connector's YAML configuration (cdc.yaml): the defaults of everything below")
    p.add_argument("--dsn", help="source database (column types are read from its catalog)")
    p.add_argument("--tables", help="comma-separated schema.table list (default: the configuration's tables)")
    p.add_argument("--warehouse", required=True, type=Path, help="the views' directory (tables/, views/, search/)")
    p.add_argument("--decimal-handling", choices=["precise", "string", "double"])
    p.add_argument("--time-precision", choices=["adaptive", "iso"])
    p.add_argument("--interval-handling", choices=["numeric", "string"])
    p.add_argument("--master", help="Spark master (default $CDC_SPARK_MASTER or local[2])")
    if kafka:
        p.add_argument("--bootstrap", help="Kafka bootstrap servers")
        p.add_argument("--topic-prefix")
        p.add_argument("--format", choices=["json", "avro"], help="how the connector wrote the records (default json)")
        p.add_argument(
            "--registry",
            help="format avro: the schema registry's Confluent-compatible URL "
            "(Apicurio: http://host:8080/apis/ccompat/v7)",
        )
        p.add_argument(
            "--on-bad-record",
            choices=["fail", "skip"],
            default="fail",
            help="a record that does not decode, or an unchanged-TOAST placeholder whose previous value neither the "
            "topic nor the warehouse holds: fail the job (default) or skip it (counted and logged; a "
            "placeholder's column is written as null)",
        )
        p.add_argument(
            "--unavailable-value-placeholder",
            dest="unavailable_value",
            metavar="TEXT",
            help="what the connector wrote for an unchanged TOASTed value (its toast.placeholder; default "
            "the configuration's, else Debezium's __debezium_unavailable_value): replaced by the key's "
            "previous value, never written to a view",
        )
        p.add_argument(
            "--views",
            default="warehouse,declared",
            help="comma-separated: warehouse (a Delta table per captured table), declared (spark.views and "
            "spark.indexes, or a file spark.file names)",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cdc_views", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _common(sub.add_parser("rebuild", help="rebuild the views from offset 0"))
    stream = sub.add_parser("stream", help="keep the views up to date (Structured Streaming)")
    _common(stream)
    stream.add_argument("--available-now", action="store_true", help="process what is in the topics, then stop")
    stream.add_argument("--interval", type=float, default=2.0, help="seconds between micro-batches")
    stream.add_argument("--timeout", type=float, help="stop after this many seconds (default: run until interrupted)")
    _common(sub.add_parser("verify", help="compare the views with the source database"), kafka=False)
    query = sub.add_parser("search", help="query a declared search index")
    query.add_argument("--warehouse", required=True, type=Path)
    query.add_argument("--limit", type=int, default=10)
    query.add_argument(
        "--index", help="a declared index (spark.indexes); default: the only one under <warehouse>/search"
    )
    query.add_argument("--fields", help="comma-separated fields to show of each hit (default: all stored)")
    query.add_argument("query")
    sub.add_parser("jars", help="fetch the job jars into the cache")
    return parser


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    merged = _config_defaults(args.config)
    for name in (
        "dsn",
        "bootstrap",
        "topic_prefix",
        "decimal_handling",
        "time_precision",
        "interval_handling",
        "format",
        "unavailable_value",
    ):
        value = getattr(args, name, None)
        if value is not None:
            merged[name] = value
    if getattr(args, "registry", None):
        from cdc.sink.registry import RegistrySettings

        configured = merged.get("registry")  # its credentials and TLS settings stay; the URL is validated again
        merged["registry"] = RegistrySettings.model_validate(
            {**(configured.model_dump() if configured else {}), "url": args.registry}
        )
    if args.tables:
        merged["tables"] = [t.strip() for t in args.tables.split(",") if t.strip()]
    missing = [n for n in ("dsn", "tables") if not merged.get(n)]
    if args.command in ("rebuild", "stream"):
        missing += [n for n in ("bootstrap", "topic_prefix") if not merged.get(n)]
    if args.command in ("rebuild", "stream") and merged.get("format") == "avro" and not merged.get("registry"):
        missing.append("registry")
    if missing:
        raise SystemExit(
            f"error: missing {', '.join('--' + m.replace('_', '-') for m in missing)} (or give --config cdc.yaml)"
        )
    return merged


def _job_config(args: argparse.Namespace, settings: dict[str, Any]) -> Any:
    from cdc_views.jobs import JobConfig
    from cdc_views.reader import KafkaSource
    from cdc_views.tables import read_shapes

    shapes = read_shapes(settings["dsn"], settings["tables"], settings.get("keys"))
    return JobConfig(
        source=KafkaSource(settings["bootstrap"], settings.get("kafka_settings", {})),
        topic_prefix=settings["topic_prefix"],
        tables=shapes,
        warehouse=args.warehouse.resolve(),
        encoding=_encoding(settings),
        on_bad_record=args.on_bad_record,
        registry=settings.get("registry"),
        **({"declared": settings["declared"]} if settings.get("declared") is not None else {}),
    )


def _encoding(settings: dict[str, Any]) -> Any:
    from cdc_views.tables import Encoding

    defaults = Encoding()
    return Encoding(
        decimal_handling=settings.get("decimal_handling") or defaults.decimal_handling,
        time_precision=settings.get("time_precision") or defaults.time_precision,
        interval_handling=settings.get("interval_handling") or defaults.interval_handling,
        schemas_enable=bool(settings.get("schemas_enable", False)),
        format=settings.get("format") or defaults.format,
        unavailable_value=settings.get("unavailable_value") or defaults.unavailable_value,
    )


def _session(args: argparse.Namespace, name: str) -> Any:
    from cdc_views.session import build_session

    return build_session(name, master=args.master)


def _cmd_rebuild(args: argparse.Namespace) -> int:
    from cdc_views.jobs import rebuild

    settings = _settings(args)
    cfg = _job_config(args, settings)
    wanted = [v.strip() for v in args.views.split(",") if v.strip()]
    summary = rebuild(_session(args, "cdc-rebuild"), cfg, cast(Any, wanted))
    print(json.dumps(summary, indent=2, default=str))
    return 0


def _cmd_stream(args: argparse.Namespace) -> int:
    from cdc_views.jobs import start_continuous

    settings = _settings(args)
    cfg = _job_config(args, settings)
    wanted = [v.strip() for v in args.views.split(",") if v.strip()]
    spark = _session(args, "cdc-stream")
    query = start_continuous(
        spark, cfg, available_now=args.available_now, interval_s=args.interval, wanted=cast(Any, wanted)
    )
    started = time.monotonic()
    try:
        while query.isActive:
            query.awaitTermination(5)
            if args.timeout is not None and time.monotonic() - started > args.timeout:
                log.info("stream.timeout_stop", seconds=args.timeout)
                query.stop()
    except KeyboardInterrupt:
        log.info("stream.interrupted")
        query.stop()
    if query.exception() is not None:
        print(f"error: {query.exception()}", file=sys.stderr)
        return 1
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from cdc_views.tables import read_shapes
    from cdc_views.verify import verify

    settings = _settings(args)
    shapes = read_shapes(settings["dsn"], settings["tables"], settings.get("keys"))
    report = verify(
        settings["dsn"],
        args.warehouse,
        shapes,
        spark=_session(args, "cdc-verify"),
        encoding=_encoding(settings),
        declared_section=settings.get("declared"),
    )
    print(report.render())
    return 0 if report.ok else 1


def _cmd_search(args: argparse.Namespace) -> int:
    from cdc_views import declared

    path = declared.index_path(args.warehouse, args.index) if args.index else declared.default_index(args.warehouse)
    fields = [f.strip() for f in args.fields.split(",")] if args.fields else None
    try:
        hits = declared.search(path, args.query, args.limit, fields)
    except ValueError as exc:  # a query tantivy cannot parse
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for hit in hits:
        print(json.dumps(hit, ensure_ascii=False, default=str))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from cdc.log import configure

    configure()
    try:
        if args.command == "jars":
            from cdc_views.jars import main as jars_main

            return jars_main(["fetch"])
        handlers = {"rebuild": _cmd_rebuild, "stream": _cmd_stream, "verify": _cmd_verify, "search": _cmd_search}
        return handlers[args.command](args)
    except (JarsMissing, FetchFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from cdc.declared import DeclarationError
        from cdc_views.reader import ReadError
        from cdc_views.tables import CatalogError
        from cdc_views.toast import UnresolvedPlaceholders

        if isinstance(exc, ReadError | CatalogError | DeclarationError | LookupError | UnresolvedPlaceholders):
            print(f"error: {exc}", file=sys.stderr)
            return 1
        raise
