"""The ``cdc`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import structlog

from cdc import log as logsetup

log = structlog.get_logger("cdc")


def _cmd_run(args: argparse.Namespace) -> int:
    from cdc.pipeline import run

    return run(Path(args.config))


def _cmd_validate(args: argparse.Namespace) -> int:
    """The file, then (unless --offline) every check ``cdc run`` makes before it creates anything, with
    the same messages: 0 valid, 1 a problem in the database or the services, 2 a bad file."""
    from cdc.catalog import StartupError
    from cdc.config import ConfigError, load_config
    from cdc.pipeline.checks import connect_source, service_problems, source_checks

    try:
        config = load_config(args.file)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    patterns = [t for t in config.tables if t.name is None]
    print(
        f"{args.file}: the file is valid ({len(config.tables)} tables, {len(patterns)} of them patterns, "
        f"topic prefix {config.topic_prefix})"
    )
    if args.offline:
        print("  --offline: the database, Kafka and the schema registry were not checked")
        return 0
    from cdc.pipeline.toast import toast_exposure, toast_mode

    try:
        with connect_source(config, "cdc-validate") as conn:
            checked = source_checks(conn, config)
            exposures = toast_exposure(conn, checked.tables, lambda name: toast_mode(checked.config, name))
    except (StartupError, ConfigError) as e:
        print(str(e), file=sys.stderr)
        return 1
    if config.spark.views or config.spark.indexes:
        from cdc.declared import DeclarationError, check_declarations

        try:
            check_declarations(config.spark, {name: info.columns for name, info in checked.tables.items()})
        except DeclarationError as e:
            print(str(e), file=sys.stderr)
            return 1
    for selector, names in checked.selection.expanded.items():
        print(f"  {selector} -> {', '.join(names) or '(nothing yet: allow_empty)'}")
    for exposure in exposures:
        print(f"  unchanged TOAST: {exposure.describe()}")
    for selector, names in checked.selection.named_over_pattern.items():
        print(f"  {selector} also matches {', '.join(names)}: named in 'tables', so those entries' settings apply")
    problems = service_problems(checked.config)
    if config.source.slot_failover is not False:
        from cdc.failover import FailoverWatch, setup_problems

        conninfo = config.source.conninfo()
        if FailoverWatch.wanted(conninfo):  # several hosts: the operator expects the slot to survive a failover
            failover_problems, notes = setup_problems(conninfo)
            problems += failover_problems
            for note in notes:
                print(f"  {note}")
            if not failover_problems and not notes:
                print("  failover: every standby synchronizes the slot; the primary waits for them")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    publication = checked.publication
    shape = "to be created" if publication.current is None else "in shape" if publication.in_place else "to be altered"
    print(
        f"  database: {len(checked.tables)} tables ready to capture, publication {publication.name} {shape}, "
        f"slot {config.source.slot} {checked.slot_state.value}"
    )
    print(
        f"  kafka: {config.kafka.bootstrap_servers} reachable"
        + (", schema registry reachable" if config.format == "avro" else "")
    )
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from cdc import status
    from cdc.config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    st = status.collect(config)
    print(json.dumps(st, default=str) if args.json else status.render(st))
    return 0 if status.healthy(st) else 1


def _cmd_config_reference(args: argparse.Namespace) -> int:
    from cdc.reference import render_reference

    sys.stdout.write(render_reference())
    return 0


def _cmd_search(args: argparse.Namespace) -> int:
    """Query a search index the Spark jobs built (spark/ must be beside the package: a checkout)."""
    spark_dir = Path(__file__).resolve().parents[2] / "spark"
    sys.path.insert(0, str(spark_dir))
    from cdc_views import declared  # spark/ (on mypy_path; at run time on sys.path)

    fields = [f.strip() for f in args.fields.split(",")] if args.fields else None
    warehouse = Path(args.warehouse)
    try:
        path = declared.index_path(warehouse, args.index) if args.index else declared.default_index(warehouse)
        hits = declared.search(path, args.query, args.limit, fields)
    except (LookupError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for hit in hits:
        if args.json:
            print(json.dumps(hit, ensure_ascii=False, default=str))
        else:
            rest = "  ".join(f"{k}={v}" for k, v in hit.items() if k not in ("id", "score"))
            print(f"{hit['score']:6.2f}  {hit['id']:<16} {rest}")
    return 0


def _cmd_dev(args: argparse.Namespace) -> int:
    from cdc import dev

    if args.pg:
        os.environ["CDC_PG"] = args.pg  # read by cdc.dev.postgres
    state = Path(args.state) if args.state else dev.default_state_dir()
    if args.action == "up":
        endpoints = dev.up(state, registry=not args.no_registry)
        shown = dev.status(state) if args.json else dict(endpoints.__dict__)
        if args.with_prometheus:
            from cdc.dev import prometheus

            shown["prometheus_url"] = prometheus.up(state / "prometheus", [args.metrics_target])
        print(json.dumps(shown, indent=2))
    elif args.action == "down":
        from cdc.dev import prometheus

        prometheus.down(state / "prometheus")
        dev.down(state)
    else:
        st = dev.status(state)
        if args.json:
            print(json.dumps(st))
        else:
            for key, value in st.items():
                print(f"{key}: {value}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from cdc.demo import main as demo_main

    return demo_main(keep_services=args.keep_services)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdc", description="PostgreSQL change data capture to Kafka")
    parser.add_argument("--log-format", choices=["auto", "json", "console"], default="auto")
    parser.add_argument("--log-level", default="info")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="stream changes from Postgres to Kafka")
    p.add_argument("--config", "-c", required=True, help="YAML configuration file")
    p.set_defaults(func=_cmd_run)

    from cdc.snapshot.signals import add_cli as add_snapshot_cli

    add_snapshot_cli(sub)  # cdc snapshot --config FILE TABLE...

    p = sub.add_parser(
        "validate",
        help="check a configuration file, then everything `cdc run` checks before it creates anything (tables, keys, "
        "replica identity, privileges, publication, Kafka, registry), with the same messages",
    )
    p.add_argument("file")
    p.add_argument("--offline", action="store_true", help="check the file only: connect to nothing")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser(
        "config-reference", help="print the Markdown reference of every configuration key (docs/configuration.md)"
    )
    p.set_defaults(func=_cmd_config_reference)

    p = sub.add_parser("status", help="the slot, its lag, the confirmed position and per-table record counts")
    p.add_argument("--config", "-c", required=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("search", help="query the full-text index the Spark jobs built")
    p.add_argument("query")
    p.add_argument("--warehouse", required=True, help="the warehouse folder the Spark jobs wrote")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--index", help="a declared index (spark.indexes in cdc.yaml); default: the only one built")
    p.add_argument("--fields", help="comma-separated fields to show of each hit (default: every stored one)")
    p.add_argument("--json", action="store_true", help="one JSON object per hit")
    p.set_defaults(func=_cmd_search)

    p = sub.add_parser("dev", help="local Postgres, Kafka and schema registry for development and tests")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.add_argument("--state", help="state folder (default: .cdc-dev in the repository, or $CDC_DEV_STATE)")
    p.add_argument("--no-registry", action="store_true", help="do not start the schema registry")
    p.add_argument(
        "--with-prometheus",
        action="store_true",
        help=(
            "also run Prometheus (Debian's package, cached by scripts/prometheus.sh) with deploy/observability's rules"
        ),
    )
    p.add_argument(
        "--metrics-target", default="127.0.0.1:8080", help="the daemon's http.host:http.port Prometheus scrapes"
    )
    p.add_argument(
        "--pg",
        choices=["15", "16", "17", "18"],
        help="PostgreSQL major version (default: $CDC_PG, else 15); one state folder per version (--state)",
    )
    p.set_defaults(func=_cmd_dev)

    p = sub.add_parser("demo", help="run the end-to-end demo on local services")
    p.add_argument("--keep-services", action="store_true", help="leave Postgres and Kafka running afterwards")
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logsetup.configure(args.log_format, args.log_level)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
