"""The decoder's fast path for row changes: the typed rows' generated parser (``row_parser``) and the Python
reference of the fast path (``FastChangesReference``), whose compiled form is ``cdc.decoder._changes``.

Both are called the same way, ``fast(kind, buf, at, lsn)``: an Insert, Update or Delete of a known relation
parsed and converted in one pass and made into its ``ChangeEvent``, or None where the general path must decode
it. Both work on the public ``TxState`` (``cdc.decoder.state``) and nothing else of the decoder. The decoder is
handed the compiled class when it is built (``cdc.compiled`` chooses it, or None: the reference), and builds its
fast path with ``build_fast_change``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

from cdc.decoder.rows import Decline, RowParser
from cdc.decoder.state import DecodedRelation, TxState
from cdc.decoder.types import PARSE_ERRORS, ValueConversionError
from cdc.event import AnyRow, ChangeEvent, Op, change_event
from cdc.lsn import Lsn

if TYPE_CHECKING:
    from cdc.decoder._changes import FastChanges

_U32: Final = struct.Struct(">I")
_INSERT: Final = 0x49  # 'I'
_UPDATE: Final = 0x55  # 'U'
_NEW: Final = 0x4E  # 'N'
_OLD_KEY: Final = 0x4B  # 'K'
_OLD: Final = 0x4F  # 'O'

NOTHING_UNCHANGED: Final[frozenset[str]] = frozenset()

# A value the bare parsers reject declines too: the general path converts it again and names the column.
FAST_PATH_DECLINES: Final = (Decline, ValueConversionError, IndexError, struct.error, *PARSE_ERRORS)


class FastChange(Protocol):
    def __call__(self, kind: int, buf: bytes, at: int, lsn: Lsn, /) -> ChangeEvent | None:
        """The event of the Insert, Update or Delete at ``buf[at:]`` (``kind`` its type byte), or None."""
        ...


class FastChangesReference:
    """Insert, Update or Delete parsed and converted in one pass; None: let the general path do it.

    Takes the common shapes only (text columns, no unchanged TOAST, a known relation) and yields
    exactly what the general path (``ChangeDecoder.handle(pg.decode(buf))``) would, advancing ``tx`` as it
    does; anything else, malformed input included, goes the general way, which raises the precise error.
    """

    __slots__ = ("tx",)

    def __init__(self, tx: TxState) -> None:
        self.tx = tx

    def change(self, kind: int, buf: bytes, at: int, lsn: Lsn) -> ChangeEvent | None:
        tx = self.tx
        try:
            (relation_id,) = _U32.unpack_from(buf, at)
            rel = tx.relations.get(relation_id)
            if rel is None or rel.parse is None:
                return None
            parse = rel.parse
            marker = buf[at + 4]
            if kind == _INSERT:
                if marker != _NEW:
                    return None
                after, end = parse(buf, at + 5)
                before = None
                op = Op.CREATE
            elif kind == _UPDATE:
                before = None
                pos = at + 5
                if marker == _OLD_KEY or marker == _OLD:
                    old, pos = parse(buf, pos)
                    before = old if marker == _OLD else key_of(old, rel)
                    marker = buf[pos]
                    pos += 1
                if marker != _NEW:
                    return None
                after, end = parse(buf, pos)
                op = Op.UPDATE
            else:
                if marker == _OLD_KEY:
                    old, end = parse(buf, at + 5)
                    before = key_of(old, rel)
                elif marker == _OLD:
                    before, end = parse(buf, at + 5)
                else:
                    return None
                after = None
                op = Op.DELETE
            if end != len(buf):
                return None
        except FAST_PATH_DECLINES:
            return None
        ordinal = tx.ordinal = tx.ordinal + 1
        tx.last_lsn = lsn
        return change_event(
            op, rel.schema, before, after, tx.commit_lsn, lsn, tx.xid, ordinal, tx.commit_ts, False, NOTHING_UNCHANGED
        )


def key_of(old: AnyRow, rel: DecodedRelation) -> AnyRow:
    """The before row of an old-key tuple (REPLICA IDENTITY DEFAULT/INDEX): its key columns.

    A rendered one is kept whole when the replica identity is the configured key: its other columns
    were sent as NULL ('n'), so it is what the key columns alone serialize to (every other column
    null). Otherwise the tuple holds identity columns outside the key, which the typed path leaves
    out: the message declines to it."""
    if rel.rendered:
        if not rel.key_is_identity:
            raise Decline
        return old
    return {k: old[k] for k in rel.key_names}


def build_fast_change(tx: TxState, compiled: type[FastChanges] | None) -> FastChange:
    """The fast path over ``tx``: the ``compiled`` class, handed the Python side it works with, or None: the
    reference."""
    reference = FastChangesReference(tx).change  # a bound method: called faster than an instance's __call__
    if compiled is None:
        return reference
    return compiled(
        tx, reference, ChangeEvent, (Op.CREATE, Op.UPDATE, Op.DELETE), key_of, FAST_PATH_DECLINES, NOTHING_UNCHANGED
    )


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
