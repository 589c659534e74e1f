"""Command-line options the benchmarks share."""

from __future__ import annotations

import argparse


def add_producer_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--producer KEY=VALUE``, repeatable: librdkafka settings for ``what``."""
    parser.add_argument(
        "--producer",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"a librdkafka setting for {what} (kafka.producer), e.g. linger.ms=20; repeatable",
    )


def producer_settings(parser: argparse.ArgumentParser, settings: list[str]) -> dict[str, object]:
    """The ``--producer`` settings as a dict (digits as ints); a malformed one ends the command with its usage."""
    out: dict[str, object] = {}
    for setting in settings:
        name, sep, value = setting.partition("=")
        if not sep or not name or not value:
            parser.error(f"--producer {setting!r}: expected KEY=VALUE, e.g. --producer linger.ms=20")
        out[name] = int(value) if value.isdigit() else value
    return out
