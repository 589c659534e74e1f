"""The server versions with PostgreSQL's publication race (fixed by commit 4909b38af0, May 2025)."""

from __future__ import annotations

from cdc.catalog import publication_race_fix


def test_the_versions_with_the_publication_race_are_named() -> None:
    assert publication_race_fix(160002) == "16.9"
    assert publication_race_fix(160009) is None
    assert publication_race_fix(150012) == "15.13"
    assert publication_race_fix(150018) is None
    assert publication_race_fix(170004) == "17.5"
    assert publication_race_fix(180000) is None
