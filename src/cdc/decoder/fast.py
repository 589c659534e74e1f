"""The decoder's fast path for row changes: the typed rows' generated parser (``row_parser``), and the loader of
its compiled form (``cdc.decoder._changes``, chosen in ``ChangeDecoder.__init__``)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from cdc.compiled import reference_forced
from cdc.decoder.rows import Decline, RowParser

_U32: Final = struct.Struct(">I")


def compiled_fast_changes() -> Any:
    """``cdc.decoder._changes.FastChanges``, or None: not built, or the reference forced (``CDC_PURE_PYTHON``)."""
    if reference_forced():
        return None
    try:
        from cdc.decoder._changes import FastChanges
    except ImportError:
        return None
    return FastChanges


def row_parser(names: tuple[str, ...], converters: list[Callable[[bytes], Any]]) -> RowParser:
    """A function reading one tuple (text and NULL columns only) into a row, generated for one relation.

    ``parse(buf, pos)`` reads the TupleData at ``pos`` (its column count) and returns the row and
    the offset after it: the column loop unrolled, the converters bound as locals, several times
    faster than TupleData plus a loop. It raises ``Decline`` on what it does not handle (unchanged
    TOAST, binary columns, another column count). Bounds are checked once: lengths are read
    unsigned, so a bad one overshoots, and the next column's type byte then raises IndexError, or
    the offset returned is past the end, which the caller checks.
    """
    count = len(names)
    params = "".join(f", c{i}=c{i}" for i in range(count))
    lines = [
        f"def parse(buf, pos, Slow=Slow, u32=u32{params}):",
        f"    if buf[pos] != {count >> 8} or buf[pos + 1] != {count & 0xFF}:",
        "        raise Slow",
        "    pos += 2",
    ]
    for i in range(count):
        lines += [
            "    kind = buf[pos]",
            "    if kind == 116:",  # 't'
            "        start = pos + 5",
            "        pos = start + u32(buf, pos + 1)[0]",
            f"        v{i} = c{i}(buf[start:pos])",
            "    elif kind == 110:",  # 'n'
            f"        v{i} = None",
            "        pos += 1",
            "    else:",
            "        raise Slow",
        ]
    lines.append("    return {" + ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names)) + "}, pos")
    namespace: dict[str, Any] = {"Slow": Decline, "u32": _U32.unpack_from}
    namespace.update({f"c{i}": convert for i, convert in enumerate(converters)})
    exec("\n".join(lines), namespace)
    parse: RowParser = namespace["parse"]
    return parse
