"""Rows already in the sink format's bytes, and how a format writes one table's rows so.

A serializer's ``row_rendering(table)`` gives a ``RowRendering``: per column, how its pgoutput text (or its
typed value) becomes the column's encoding within the row, in that format. The row codec (``cdc.render``)
runs it over the decoder's tuples and the snapshot's COPY lines and returns ``RenderedRow``s, which the
serializers write without looking at typed values (``encoded``). Both are the sink's: the bytes are the
format's, and the serializers never need the codec that wrote them.

A rendered row has typed values for its key columns only, readable like a typed row's (``row[name]``,
``row.get(name)``, ``name in row``); asking it for any other column raises TypeError, so code that needs
every value cannot silently take one. Only the serializers look at its bytes, through ``encoded``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdc.event import Row

__all__ = ["Render", "RenderedRow", "RowRendering", "encoded"]

Render = Callable[[bytes], bytes]


class RenderedRow:
    """A row the decoder wrote straight into the sink format's bytes.

    ``data`` is the row exactly as the serializer would write it from the typed values (JSON: the
    object ``{"id":1,"name":"a",...}``; Avro: the binary of the table's Value record), ``key_data``
    the key the same way (JSON: the key object; Avro: the Key record), ``key`` the typed values of
    the key columns (what snapshots compare streamed rows by, and key headers are made of).
    """

    __slots__ = ("data", "key", "key_data")

    def __init__(self, data: bytes, key: Row, key_data: bytes) -> None:
        self.data = data
        self.key = key
        self.key_data = key_data

    def _typed(self, column: str) -> Row:
        if column in self.key:
            return self.key
        raise TypeError(
            f"a rendered row has no typed value for column {column!r}: only its key columns "
            f"({', '.join(self.key)}) have one. The decoder renders only tables whose rows no stage reads "
            "column by column (a bug; please report it)"
        )

    def __getitem__(self, column: str) -> Any:
        return self._typed(column)[column]

    def get(self, column: str, default: Any = None) -> Any:
        return self._typed(column).get(column, default)

    def __contains__(self, column: object) -> bool:
        return str(column) in self._typed(str(column))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RenderedRow):
            return NotImplemented
        return self.data == other.data and self.key == other.key and self.key_data == other.key_data

    __hash__ = None  # type: ignore[assignment]  # mutable like the dicts it stands in for

    def __repr__(self) -> str:
        return f"RenderedRow({self.data!r})"


def encoded(row: object) -> RenderedRow | None:
    """The row as the decoder wrote it in the sink format, or None for a typed row (``dict``)."""
    return row if type(row) is RenderedRow else None


@dataclass(frozen=True, slots=True)
class RowRendering:
    """How the decoder writes one table's rows in the sink format's bytes, given by the format's renderer.

    Per column, in the table's order: ``render[i]`` turns the column's pgoutput text into its
    encoding within the row, or is None, and then the column's typed value (the decoder's
    converter) goes through ``typed[i]``; ``null[i]`` is a NULL's encoding (None: a NULL here
    cannot be rendered, the typed path decides). ``row_format`` joins the columns' encodings
    (``%b`` each, in order). The key columns (``key_index`` are their positions) with a direct
    renderer reuse their rendered encoding (direct types encode keys as values; only a NULL can be
    written differently, as ``key_null``); the others go through ``key_typed``, as a key's encoding
    can differ (keys must be injective).
    Renderers raise ValueError on anything they do not cover; the decoder then takes its typed path.

    ``format`` and ``direct`` are for a compiled codec (``cdc.render.codec``): per column, the direct
    type (``rendering_text.direct_type``) and its parameter (timestamptz: the precision; numeric: the scale), or
    None, which it may write itself in that format instead of calling ``render[i]``, after ``prefix[i]``
    (Avro: a nullable field's union branch); empty: it calls ``render[i]`` for every column.
    """

    names: tuple[str, ...]
    render: tuple[Render | None, ...]
    typed: tuple[Callable[[Any], bytes], ...]
    null: tuple[bytes | None, ...]
    row_format: bytes
    key_index: tuple[int, ...]
    key_typed: tuple[Callable[[Any], bytes], ...]
    key_null: tuple[bytes | None, ...]
    key_format: bytes
    format: str = ""
    direct: tuple[tuple[str, int] | None, ...] = ()
    prefix: tuple[bytes, ...] = ()
