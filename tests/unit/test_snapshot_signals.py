"""``cdc snapshot TABLE...``: the command that asks the daemon for a snapshot while streaming."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from cdc.snapshot.signals import add_cli


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cdc")
    add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "cdc.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "source": {
                    "dsn": "host=127.0.0.1 port=1 dbname=shop user=cdc connect_timeout=2",
                    "slot": "s",
                    "publication": "p",
                },
                "tables": ["public.orders", "customers"],
                "kafka": {"bootstrap_servers": "127.0.0.1:1"},
                "topic_prefix": "shop",
            }
        )
    )
    return path


def test_a_table_the_configuration_does_not_capture_is_refused_before_anything_is_written(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["snapshot", "--config", str(config), "public.orders", "public.nope"]) == 2
    err = capsys.readouterr().err
    assert "not captured by this configuration: public.nope" in err
    assert "captured: public.customers, public.orders" in err


def test_an_unreachable_database_is_reported_with_the_signal_table_it_wanted_to_write(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["snapshot", "--config", str(config), "customers"]) == 1
    assert "cannot write the snapshot signal into public.cdc_signal" in capsys.readouterr().err


def test_an_invalid_configuration_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("source: {}\n")
    assert run(["snapshot", "--config", str(bad), "public.t"]) == 2
    assert "source.dsn" in capsys.readouterr().err
