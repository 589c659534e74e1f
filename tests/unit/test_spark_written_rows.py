"""``warehouse.written_rows`` reads the latest commit's ``numOutputRows`` from the Delta log file itself (#39)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("delta")

from cdc_views.warehouse import written_rows  # noqa: E402 - after the skips: importing it needs pyspark and delta


def _commit(log: Path, version: int, *actions: dict[str, Any]) -> None:
    log.mkdir(parents=True, exist_ok=True)
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


class _NoSpark:
    """A session that fails when used: the count must come from the log, not from a read of the table."""

    @property
    def read(self) -> Any:
        raise AssertionError("written_rows read the table instead of the commit file")


def test_the_latest_commit_s_output_rows_are_read_from_its_file(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    _commit(
        log, 0, {"protocol": {}}, {"commitInfo": {"operation": "WRITE", "operationMetrics": {"numOutputRows": "7"}}}
    )
    _commit(
        log, 1, {"commitInfo": {"operation": "MERGE", "operationMetrics": {"numOutputRows": "231493"}}}, {"add": {}}
    )
    (log / "00000000000000000001.crc").write_text("{}")  # beside the commits: not one of them
    (log / "_staged_commits").mkdir()

    assert written_rows(_NoSpark(), tmp_path) == 231493  # type: ignore[arg-type]


def test_a_commit_without_the_metric_falls_back_to_counting_the_table(tmp_path: Path) -> None:
    _commit(tmp_path / "_delta_log", 0, {"commitInfo": {"operation": "WRITE", "operationMetrics": {}}})

    with pytest.raises(AssertionError, match="read the table"):
        written_rows(_NoSpark(), tmp_path)  # type: ignore[arg-type]
