"""The row codec's builders: the decoder's rendered rows (``TableRenderer``, its ``RowRenderer``) and the
snapshot's (``copy_parser``, ``copy_record``), each from the codec that ``cdc.compiled`` chose: the compiled
one (``cdc.render._compiled.RowCodec``, built from Cython when the package is installed on a machine with a C
compiler) or the reference (``cdc.render.rows.render_parser`` and its COPY forms, pure Python). Both write the
same bytes (``tests/unit/test_codec.py`` holds them to it), so the choice changes speed only.
``TableRenderer`` is built from a choice of which tables may be rendered at all
(``cdc.pipeline.wiring.rendering_of`` derives it from the stages), and is handed the chosen parser maker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

from cdc.compiled import CHOSEN
from cdc.decoder.rows import Decline, RowParser
from cdc.event import TableSchema
from cdc.render.rows import CopyRecord, CopyRowParser, render_copy_parser, render_copy_record, render_parser
from cdc.sink.rendering import RenderedRow, RowRendering

if TYPE_CHECKING:
    from cdc.render._compiled import RowCodec

_ROW_CODEC: Final[type[RowCodec] | None] = CHOSEN.compiled("row_codec", "RowCodec")

IMPLEMENTATION: Final[Literal["compiled", "reference"]] = CHOSEN.implementation("row_codec")


def format_pieces(fmt: bytes) -> tuple[bytes, ...]:
    """A bytes format of ``%b`` slots only (``RowRendering.row_format``/``key_format``) split at its slots,
    ``%%`` unescaped: ``fmt % values == pieces[0] + values[0] + pieces[1] + ... + pieces[-1]``."""
    pieces: list[bytes] = []
    current = bytearray()
    i = 0
    while i < len(fmt):
        if fmt[i] == 0x25:  # '%'
            following = fmt[i + 1 : i + 2]
            if following == b"%":
                current.append(0x25)
            elif following == b"b":
                pieces.append(bytes(current))
                current.clear()
            else:
                raise ValueError(f"a row format holds a conversion other than %b or %%: {fmt!r}")
            i += 2
            continue
        current.append(fmt[i])
        i += 1
    pieces.append(bytes(current))
    return tuple(pieces)


def compiled_parser(
    rendering: RowRendering,
    converters: Sequence[Callable[[bytes], Any]],
    unescape: Callable[[bytes], bytes] | None = None,
    *,
    row_codec: type[RowCodec] | None = _ROW_CODEC,
) -> RowParser:
    """The compiled codec's parser of one relation's tuples (ImportError when ``row_codec``, by default the
    chosen one, is None); ``unescape`` is for its ``copy_row`` (``compiled_copy_parser``)."""
    return _row_codec(rendering, converters, unescape, row_codec)


def _row_codec(
    rendering: RowRendering,
    converters: Sequence[Callable[[bytes], Any]],
    unescape: Callable[[bytes], bytes] | None,
    row_codec: type[RowCodec] | None,
) -> RowCodec:
    if row_codec is None:
        raise ImportError(f"the compiled row codec does not run: {CHOSEN.missing.get('row_codec')}")
    return row_codec(
        rendering,
        tuple(converters),
        format_pieces(rendering.row_format),
        format_pieces(rendering.key_format),
        RenderedRow,
        Decline,
        unescape,
    )


def row_parser(rendering: RowRendering, converters: Sequence[Callable[[bytes], Any]]) -> RowParser:
    """The chosen codec's parser of one relation's tuples into ``RenderedRow``s."""
    if _ROW_CODEC is not None:
        return compiled_parser(rendering, converters)
    return render_parser(rendering, converters)


def compiled_copy_parser(
    rendering: RowRendering,
    converters: Sequence[Callable[[bytes], Any]],
    unescape: Callable[[bytes], bytes],
    *,
    row_codec: type[RowCodec] | None = _ROW_CODEC,
) -> CopyRowParser:
    """The compiled codec's parser of one table's ``COPY ... TO STDOUT`` text lines (ImportError as for
    ``compiled_parser``); ``unescape`` removes COPY's escapes from a field holding a backslash."""
    copy_row: CopyRowParser = _row_codec(rendering, converters, unescape, row_codec).copy_row
    return copy_row


def copy_parser(
    rendering: RowRendering, converters: Sequence[Callable[[bytes], Any]], unescape: Callable[[bytes], bytes]
) -> CopyRowParser:
    """The chosen codec's parser of one table's ``COPY ... TO STDOUT`` text lines into ``RenderedRow``s (the
    snapshot's): the same bytes as ``row_parser`` writes for the same values in a pgoutput tuple."""
    if _ROW_CODEC is not None:
        return compiled_copy_parser(rendering, converters, unescape)
    return render_copy_parser(rendering, converters, unescape)


def compiled_copy_record(
    rendering: RowRendering,
    converters: Sequence[Callable[[bytes], Any]],
    unescape: Callable[[bytes], bytes],
    *,
    row_codec: type[RowCodec] | None = _ROW_CODEC,
) -> CopyRecord:
    """The compiled codec's record of one COPY line (``RowCodec.copy_record``; ImportError as for
    ``compiled_parser``)."""
    record: CopyRecord = _row_codec(rendering, converters, unescape, row_codec).copy_record
    return record


def copy_record(
    rendering: RowRendering, converters: Sequence[Callable[[bytes], Any]], unescape: Callable[[bytes], bytes]
) -> CopyRecord:
    """The chosen codec's record of one table's ``COPY ... TO STDOUT`` lines (the snapshot's JSON path): the key
    and row of ``copy_parser``'s ``RenderedRow`` between the record's constant parts, made in one call."""
    if _ROW_CODEC is not None:
        return compiled_copy_record(rendering, converters, unescape)
    return render_copy_record(rendering, converters, unescape)


class TableRenderer:
    """The decoder's ``RowRenderer``: a rendered-row parser for each table ``rendering`` gives a
    ``RowRendering`` for, typed rows for the others. ``make_parser`` writes the parsers: by default the
    codec ``cdc.compiled`` chose (compiled or reference); the tests name one."""

    def __init__(
        self,
        rendering: Callable[[TableSchema], RowRendering | None],
        make_parser: Callable[[RowRendering, Sequence[Callable[[bytes], Any]]], RowParser] | None = None,
    ) -> None:
        self._rendering = rendering
        self._make_parser = make_parser if make_parser is not None else row_parser

    def parser(self, table: TableSchema, converters: Sequence[Callable[[bytes], Any]]) -> RowParser | None:
        rendering = self._rendering(table)
        if rendering is None:
            return None
        return self._make_parser(rendering, converters)
