"""The reference row codec: parsers generated per table that write its rows straight in the sink format.

A ``RowRendering`` (``cdc.sink.rendering``: the serializer's ``row_rendering`` gives one per table) says how
to write one table's columns; ``render_parser`` turns it into a parser of the table's pgoutput tuples that
returns a ``RenderedRow`` (the sink's value of a row already in its bytes), and ``render_copy_parser`` and
``render_copy_record`` do the same for the snapshot's ``COPY ... TO STDOUT`` lines. The compiled codec
(``cdc.render._compiled``) writes the same bytes; ``cdc.render.codec`` builds the one ``cdc.compiled`` chose.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

from cdc.decoder.rows import Decline, RowParser
from cdc.sink.rendering import RenderedRow, RowRendering

__all__ = ["CopyRecord", "CopyRowParser", "render_copy_parser", "render_copy_record", "render_parser"]

CopyRowParser = Callable[[bytes | bytearray | memoryview], "RenderedRow"]
"""A line of ``COPY ... TO STDOUT`` in text format (its newline optional) -> its ``RenderedRow``; raises
``Decline`` (or what a converter or renderer raises) where the typed path must take the row."""
CopyRecord = Callable[[bytes | bytearray | memoryview, bytes, bytes, bytes, bytes], tuple[bytes, bytes]]
"""``record(line, key_head, key_end, value_head, value_end)``: a COPY line's record, ``(key_head + key + key_end,
value_head + row + value_end)``, with the key and row its ``CopyRowParser`` writes."""

_U32: Final = struct.Struct(">I")


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
