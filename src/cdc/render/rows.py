"""Rows written straight in the sink format, and the generated parsers that write them.

A ``RowRendering`` (made by a format's renderer, ``cdc.render.json`` or
``cdc.render.avro``) says how to write one table's columns; ``render_parser``
turns it into a parser of the table's pgoutput tuples that returns a
``RenderedRow`` (the reference codec; ``cdc.render.codec`` chooses it or the
compiled one, and holds ``TableRenderer``, the decoder's ``RowRenderer``).

A rendered row has typed values for its key columns only, readable like a typed
row's (``row[name]``, ``row.get(name)``, ``name in row``); asking it for any other
column raises TypeError, so code that needs every value cannot silently take one.
Only the serializers look at its bytes, through ``encoded``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cdc.decoder.rows import Decline, RowParser
from cdc.event import Row

Render = Callable[[bytes], bytes]

CopyRowParser = Callable[[bytes | bytearray | memoryview], "RenderedRow"]
"""A line of ``COPY ... TO STDOUT`` in text format (its newline optional) -> its ``RenderedRow``; raises
``Decline`` (or what a converter or renderer raises) where the typed path must take the row."""
CopyRecord = Callable[[bytes | bytearray | memoryview, bytes, bytes, bytes, bytes], tuple[bytes, bytes]]
"""``record(line, key_head, key_end, value_head, value_end)``: a COPY line's record, ``(key_head + key + key_end,
value_head + row + value_end)``, with the key and row its ``CopyRowParser`` writes."""

_U32: Final = struct.Struct(">I")


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
    type (``text.direct_type``) and its parameter (timestamptz: the precision; numeric: the scale), or
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


def render_parser(rendering: RowRendering, parsers: Sequence[Callable[[bytes], Any]]) -> RowParser:
    """A parser generated for one relation that returns a ``RenderedRow``: the row and its key in the sink
    format's bytes, and the key's typed values. A column with a direct renderer goes from its text to its
    encoding; any other is parsed to its typed value first (the same value the typed path makes) and
    written by ``rendering.typed``. Renderers raise ValueError on text they do not cover, and a NULL the
    format cannot render here raises ``Decline``: either sends the whole message to the general path."""
    names = rendering.names
    count = len(names)
    keys = dict(zip(rendering.key_index, range(len(rendering.key_index)), strict=True))  # column -> key position
    namespace: dict[str, Any] = {
        "Slow": Decline,
        "u32": _U32.unpack_from,
        "Row": RenderedRow,
        "fmt": rendering.row_format,
        "kfmt": rendering.key_format,
    }
    lines = [
        f"    if buf[pos] != {count >> 8} or buf[pos + 1] != {count & 0xFF}:",
        "        raise Slow",
        "    pos += 2",
    ]
    key_parts: list[str] = []
    for i in range(count):
        direct = rendering.render[i]
        null = rendering.null[i]
        j = keys.get(i)
        namespace[f"c{i}"] = parsers[i]
        namespace[f"t{i}"] = rendering.typed[i]
        namespace[f"n{i}"] = null
        lines += [
            "    kind = buf[pos]",
            "    if kind == 116:",
            "        start = pos + 5",
            "        pos = start + u32(buf, pos + 1)[0]",
        ]
        if direct is not None:
            namespace[f"r{i}"] = direct
            if j is None:
                lines.append(f"        v{i} = r{i}(buf[start:pos])")
            else:
                lines += [f"        x{i} = buf[start:pos]", f"        v{i} = r{i}(x{i})", f"        k{i} = c{i}(x{i})"]
        else:
            lines += [f"        k{i} = c{i}(buf[start:pos])", f"        v{i} = t{i}(k{i})"]
        lines.append("    elif kind == 110:")
        lines.append(f"        v{i} = n{i}" if null is not None else "        raise Slow")
        if j is not None:
            lines.append(f"        k{i} = None")
        lines += ["        pos += 1", "    else:", "        raise Slow"]
        if j is not None:
            key_null = rendering.key_null[j]
            if direct is not None and key_null == null:
                key_parts.append(f"v{i}")  # the same encoding as in the row
            elif direct is not None and key_null is not None:
                # A direct type's key encoding is its value encoding; only a NULL differs (a NOT NULL
                # column's row NULL is its fallback text, the key's is null): no second encoding per row.
                namespace[f"kn{j}"] = key_null
                key_parts.append(f"(kn{j} if k{i} is None else v{i})")
            else:
                namespace[f"kt{j}"] = rendering.key_typed[j]
                namespace[f"kn{j}"] = key_null
                if key_null is None:
                    lines += [f"    if k{i} is None:", "        raise Slow"]
                    key_parts.append(f"kt{j}(k{i})")
                else:
                    key_parts.append(f"(kn{j} if k{i} is None else kt{j}(k{i}))")
    key_names = [names[i] for i in rendering.key_index]
    values = ", ".join(f"v{i}" for i in range(count)) + ("," if count == 1 else "")
    typed_key = "{" + ", ".join(f"{n!r}: k{i}" for n, i in zip(key_names, rendering.key_index, strict=True)) + "}"
    key_values = ", ".join(key_parts) + ("," if len(key_parts) == 1 else "")
    lines.append(f"    return Row(fmt % ({values}), {typed_key}, kfmt % ({key_values})), pos")
    params = "".join(f", {name}={name}" for name in namespace)
    source = "\n".join([f"def parse(buf, pos{params}):", *lines])
    exec(source, namespace)
    parse: RowParser = namespace["parse"]
    parse.rendered = True  # type: ignore[attr-defined]  # the relation log says which path a table takes
    return parse


def render_copy_parser(
    rendering: RowRendering, parsers: Sequence[Callable[[bytes], Any]], unescape: Callable[[bytes], bytes]
) -> CopyRowParser:
    """The reference of the compiled codec's ``copy_row``: a parser of one table's ``COPY ... TO STDOUT`` text
    lines into the ``RenderedRow`` that ``render_parser`` makes of the same values' pgoutput tuple. The line is
    rewritten as that tuple (a field's text is pgoutput's once ``unescape`` removed COPY's escapes; ``\\N`` is
    a NULL) and parsed by it; a line without one field per column raises ``Decline``."""
    parse = render_parser(rendering, parsers)
    count = len(rendering.names)
    head = bytes((count >> 8, count & 0xFF))
    pack = _U32.pack

    def parse_line(line: bytes | bytearray | memoryview) -> RenderedRow:
        text = bytes(line)
        if text.endswith(b"\n"):
            text = text[:-1]
        fields = text.split(b"\t")
        if len(fields) != count:
            raise Decline
        parts = [head]
        for field in fields:
            if field == b"\\N":
                parts.append(b"n")
                continue
            if b"\\" in field:
                field = unescape(field)
            parts.append(b"t" + pack(len(field)) + field)
        row: RenderedRow = parse(b"".join(parts), 0)[0]
        return row

    return parse_line


def render_copy_record(
    rendering: RowRendering, parsers: Sequence[Callable[[bytes], Any]], unescape: Callable[[bytes], bytes]
) -> CopyRecord:
    """The reference of the compiled codec's ``copy_record``: ``render_copy_parser``'s row and key between the
    record's constant parts."""
    parse = render_copy_parser(rendering, parsers, unescape)

    def record(
        line: bytes | bytearray | memoryview, key_head: bytes, key_end: bytes, value_head: bytes, value_end: bytes
    ) -> tuple[bytes, bytes]:
        row = parse(line)
        return key_head + row.key_data + key_end, value_head + row.data + value_end

    return record
