"""The decoder's seam for its fast path: who may write a table's rows for it, and how a parser declines.

The decoder parses each relation's tuples with a parser generated for it. By
default that parser makes typed rows (``dict`` of column name to typed value).
A ``RowRenderer`` handed to the decoder may instead give, per table, a parser
that writes rows straight in the sink format; the decoder does not know that
format and never looks inside what such a parser returns (``cdc.render`` owns
the one implementation). A parser declines a tuple it cannot handle by raising
``Decline``; the decoder then decodes the message on its general path, which
makes typed rows and raises the precise error for malformed input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from cdc.event import TableSchema

RowParser = Callable[[bytes, int], tuple[Any, int]]
"""``parse(buffer, position) -> (row, position after the tuple)``."""


class Decline(Exception):
    """Raised by a fast-path parser: this tuple goes to the general path."""


class RowRenderer(Protocol):
    def parser(self, table: TableSchema, converters: Sequence[Callable[[bytes], Any]]) -> RowParser | None:
        """A parser of ``table``'s tuple data that returns its rows in the sink format, or None: typed rows.

        ``converters[i]`` turns column i's text into its typed value, as the general path does. Asked
        once per Relation message, and for every known table again after ``set_renderer``."""
        ...
