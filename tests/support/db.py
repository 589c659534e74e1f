"""Small typed helpers for the tests' SQL."""

from __future__ import annotations

from typing import Any

import psycopg


def scalar(cursor: psycopg.Cursor[Any]) -> Any:
    """The first column of the query's one row; fails the test when the query returned none."""
    row = cursor.fetchone()
    assert row is not None, "the query returned no row"
    return row[0]
